"""Opening and saving session files without ever losing the user's work.

Failures are part of the contract, not exceptions to it: a corrupt file is kept aside and
the newest good backup is loaded (with a notice saying so); a save that fails (disk full,
read-only folder) raises `SessionSaveError` with a sentence for the user and leaves both
the file on disk and the session in memory exactly as they were; a file written by a newer
Parity X-ray opens read-only and is never written over.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
from dataclasses import dataclass, field
from pathlib import Path

from sessions.atomic_write import atomic_write_bytes, backup_paths
from sessions.compare.align_modes import AUTO
from sessions.investigation.model import Investigation, SavedTolerance
from sessions.investigation.schema import (
    SCHEMA_VERSION,
    DecodedSession,
    SessionFormatError,
    dumps,
    loads,
    schema_version_of,
)
from sessions.side_file import DiskStamp, disk_stamp, read_side_file, same_file

DEFAULT_BACKUPS = 3
MAX_SESSION_BYTES = 64 * 1024**2
"""A session holds paths, keys, notes and bookmarks, not tensors: a long investigation is a few
MB. 64 MiB is far beyond that, and refuses a device or a huge file before it is read whole."""


class SessionOpenError(Exception):
    """A session that cannot be opened at all; the message is for the user."""


class SessionSaveError(Exception):
    """A save that did not happen; the file on disk and the session in memory are unchanged."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"Could not save the session to {path}: {problem}. Nothing was lost: the session is still open.")


class SessionReadOnlyError(SessionSaveError):
    """Saving would overwrite a file from a newer Parity X-ray (and drop what it stored)."""


class SessionChangedError(SessionSaveError):
    """The file changed on disk since this document read or wrote it: another window or program
    saved there, and saving would silently replace that work (two windows on one session each
    saved, and the first one's bookmarks were gone)."""


_OS_ERROR_WORDS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the folder is on a read-only file system",
    errno.EACCES: "there is no permission to write in that folder",
    errno.EPERM: "there is no permission to write in that folder",
    errno.ENOENT: "the folder does not exist",
    errno.EFBIG: "the file would exceed the largest file size this system allows",
    errno.ENAMETOOLONG: "the file name is too long",
}


def describe_os_error(exc: OSError) -> str:
    """What went wrong, in the user's words rather than errno's."""
    words = _OS_ERROR_WORDS.get(exc.errno or 0)
    detail = exc.strerror or str(exc)
    return f"{words} ({detail})" if words else detail


def _schema_on_disk(path: Path) -> int | None:
    """The schema of the session already at `path`, or None when there is none (or it is unreadable)."""
    try:
        return schema_version_of(json.loads(read_side_file(path, MAX_SESSION_BYTES).decode("utf-8")), str(path))
    except (OSError, ValueError, RecursionError, SessionFormatError):
        return None


def save_session(session: Investigation, path: str | Path, *, backups: int = DEFAULT_BACKUPS) -> None:
    """Write `session` to `path` atomically, rotating `backups` previous versions.

    Raises `SessionReadOnlyError` if `path` holds a newer-schema session, `SessionSaveError`
    on any I/O failure.
    """
    path = Path(path).absolute()
    on_disk = _schema_on_disk(path)
    if on_disk is not None and on_disk > SCHEMA_VERSION:
        raise SessionReadOnlyError(
            path,
            f"it was saved by a newer Parity X-ray (session schema {on_disk}; this version writes "
            f"{SCHEMA_VERSION}) and overwriting it would lose what that version stored; use Save As",
        )
    replaced = next((ref for ref in session.all_capture_refs() if same_file(path, ref.path)), None)
    if replaced is not None:
        raise SessionSaveError(path, f"it is the session's {replaced.role} capture, which a session file never replaces; choose another name")
    data = dumps(session, path.parent)
    try:
        atomic_write_bytes(path, data, backups=backups)
    except OSError as exc:
        raise SessionSaveError(path, describe_os_error(exc)) from exc
    session.rebase(path.parent)


