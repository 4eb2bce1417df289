"""Hidden capture files left by writers that were killed, found and removed by the next writer of the same path.

A writer builds its capture under a hidden name beside the output (`.X.h5.<random>.partial`)
and renames it to X.h5 once it is complete (a recording: once its first step is committed).
A writer killed with -9, by the out-of-memory killer or by a power cut cannot remove that file:
the next import of X.h5 succeeded, and the killed one's gigabytes stayed on the disk, hidden.
Each writer therefore holds an exclusive lock (flock) on its hidden file for as long as it
lives, which the system releases when the process dies however it dies. A hidden file of the
same output that no process holds belongs to a dead writer, and the next writer of that output
removes it; commands say what they removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from sessions.atomic_write import files_beside, new_file_beside
from sessions.printable import printable

PARTIAL_SUFFIX = ".partial"

NEW_PARTIAL_TRIES = 100
"""New hidden files a writer makes before it gives up, when other writers' clean-ups take each one."""
UNLOCKED_GRACE_S = 300.0
"""A hidden file written to less than this long ago is left alone even when its lock can be
taken: a live writer takes its lock a moment after making the file, and on a file system whose
locks are only local (sshfs, SMB without byte-range locks) a writer on another host holds none
this host can see, while it keeps writing."""


@dataclass(frozen=True)
class AbandonedWrite:
    path: Path
    size: int

    def text(self, output: Path) -> str:
        return (
            f"removed {printable(self.path.name)} ({self.size:,} bytes), left beside {printable(str(output))} "
            "by an earlier write of it that was killed before it finished"
        )


def held_partial(path: Path) -> tuple[int, Path]:
    """A new hidden file for a capture of `path`, and a descriptor holding its lock: closing
    the descriptor (or the process dying) releases it."""
    for _ in range(NEW_PARTIAL_TRIES):
        descriptor, partial = new_file_beside(path, PARTIAL_SUFFIX)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue
        except OSError:
            return descriptor, partial  # no locks on this file system: the file is then never taken for abandoned (`_abandoned`)
        if _names(partial, descriptor):
            return descriptor, partial
        # Another writer's clean-up took the new file for abandoned (its clock is far off, as a
        # file server's may be): it holds the file or has removed it. A file of its own is made.
        os.close(descriptor)
    raise OSError(errno.EAGAIN, f"another writer's clean-up took each of {NEW_PARTIAL_TRIES} new hidden files for abandoned", str(path))


def _names(path: Path, descriptor: int) -> bool:
    """Whether `path` still names the file open as `descriptor`."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def remove_abandoned_writes(path: Path) -> list[AbandonedWrite]:
    """Remove the hidden files of `path` that no living writer holds; what was removed."""
    removed: list[AbandonedWrite] = []
    for partial in files_beside(path, PARTIAL_SUFFIX):
        found = _abandoned(partial)
        if found is not None:
            removed.append(found)
    return removed


def _abandoned(partial: Path) -> AbandonedWrite | None:
    """Remove `partial` if it is an old regular file whose lock this process can take; what was removed."""
    try:
        descriptor = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_mtime > time.time() - UNLOCKED_GRACE_S:
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # a living writer holds it, or the file system refuses the lock (NFS, on a read-only descriptor): kept
        if not _names(partial, descriptor):
            return None
        os.unlink(partial)
        return AbandonedWrite(partial, info.st_size)
    except OSError:
        return None
    finally:
        os.close(descriptor)
