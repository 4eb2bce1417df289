"""Autosave to a recovery file, and the offer to restore it after a crash.

The recovery file lives in the user data folder, never beside (or over) the user's own
session file: autosave must not change what the user chose to save. Each file names the
process that writes it, by pid and by the process's start time, because pids are reused: a
file whose pid now belongs to some other process is still an orphan. A file is offered only
when its writer is gone, and exactly once: claiming it is an atomic rename, so two windows
starting together cannot both offer it, and a declined offer is not repeated.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from sessions.atomic_write import atomic_write_bytes
from sessions.investigation.model import ChangeKind, Investigation
from sessions.investigation.schema import (
    SessionFormatError,
    decode_document,
    encode_session,
)
from sessions.investigation.store import MAX_SESSION_BYTES, SessionDocument
from sessions.side_file import DiskStamp, read_side_file

RECOVERY_FORMAT = "parity-xray-recovery"
RECOVERY_VERSION = 1
DEFAULT_INTERVAL_S = 30.0
TIMED_KINDS = frozenset({ChangeKind.SELECTION, ChangeKind.VIEW})
"""Edits saved on the timer: a selection or a view changes many times a minute, and is quick to
redo. Every other edit (a bookmark, a note, a tolerance, a pairing and its reason, a profile, a
rerun, the captures) is a decision the user made once and would have to remember: it is saved
at once. Only bookmarks and notes were, and a tolerance or a pairing break set between ticks
was lost in a crash."""

_AUTOSAVE_GLOB = "autosave-*.json"
_OFFERED_SUFFIX = ".offered"
_UNREADABLE_SUFFIX = ".unreadable"


def default_recovery_dir() -> Path:
    return Path(platformdirs.user_data_dir("parity-xray", appauthor=False)) / "recovery"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_token(pid: int) -> str | None:
    """Something that differs between two processes that had the same pid; None if no such process lives.

    Linux: boot id + start time in clock ticks (/proc), and a zombie counts as gone. Elsewhere:
    the start time `ps` reports.
    """
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return f"{_boot_id()}:{fields[19]}"
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    started = out.stdout.strip()
    return started if out.returncode == 0 and started else None


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start: str
    host: str

    @classmethod
    def current(cls) -> ProcessIdentity:
        pid = os.getpid()
        return cls(pid, process_start_token(pid) or "", socket.gethostname())

    def is_gone(self) -> bool:
        """True only when this process has certainly ended; a writer on another host is never judged."""
        if self.host != socket.gethostname():
            return False
        token = process_start_token(self.pid)
        return token is None or token != self.start


def _recovery_bytes(document: SessionDocument, writer: ProcessIdentity) -> bytes:
    base = document.path.parent if document.path else None
    payload = {
        "format": RECOVERY_FORMAT,
        "recovery_version": RECOVERY_VERSION,
        "writer": {"pid": writer.pid, "start": writer.start, "host": writer.host},
        "session_path": None if document.path is None else str(document.path),
        "session_on_disk": None if document.on_disk is None else list(document.on_disk),
        "saved_unix": time.time(),
        "document": encode_session(document.session, base),
    }
    return (json.dumps(payload, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


class Autosaver:
    """Keeps a recovery copy of one open session while it has unsaved changes.

    Qt-free: the viewer calls `tick()` from a timer (every second is fine; writes happen at
    most every `interval_s`), and edits other than the selection and the view are written at
    once through the session's change notifications (`TIMED_KINDS`). Autosave failures never raise into the UI; they are kept
    in `last_error` for a status line.
    """

    def __init__(
        self,
        document: SessionDocument,
        directory: Path | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.document = document
        self.directory = Path(directory) if directory is not None else default_recovery_dir()
        self.interval_s = interval_s
        self._clock = clock
        self._writer = ProcessIdentity.current()
        self.path = self.directory / f"autosave-{self._writer.pid}-{uuid.uuid4().hex[:12]}.json"
        self.last_error: str | None = None
        self._written_revision: int | None = None
        self._last_write = -float("inf")
        self._unsubscribe = document.session.subscribe(self._on_change)

    def _on_change(self, kind: ChangeKind) -> None:
        if kind not in TIMED_KINDS:
            self.flush()

    def _discard_file(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:  # a window closing must close: the file may be offered once more at the next start
            self.last_error = f"autosave file {self.path} could not be removed: {exc.strerror or exc}"
        self._written_revision = None

    def flush(self) -> bool:
        """Write the recovery file now if the session has changes it does not hold; True if written."""
        if not self.document.unsaved_work():  # nothing a user would miss: nothing to offer back after a crash
            self._discard_file()
            return False
        if self._written_revision == self.document.session.revision:
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path, _recovery_bytes(self.document, self._writer))
        except OSError as exc:
            self.last_error = f"autosave to {self.path} failed: {exc.strerror or exc}"
            return False
        self.last_error = None
        self._written_revision = self.document.session.revision
        self._last_write = self._clock()
        return True

    def tick(self) -> bool:
        """Timer entry point: write if there are changes and `interval_s` has passed since the last write."""
        if self.document.dirty and self._clock() - self._last_write < self.interval_s:
            return False
        return self.flush()

    def close(self) -> None:
        """The session was closed normally (saved or deliberately discarded): nothing to recover."""
        self._unsubscribe()
        self._discard_file()


@dataclass
class RecoveryOffer:
    """A session left by a process that is gone. Offered once; call `restore` or `discard`."""

    file: Path
    session: Investigation
    session_path: Path | None
    writer_pid: int
    saved_unix: float
    session_on_disk: DiskStamp | None = None
    """The session file as the crashed window last read or wrote it: a save after the restore
    replaces it unless another program changed it since (without it, every save was refused
    as "changed on disk")."""

    def restore(self) -> SessionDocument:
        """The recovered session as an unsaved document at its original path (Save writes it there).

        Keep the offer until the new document's autosaver has written its own recovery file,
        then `discard` it, so the work is on disk at every moment.
        """
        return SessionDocument(self.session, self.session_path, saved_revision=-1, on_disk=self.session_on_disk)

    def discard(self) -> None:
        """Remove the claimed file; one a folder refuses to remove stays, claimed, and is never offered again."""
        with contextlib.suppress(OSError):
            self.file.unlink(missing_ok=True)

    def release(self) -> None:
        """Unclaim an offer the user neither restored nor discarded (the window closed with it
        shown): the next start offers it again. A claimed file no scan looks at was work lost."""
        with contextlib.suppress(OSError):
            os.rename(self.file, self.file.with_name(self.file.name.removesuffix(_OFFERED_SUFFIX)))


@dataclass(frozen=True)
class RecoveryScan:
    offers: list[RecoveryOffer]
    notices: list[str]
    """Recovery files that could not be read (kept, renamed *.unreadable, never offered again)."""


def _read_recovery(path: Path) -> dict[str, Any]:
    """A recovery file's payload; the folder is shared, so a FIFO or a huge file named like one is refused, not read."""
    payload = json.loads(read_side_file(path, MAX_SESSION_BYTES).decode("utf-8"))
    if not isinstance(payload, dict) or payload.get("format") != RECOVERY_FORMAT:
        raise ValueError("not a Parity X-ray recovery file")
    return payload


