"""A child process that dies in native code says where: the signal, the address, the library and
exported function (sessions.crash_point), then faulthandler's Python frames, and it still dies by
the same signal so its parent sees what happened."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the crash-point line reads Linux's siginfo and ucontext")


def _die(code: str) -> subprocess.CompletedProcess[str]:
    program = f"import ctypes\nfrom sessions import crash_point\ncrash_point.enable()\n{code}\n"
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_bad_read_in_a_library_names_the_library_and_still_ends_by_sigsegv() -> None:
    died = _die("ctypes.CDLL(None).strlen(ctypes.c_void_p(8))")
    assert died.returncode == -signal.SIGSEGV
    (line,) = [text for text in died.stderr.splitlines() if text.startswith("crash-point ")]
    assert line.startswith("crash-point SIGSEGV at 0x")
    assert " in /" in line and "libc.so.6+0x" in line
    assert "Fatal Python error: Segmentation fault" in died.stderr
    assert 'File "<string>", line 4 in <module>' in died.stderr


def test_a_sent_signal_is_reported_and_delivered() -> None:
    died = _die("import os, signal\nos.kill(os.getpid(), signal.SIGBUS)")
    assert died.returncode == -signal.SIGBUS
    assert "crash-point SIGBUS" in died.stderr
    assert "Fatal Python error: Bus error" in died.stderr
