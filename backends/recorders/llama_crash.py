"""Turn the death of a llama.cpp child process into a message a person can act on.

The child (`backends.recorders.llama_process`) dies by a signal; what it left on stderr says where:
- `crash-point SIGILL at 0x… in /…/libggml-cpu.so+0x… (symbol+0x…)` from `sessions.crash_point`
  for illegal instructions, bad memory accesses and arithmetic traps;
- ggml's own `file.cpp:57: GGML_ASSERT(cond) failed` line when it aborts, then its backtrace
  (gdb's `#3 0x… in function (...) from lib`, or glibc's `lib(function+0x…) [0x…]` without gdb);
- faulthandler's Python frames, the first of which is the recorder's call into llama.cpp.
The message names the signal, the native function when one is known, what ggml said, and what
to do about it: for an illegal instruction, the build's CPU features this machine does not grant
(`backends.recorders.llama_cpu`) and the portable rebuild or `--no-extra-bufts`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import signal
import sys
from pathlib import Path

from backends.recorders.llama_cpu import (
    REBUILD_COMMAND,
    cpu_flags,
    os_grants_amx,
    parse_system_info,
    ungranted,
)
from sessions.child_process import signal_name

MEANINGS = {
    signal.SIGILL: "an instruction this CPU or OS does not allow",
    signal.SIGSEGV: "an invalid memory access",
    signal.SIGBUS: "a bad memory access, often a memory-mapped file that shrank or could not be read",
    signal.SIGFPE: "an arithmetic trap",
    signal.SIGABRT: "llama.cpp stopped itself on a failed check",
    signal.SIGKILL: "killed from outside, most often by the kernel's out-of-memory killer",
}
NO_EXTRA_BUFTS = (
    "or record with --no-extra-bufts, which keeps the weights out of llama.cpp's repacked "
    "\"extra\" buffer types, where its AMX and other repacked matmul kernels run"
)
ADVICE = {
    signal.SIGILL: f"Rebuild llama-cpp-python without native tuning, AVX-512 or AMX (what `make test` builds): "
    f"{REBUILD_COMMAND}; {NO_EXTRA_BUFTS}.",
    signal.SIGSEGV: "A GGUF that is truncated, corrupt or written for a newer llama.cpp can do this: compare its "
    "size and SHA-256 with its source and re-export or re-download it; if it is sound, report the lines above to llama.cpp.",
    signal.SIGABRT: "A failed GGML_ASSERT usually means the GGUF's metadata contradicts its tensors (re-export it), "
    "or a setting llama.cpp does not support for this model (try the defaults: --kv-type f32, no --flash-attn).",
    signal.SIGKILL: "Give the recording more memory: close other programs, or use a smaller model, a shorter "
    "prompt or fewer decode steps.",
}
ADVICE[signal.SIGBUS] = ADVICE[signal.SIGSEGV]
ADVICE[signal.SIGFPE] = ADVICE[signal.SIGABRT]

_CRASH_POINT = re.compile(r"^crash-point (?P<signal>SIG\w+)(?: at 0x[0-9a-f]+ in (?P<where>.*))?$", re.MULTILINE)
_WHERE = re.compile(r"^(?P<lib>\S+?)\+0x[0-9a-f]+(?: \((?P<symbol>\S+)\+0x[0-9a-f]+\))?$")
_GGML_SAID = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|h|m|mm|cu)):(?P<line>\d+): (?P<message>.+)$", re.MULTILINE)
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(?P<function>.+?) \(.*\) (?:from|at) (?P<lib>\S+)$", re.MULTILINE)
_GLIBC_FRAME = re.compile(r"^(?P<lib>\S+?)\((?P<function>[^+()]+)\+0x[0-9a-f]+\)\s*\[0x[0-9a-f]+\]$", re.MULTILINE)
_PYTHON_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)$', re.MULTILINE)
_NOT_THE_CRASH = ("ggml_print_backtrace", "ggml_abort", "ggml_uncaught_exception")


@functools.cache
def _demangler() -> object | None:
    name = "c++abi" if sys.platform == "darwin" else "stdc++"
    found = ctypes.util.find_library(name)
    if found is None:
        return None
    function = ctypes.CDLL(found).__cxa_demangle
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return function


def demangle(symbol: str) -> str:
    """`_Z24ggml_backend_amx_mul_matPK19ggml_compute_paramsP11ggml_tensor` -> its C++ spelling; C names unchanged."""
    function = _demangler()
    if function is None or not symbol.startswith("_Z"):
        return symbol
    status = ctypes.c_int(0)
    pointer = function(symbol.encode(), None, None, ctypes.byref(status))  # type: ignore[operator]
    if status.value != 0 or not pointer:
        return symbol
    text = ctypes.string_at(pointer).decode("utf-8", "replace")
    ctypes.CDLL(None).free(ctypes.c_void_p(pointer))
    return text


def native_function(stderr: str) -> str | None:
    """The native function the crash happened in, as `function in library`, when stderr names one."""
    point = _CRASH_POINT.search(stderr)
    if point is not None and point.group("where"):
        where = _WHERE.match(point.group("where"))
        if where is not None and where.group("symbol"):
            return f"{demangle(where.group('symbol'))} in {Path(where.group('lib')).name}"
    frames = [(m.start(), m.group("function"), m.group("lib")) for m in _GDB_FRAME.finditer(stderr)]
    frames += [(m.start(), m.group("function"), m.group("lib")) for m in _GLIBC_FRAME.finditer(stderr)]
    for _, function, library in sorted(frames):
        name = Path(library).name
        if function.startswith(_NOT_THE_CRASH) or not re.search(r"ggml|llama", name):
            continue
        return f"{demangle(function)} in {name}"
    if point is not None and point.group("where"):
        return point.group("where")
    return None


def ggml_said(stderr: str) -> str | None:
    """ggml's abort line (`qwen3.cpp:57: GGML_ASSERT(n_embd_head == n_rot) failed`), file shortened to its name."""
    found = _GGML_SAID.search(stderr)
    return f"{Path(found.group('file')).name}:{found.group('line')}: {found.group('message')}" if found else None


def python_frame(stderr: str) -> str | None:
    """faulthandler's most recent Python frame: where the recorder had called into llama.cpp."""
    found = _PYTHON_FRAME.search(stderr)
    return f"{Path(found.group('file')).name} line {found.group('line')} in {found.group('function')}" if found else None


def explain_crash(signum: int, stderr: str, *, stage: str, system_info: str | None, left: str | None) -> str:
    """The whole message: what died and how, where, what ggml said, why it may be, what to do, and
    `left`: what the run left at its output (`left_behind.left_at`), for a recording."""
    meaning = f" ({MEANINGS[signum]})" if signum in MEANINGS else ""
    lines = [f"llama.cpp crashed while {stage}: the process died by {signal_name(signum)}{meaning}."]
    where = native_function(stderr)
    frame = python_frame(stderr)
    if where or frame:
        lines.append("Where: " + " ".join(filter(None, [where, f"(Python: {frame})" if frame else None])) + ".")
    said = ggml_said(stderr)
    if said:
        lines.append(f"ggml said: {said}")
    if signum == signal.SIGILL and system_info:
        missing = ungranted(parse_system_info(system_info), cpu_flags(), os_grants_amx())
        if missing:
            lines.append(f"This llama-cpp-python build uses {'; '.join(missing)}.")
    lines.append(ADVICE.get(signum, "Report the lines above to llama.cpp with the GGUF and the command."))
    if left is not None:
        lines.append(f"Its output: {left}.")  # not capitalised: it may start with a relative path
    return "\n".join(lines)
