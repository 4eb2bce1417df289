"""A checking child started before the file it will check, so a first open does not wait for a
new interpreter to import numpy and h5py.

Every structure check runs in a fresh process (libhdf5 is not safe on crafted files), and such
a process spends about 0.25 s importing before it reads a byte: a third of the first open of a
240,000-record capture. The viewer and the commands that open captures call `prepare()` first
thing: from then on one child stands ready, imported and waiting for its command line on
stdin. A check takes it (`take`) and the next one is started at once. Each child checks once:
a process that has opened an untrusted file is never given another. One that is never taken
is killed when its parent exits, or ends by itself when its stdin closes.

Imports nothing heavy, so a command can call `prepare()` before importing what it runs.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import threading

from sessions.child_env import child_env, module_command

CHECKER_MODULE = "sessions.capture.structure_check"
SPARE_FLAG = "--spare"
"""The checker's argument for a child that waits for its real arguments on stdin (a JSON list)."""

_lock = threading.Lock()
_ready: subprocess.Popen[bytes] | None = None
_wanted = False


def prepare() -> None:
    """Keep a checking child ready from now on, for this process's checks."""
    global _wanted
    with _lock:
        _wanted = True
        _start()


def ready_pid() -> int | None:
    """The process id of the child standing ready, if any."""
    with _lock:
        return _ready.pid if _ready is not None else None


def take(arguments: list[str]) -> subprocess.Popen[bytes] | None:
    """The ready child, now running the checker with `arguments`; None when no child is ready
    (the caller starts its own). A new child is made ready in its place.

    A child may still die before it begins (killed while it waited): the checker prints
    `begin` before each file, and a caller that sees a taken child end without it starts a
    fresh one instead of blaming the file (`structure_check._Children`)."""
    global _ready
    with _lock:
        child, _ready = _ready, None
        if child is not None and child.poll() is None:
            try:
                assert child.stdin is not None
                child.stdin.write(json.dumps(arguments).encode("utf-8") + b"\n")
                child.stdin.close()
            except OSError:
                _end(child)
                child = None
        elif child is not None:
            _end(child)
            child = None
        if _wanted:
            _start()
    return child


def stop() -> None:
    """No child stands ready any more; one that did is killed (it has opened no file)."""
    global _wanted, _ready
    with _lock:
        _wanted = False
        child, _ready = _ready, None
    if child is not None:
        _end(child)


def _start() -> None:
    """Start the ready child; best effort: when no process can be started now, checks start their own."""
    global _ready
    if _ready is None:
        try:
            _ready = subprocess.Popen(
                module_command(CHECKER_MODULE, SPARE_FLAG),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(),
            )
        except OSError:
            _ready = None


def _end(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def _forget_in_forked_child() -> None:
    """A forked process has no ready child of its own (the one it would see is its parent's)."""
    global _lock, _ready, _wanted
    _lock, _ready, _wanted = threading.Lock(), None, False


atexit.register(stop)
os.register_at_fork(after_in_child=_forget_in_forked_child)
