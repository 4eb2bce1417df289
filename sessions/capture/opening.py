"""Opening an untrusted capture: the structure check in a child process first, then the reader.

Kept apart from the reader because the check's child side is itself built on the reader: the
reader knows nothing of checks, and this module puts the two in order.
"""

from __future__ import annotations

from pathlib import Path

from sessions.capture.hdf5_safety import CHECK_TIMEOUT_S, DEFAULT_MEMORY_BUDGET
from sessions.capture.reader import Capture, CaptureError, load_capture
from sessions.capture.structure_check import iter_ensure_checked
from sessions.progress import ProgressGenerator, run_to_end
from sessions.side_file import regular_file_problem


def iter_open_capture(
    path: str | Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    check_in_child: bool = True,
    check_timeout_s: float = CHECK_TIMEOUT_S,
) -> ProgressGenerator[Capture]:
    """Open a capture read-only, without the HDF5 file lock, after its structure passed a check.

    The check runs once per file version (path, inode, size, mtime; remembered on disk across
    processes) in a child process with a time and memory limit, yielding the index rows it has
    checked; a file that passed before yields nothing. It lists the index rows' own problems
    too, so only a file opened without it has them looked for here. Closing the generator kills
    the check. `check_in_child=False` skips it: only for files this process just wrote itself
    with `CaptureWriter`, never for a file that came from elsewhere.
    """
    path = Path(path)
    problem = regular_file_problem(path)
    if problem is not None:
        raise CaptureError(path, "file", problem)
    if check_in_child:
        failure = yield from iter_ensure_checked(path, memory_budget=memory_budget, timeout_s=check_timeout_s)
        if failure is not None:
            raise CaptureError(path, failure.location, failure.problem)
    capture = load_capture(path, memory_budget=memory_budget)
    if check_in_child:
        capture.rows_passed_check()
    elif capture.row_problems:
        capture.close()
        first = capture.row_problems[0]
        raise CaptureError(path, first.location, first.problem)
    return capture


def open_complete_capture(path: str | Path) -> Capture:
    """`open_capture` for a verdict: a capture whose writer did not finish is refused, as
    `report` refuses it. A gate passed one, and diagnose and rerun judged one, without a word."""
    capture = open_capture(path)
    if not capture.complete:
        reason = capture.describe()
        capture.close()
        raise CaptureError(path, "/ attribute 'complete'", reason)
    return capture


def unfinished(native: Capture | None, oracle: Capture | None) -> str | None:
    """Which side of a pair its writer did not finish, in words, or None. The window shows what
    such a capture holds, but its verdict strip and HTML report say UNUSABLE, as `report` does
    (its strip said PARITY of two runs abandoned after their first step)."""
    for role, capture in (("native", native), ("oracle", oracle)):
        if capture is not None and not capture.complete:
            return f"{role} {capture.path.name} is incomplete (its writer did not finish)"
    return None


def open_capture(
    path: str | Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    check_in_child: bool = True,
    check_timeout_s: float = CHECK_TIMEOUT_S,
) -> Capture:
    """`iter_open_capture` without progress: a plain call for headless callers and small files."""
    return run_to_end(
        iter_open_capture(
            path, memory_budget=memory_budget, check_in_child=check_in_child, check_timeout_s=check_timeout_s
        )
    )
