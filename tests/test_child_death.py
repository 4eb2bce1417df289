"""A child doing risky work for a parent dies with it: a parent killed with -9 cannot stop it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessions.child_env import PROJECT_ROOT, child_env

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {child!r}])
print(child.pid, flush=True)
child.wait()
"""
CHILD = "from sessions.child_process import die_with_parent; import time; die_with_parent(); print('ready', flush=True); time.sleep(60)"


def _running(pid: int) -> bool:
    """Whether `pid` is a process still running (a killed child nobody reaps stays a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_asked_to_die_with_its_parent_is_killed_when_the_parent_is_killed() -> None:
    """The llama.cpp recording child went on for seconds after `kill -9` of `record`, and a
    comparison's workers would finish their shards unseen."""
    with subprocess.Popen([sys.executable, "-c", PARENT.format(child=CHILD)], cwd=PROJECT_ROOT, env=child_env(), stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline() == "ready\n"
        parent.kill()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)