def _writer_of(payload: dict[str, Any]) -> ProcessIdentity:
    writer = payload["writer"]
    return ProcessIdentity(int(writer["pid"]), str(writer["start"]), str(writer["host"]))


def claim_recovery_offers(directory: Path | None = None) -> RecoveryScan:
    """Recovery files whose writer is gone, each claimed so that no one offers it again."""
    directory = Path(directory) if directory is not None else default_recovery_dir()
    offers: list[RecoveryOffer] = []
    notices: list[str] = []
    for path in sorted(directory.glob(_AUTOSAVE_GLOB)):
        try:
            writer = _writer_of(_read_recovery(path))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notices.append(_set_aside(path, exc))
            continue
        if not writer.is_gone():
            continue
        claimed = path.with_name(path.name + _OFFERED_SUFFIX)
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            continue
        except OSError as exc:  # a folder that refuses the rename: offered by no one rather than by every window
            notices.append(f"recovery file {path} could not be claimed ({exc.strerror or exc}); it is left where it is")
            continue
        try:
            payload = _read_recovery(claimed)
            decoded = decode_document(payload["document"], str(claimed))
        except (OSError, ValueError, KeyError, TypeError, SessionFormatError) as exc:
            notices.append(_set_aside(claimed, exc))
            continue
        session_path = payload.get("session_path")
        offers.append(
            RecoveryOffer(
                claimed,
                decoded.session,
                None if session_path is None else Path(session_path),
                writer.pid,
                float(payload.get("saved_unix", 0.0)),
                _stamp(payload.get("session_on_disk")),
            )
        )
    return RecoveryScan(offers, notices)


def _stamp(value: object) -> DiskStamp | None:
    """A recovery file's stamp of the session file; anything but three integers is none (then a save asks first)."""
    if isinstance(value, list) and len(value) == 3 and all(type(v) is int for v in value):
        return (value[0], value[1], value[2])
    return None


def _set_aside(path: Path, exc: BaseException) -> str:
    aside = path.with_name(path.name.removesuffix(_OFFERED_SUFFIX) + _UNREADABLE_SUFFIX)
    try:
        os.rename(path, aside)
    except OSError:
        return f"recovery file {path} could not be read ({exc}) or set aside"
    return f"recovery file {path.name} could not be read ({exc}); kept as {aside}"
