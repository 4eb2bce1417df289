"""The capture identity gate: the checks a saved session runs on its captures before showing any data.

A session points at captures by path; between sessions files get moved, handed to a colleague,
or overwritten by a fresh run under the same name. Showing an old bookmark on new data would be
a silent lie, so each capture is checked against the identity it had when it was added
(sessions.capture.identity), and a moved one is looked for beside the session file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.capture.identity import (
    CaptureIdentity,
    identity_of_capture,
    identity_of_file,
)
from sessions.investigation.model import WHOLE_FILE
from sessions.printable import printable
from sessions.progress import Progress, ProgressGenerator, run_to_end

if TYPE_CHECKING:
    from sessions.capture.reader import Capture
    from sessions.investigation.model import CaptureRef, Investigation


class CaptureState(str, Enum):
    OK = "ok"
    MISSING = "missing"
    """Not at its saved path: moved or deleted. `CaptureStatus.candidate` may name where it went."""
    CHANGED = "changed"
    """A different capture now sits at the path; none of its data may be shown as this session's."""
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class CaptureStatus:
    capture_id: str
    role: str
    path: Path
    state: CaptureState
    message: str
    """One sentence for the user: names the file and what is wrong (or that all is well)."""
    current: CaptureIdentity | None = None
    """What is on disk now (OK and CHANGED)."""
    candidate: Path | None = None
    """For MISSING: the same capture (by content) found beside the session file."""

    @property
    def usable(self) -> bool:
        return self.state is CaptureState.OK


def _candidates(ref: CaptureRef, session_dir: Path | None) -> Iterator[Path]:
    """Where a moved capture most likely is: the session folder was moved or handed over whole."""
    if session_dir is None:
        return
    seen: set[Path] = set()
    for relative in (ref.relative_path, ref.path.name):
        if relative:
            path = session_dir / relative
            if path not in seen and _is_file(path):
                seen.add(path)
                yield path


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _status(ref: CaptureRef, path: Path, current: CaptureIdentity) -> CaptureStatus:
    if ref.identity.same_content(current):
        note = "" if ref.identity.mtime_ns == current.mtime_ns else " (modified time changed; root attributes and index identical, tensor bytes not hashed)"
        return CaptureStatus(ref.id, ref.role, path, CaptureState.OK, f"{path}: unchanged{note}", current)
    changes = "; ".join(ref.identity.differences(current))
    message = f"{path}: not the capture this session was saved with ({changes}); its data is not shown until you accept it"
    return CaptureStatus(ref.id, ref.role, path, CaptureState.CHANGED, message, current)


def check_capture(ref: CaptureRef, session_dir: Path | None = None) -> CaptureStatus:
    """Compare one capture on disk with the identity the session saved for it."""
    from sessions.capture.reader import CaptureError

    if ref.location != WHOLE_FILE:
        message = f"{ref.uri}: names a part of a file; this version opens whole captures only (location {WHOLE_FILE!r})"
        return CaptureStatus(ref.id, ref.role, ref.path, CaptureState.UNREADABLE, printable(message))
    try:
        present = ref.path.exists()
    except OSError as exc:  # a path no file system takes (too long, a NUL): a session is someone else's file
        shown = printable(str(ref.path))
        shown = shown if len(shown) <= 200 else shown[:200] + "…"
        return CaptureStatus(ref.id, ref.role, ref.path, CaptureState.UNREADABLE, f"{shown}: cannot be checked ({exc.strerror or exc})")
    if not present:
        for candidate in _candidates(ref, session_dir):
            try:
                found = identity_of_file(candidate)
            except CaptureError:
                continue
            if ref.identity.same_content(found):
                message = f"{ref.path}: missing; the same capture is at {candidate}"
                return CaptureStatus(ref.id, ref.role, ref.path, CaptureState.MISSING, message, None, candidate)
        message = f"{ref.path}: missing (moved or deleted); locate it to continue"
        return CaptureStatus(ref.id, ref.role, ref.path, CaptureState.MISSING, message)
    try:
        current = identity_of_file(ref.path)
    except CaptureError as exc:
        return CaptureStatus(ref.id, ref.role, ref.path, CaptureState.UNREADABLE, str(exc))
    return _status(ref, ref.path, current)


def check_captures_progress(
    session: Investigation, session_dir: Path | None = None
) -> ProgressGenerator[list[CaptureStatus]]:
    """Check every capture the session names (its set and its reruns), one progress step each."""
    refs = session.all_capture_refs()
    statuses: list[CaptureStatus] = []
    for done, ref in enumerate(refs):
        yield Progress(done, len(refs), f"checking {ref.path.name}")
        statuses.append(check_capture(ref, session_dir))
    yield Progress(len(refs), len(refs), "captures checked")
    return statuses


def check_captures(session: Investigation, session_dir: Path | None = None) -> list[CaptureStatus]:
    return run_to_end(check_captures_progress(session, session_dir))


def locate_capture(session: Investigation, capture_id: str, new_path: str | Path) -> CaptureStatus:
    """Point a moved capture at `new_path`, but only if it is the same capture by content.

    A different file is reported as CHANGED and the session keeps its old path: relinking
    to other data is a decision the user makes explicitly with `accept_changed_capture`.
    """
    from sessions.capture.reader import CaptureError

    ref = session.capture(capture_id)
    path = Path(new_path).absolute()
    try:
        current = identity_of_file(path)
    except CaptureError as exc:
        return CaptureStatus(ref.id, ref.role, path, CaptureState.UNREADABLE, str(exc))
    status = _status(ref, path, current)
    if status.usable:
        session.relink_capture(capture_id, path, current)
    return status


def accept_changed_capture(session: Investigation, capture_id: str, path: str | Path | None = None) -> CaptureStatus:
    """The user vouches for the capture now at `path` (default: its saved path); its identity is re-recorded.

    Raises `CaptureError` when the file is not a readable capture.
    """
    ref = session.capture(capture_id)
    target = ref.path if path is None else Path(path).absolute()
    current = identity_of_file(target)
    session.relink_capture(capture_id, target, current)
    return CaptureStatus(ref.id, ref.role, target, CaptureState.OK, f"{target}: accepted as the new {ref.role} capture", current)


class CaptureIdentityError(Exception):
    """A session capture whose content is not what the session was saved with."""

    def __init__(self, status: CaptureStatus) -> None:
        self.status = status
        super().__init__(status.message)


def iter_open_session_capture(ref: CaptureRef) -> ProgressGenerator[Capture]:
    """Open a capture the session names, refusing it unless its identity still matches.

    This is the gate in front of every read of session data: the identity is computed on
    the very handle that is returned, so the file cannot be swapped between check and read.
    Yields the first open's structure-check progress (closing it stops the check). Raises
    `CaptureError` (unreadable) or `CaptureIdentityError` (missing or changed).
    """
    from sessions.capture.opening import iter_open_capture

    if not ref.path.exists():
        raise CaptureIdentityError(
            CaptureStatus(ref.id, ref.role, ref.path, CaptureState.MISSING, f"{ref.path}: missing (moved or deleted)")
        )
    capture = yield from iter_open_capture(ref.path)
    try:
        status = _status(ref, ref.path, identity_of_capture(capture))
    except BaseException:
        capture.close()
        raise
    if not status.usable:
        capture.close()
        raise CaptureIdentityError(status)
    return capture


def open_session_capture(ref: CaptureRef) -> Capture:
    """`iter_open_session_capture` without progress."""
    return run_to_end(iter_open_session_capture(ref))