def _aside_path(path: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 2
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    return candidate


def _set_aside(path: Path) -> str:
    """Rename a damaged session out of the way, and say where it went, or why it stayed (a
    folder that refuses the rename, a name too long for the suffix): the backup loads either way."""
    try:
        aside = _aside_path(path)
        path.rename(aside)
    except OSError as exc:
        return f"; the damaged file stays as it is ({describe_os_error(exc)}), and the next save keeps it as a backup"
    return f"; the damaged file was kept as {aside.name}"


def _read(path: Path) -> DecodedSession:
    """Raises SessionFormatError for damage, OSError when the file cannot be read at all."""
    return loads(read_side_file(path, MAX_SESSION_BYTES), str(path))


def _backups_named(path: Path, backups: int) -> str:
    """"; backups beside it: NAME.1, NAME.2" (each can be named instead), or "" when there are none."""
    present = [b.name for b in backup_paths(path, backups) if b.is_file()]
    return f"; backups beside it: {', '.join(present)}" if present else ""


def work_in(session: Investigation, path: Path | None) -> list[str]:
    """What of a session a user would miss, in words ("2 bookmark(s)", "manual pairings", ...):
    notes and bookmarks, decisions (pairings and breaks with their reasons, tolerances, a policy,
    the pairing mode, reruns), or, of a saved session, its edits."""
    said = [f"{len(session.bookmarks)} bookmark(s)"] if session.bookmarks else []
    said += ["a title or summary"] if session.title or session.summary else []
    said += ["manual pairings"] if session.overrides else []
    said += ["reruns"] if session.reruns else []
    tolerances = session.op_tolerances or session.tolerance_policy is not None or session.tolerance != SavedTolerance()
    said += ["tolerances"] if tolerances else []
    said += ["the pairing mode"] if session.alignment_mode != AUTO else []
    said += [f"edits to {path.name}"] if path is not None and not said else []
    return said


@dataclass
class SessionDocument:
    """An open session: what File > Save, Save As and the title bar's dirty mark work on."""

    session: Investigation = field(default_factory=Investigation)
    path: Path | None = None
    read_only_reason: str | None = None
    """Why Save is refused (the file is from a newer version); Save As to another file works."""
    newer: str | None = None
    """That a newer version wrote the file, and what of it this version did not read (`DecodedSession.newer_text`)."""
    notices: list[str] = field(default_factory=list)
    """Things the user must be told once after opening (backup loaded, upgraded, read-only)."""
    backups: int = DEFAULT_BACKUPS
    saved_revision: int = 0
    on_disk: DiskStamp | None = None
    """The file as this document last read or wrote it (`SessionChangedError`)."""

    @property
    def read_only(self) -> bool:
        return self.read_only_reason is not None

    @property
    def dirty(self) -> bool:
        return self.session.revision != self.saved_revision

    def unsaved_work(self) -> list[str]:
        """`work_in` this session, none when it is saved as it is. The close question and crash
        recovery ask by it: a window only opened on a pair and killed was offered back as
        "unsaved work (0 bookmark(s))"."""
        return work_in(self.session, self.path) if self.dirty else []

    @classmethod
    def open(cls, path: str | Path, *, backups: int = DEFAULT_BACKUPS, recover: bool = True) -> SessionDocument:
        """Open a session file, falling back to its newest good backup if it is damaged or gone.

        `recover=False` (a headless report) never falls back: a report must be on the file it was
        named, and must not rename a user's file aside; SessionOpenError says which backups exist.
        Raises `SessionOpenError` when neither the file nor any backup can be read.
        """
        path = Path(path).absolute()
        try:
            decoded = _read(path)
        except FileNotFoundError:
            if not recover:
                raise SessionOpenError(f"{path} does not exist{_backups_named(path, backups)}") from None
            return cls._from_backup(path, backups, f"{path} does not exist")
        except OSError as exc:
            raise SessionOpenError(f"{path} cannot be read: {exc.strerror or exc}") from None
        except SessionFormatError as exc:
            on_disk = _schema_on_disk(path)
            if on_disk is not None and on_disk > SCHEMA_VERSION:
                raise SessionOpenError(
                    f"{path} was saved by a newer Parity X-ray (session schema {on_disk}) in a form this "
                    f"version cannot read ({exc.location}: {exc.problem}). The file was not changed."
                ) from None
            if not recover:
                raise SessionOpenError(f"{exc}{_backups_named(path, backups)}") from None
            return cls._from_backup(path, backups, str(exc))
        document = cls(decoded.session, path, decoded.read_only_reason, decoded.newer_text, backups=backups, on_disk=disk_stamp(path))
        document.saved_revision = decoded.session.revision
        if decoded.read_only_reason:
            document.notices.append(f"{path.name} was {decoded.read_only_reason}")
        elif decoded.schema_version < SCHEMA_VERSION:
            document.notices.append(
                f"{path.name} is from an older Parity X-ray (session schema {decoded.schema_version}); "
                f"saving writes schema {SCHEMA_VERSION} and keeps the old file as {path.name}.1."
            )
        return document

    @classmethod
    def _from_backup(cls, path: Path, backups: int, problem: str) -> SessionDocument:
        """Load the newest readable backup; keep a damaged file aside (never delete it)."""
        tried = [problem]
        for backup in backup_paths(path, backups):
            try:
                decoded = _read(backup)
            except FileNotFoundError:
                continue
            except (OSError, SessionFormatError) as exc:
                tried.append(str(exc))
                continue
            notice = f"{path.name} could not be read ({problem}). Loaded the backup {backup.name}"
            if path.exists():
                notice += _set_aside(path)
            saved = _saved_time(backup)
            document = cls(decoded.session, path, decoded.read_only_reason, decoded.newer_text, backups=backups, on_disk=disk_stamp(path))
            document.notices.append(f"{notice}. The backup was saved {saved}; later changes are not in it.")
            document.saved_revision = -1
            return document
        raise SessionOpenError(f"{path} cannot be opened and no backup can be read: " + "; ".join(tried))

    def save(self, replace_changed: bool = False) -> None:
        """Save to the document's file. Raises SessionChangedError when the file changed on disk
        since this document read or wrote it, unless `replace_changed` (the user chose to)."""
        if self.path is None:
            raise ValueError("this session has no file yet; use save_as")
        if self.read_only_reason is not None:
            raise SessionReadOnlyError(self.path, f"it was {self.read_only_reason}")
        now = disk_stamp(self.path)
        if not replace_changed and now is not None and now != self.on_disk:
            raise SessionChangedError(
                self.path,
                "it changed on disk since this window opened or saved it (another window or program saved it there), "
                "and saving would replace that work; save anyway, or Save As another file and compare the two",
            )
        self._write(self.path)

    def save_as(self, path: str | Path) -> None:
        """Save to `path` and keep working there; a read-only document becomes an ordinary one."""
        path = Path(path).absolute()
        if self.read_only_reason is not None and path == self.path:
            raise SessionReadOnlyError(path, f"it was {self.read_only_reason}")
        self._write(path)
        self.path = path
        self.read_only_reason = None

    def _write(self, path: Path) -> None:
        revision = self.session.revision
        save_session(self.session, path, backups=self.backups)
        self.saved_revision = revision
        self.on_disk = disk_stamp(path)


def _saved_time(path: Path) -> str:
    """A file's modification time for a notice, in local time as the user's clock shows it."""
    moment = _dt.datetime.fromtimestamp(path.stat().st_mtime)
    return moment.strftime("%Y-%m-%d %H:%M:%S")
