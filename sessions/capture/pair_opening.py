"""Opening the files of a pair as the window does: each checked in turn, and which one is the native.

Qt-free, like all long work: the window runs `iter_open_captures` on its open lane and only
receives the finished captures.
"""

from __future__ import annotations

from pathlib import Path

from sessions.capture.opening import iter_open_capture
from sessions.capture.reader import Capture
from sessions.progress import Progress, ProgressGenerator


def iter_open_captures(paths: list[Path]) -> ProgressGenerator[list[Capture]]:
    """Open captures one by one; each first passes the structural check in a child process, whose
    progress this yields and which closing this generator (Esc, Cancel) stops."""
    opened: list[Capture] = []
    try:
        for i, path in enumerate(paths):
            yield Progress(i, len(paths), f"checking {path.name}")
            opened.append((yield from iter_open_capture(path)))
        yield Progress(len(paths), len(paths), "opened")
    except BaseException:
        for capture in opened:
            capture.close()
        raise
    return opened


def assign_roles(captures: list[Capture], current: tuple[Capture | None, Capture | None]) -> tuple[Capture | None, Capture | None, bool]:
    """(native, oracle, guessed) from each file's role hint; guessed when the hints did not decide."""
    native, oracle = current
    if len(captures) == 1:
        only = captures[0]
        if only.meta.role == "native":
            return only, oracle, False
        if only.meta.role == "oracle":
            return native, only, False
        return (only, oracle, True) if native is None else (native, only, True)
    first, second = captures[:2]
    roles = (first.meta.role, second.meta.role)
    if roles == ("oracle", "native"):
        return second, first, False
    return first, second, roles != ("native", "oracle")
