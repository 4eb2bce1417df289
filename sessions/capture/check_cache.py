"""Which captures passed their structural check, remembered across processes.

The check of a large capture costs seconds, and every `parity-xray report` in CI and every
viewer start is a new process, so passes are kept on disk in the user cache directory (or
`$PARITY_XRAY_CACHE_DIR`), never beside the capture, which may be read-only or someone else's.
One small JSON entry per (resolved path, device, inode, memory budget) holds the file's size,
mtime and ctime when it passed; any difference means the file changed and is checked again.
ctime is included because a writer can restore an old mtime, but nothing but the kernel sets
ctime. Only passes are stored: a file that failed is checked again next time, so a fixed
checker or a repaired file is never shadowed by a stale verdict. Cache trouble (read-only
home, full disk, a damaged entry) only means checking again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs

from sessions.atomic_write import atomic_write_bytes

CACHE_DIR_ENV = "PARITY_XRAY_CACHE_DIR"
"""Overrides the user cache directory of Parity X-ray (tests point it at a temporary folder)."""

CHECKER_VERSION = 6
"""Bumped whenever the structural check starts refusing something new, so older passes no longer count."""

MAX_ENTRIES = 4096
"""Entries kept; the least recently checked go first. Each is a few hundred bytes."""


def cache_root() -> Path:
    """Parity X-ray's cache directory: `$PARITY_XRAY_CACHE_DIR` when set, else the platform's user cache dir."""
    override = os.environ.get(CACHE_DIR_ENV)
    return Path(override) if override else platformdirs.user_cache_path("parity-xray")


def checked_dir() -> Path:
    return cache_root() / "checked"


@dataclass(frozen=True)
class FileIdentity:
    """A file as it is on disk now, and the memory budget its check ran under."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    memory_budget: int
    checker: int = CHECKER_VERSION

    def entry_name(self) -> str:
        """One entry per file and budget, so a changed file replaces its own entry instead of piling up."""
        material = f"{self.path}\0{self.device}\0{self.inode}\0{self.memory_budget}"
        return hashlib.sha256(material.encode("utf-8", errors="surrogateescape")).hexdigest() + ".json"


def identity_of(path: Path, memory_budget: int) -> FileIdentity:
    stat = path.stat()
    return FileIdentity(
        path=str(path.resolve()),
        device=stat.st_dev,
        inode=stat.st_ino,
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        ctime_ns=stat.st_ctime_ns,
        memory_budget=memory_budget,
    )


def passed_before(identity: FileIdentity) -> bool:
    """Whether a file with exactly this identity passed a check in some process."""
    try:
        stored = json.loads((checked_dir() / identity.entry_name()).read_text("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return stored == asdict(identity)


def remember_pass(identity: FileIdentity) -> None:
    """Record a pass atomically; a cache that cannot be written is skipped (the next open checks again)."""
    folder = checked_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / identity.entry_name(), json.dumps(asdict(identity), sort_keys=True).encode())
        prune(folder)
    except OSError:
        return


def forget(identity: FileIdentity) -> None:
    """Drop the file's entry (its check failed): whatever passed before no longer stands."""
    try:
        (checked_dir() / identity.entry_name()).unlink(missing_ok=True)
    except OSError:
        return


def prune(folder: Path) -> None:
    """Keep a cache folder's MAX_ENTRIES most recently written entries."""
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".json"):
            try:
                entries.append((entry.stat().st_mtime_ns, entry.path))
            except OSError:
                continue
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort()
    for _, stale in entries[: len(entries) - MAX_ENTRIES]:
        Path(stale).unlink(missing_ok=True)
