"""How much a write may still add to a file, and the one line that says a file cannot be written.

A full device and a file size limit (RLIMIT_FSIZE, as a CI job or a batch system may set) both
end writes. libhdf5 and MLX report either in words a user cannot act on ("slist already
enabled?", "Unable to write 659706 bytes to file."), and libhdf5, once one of its writes has
failed, can no longer close the file. So writers ask for room before they write.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

UNKNOWN_ROOM = 2**62
"""The room of a file system that keeps no count of its blocks (ramfs): as much as asked."""


class FileUnwritable(OSError):
    """A file that could not be written, said in one line that names it: made as
    OSError(errno or None, what failed and why, the file's path)."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def room_for(path: Path, size: int = 0) -> int:
    """Bytes that writes to `path`, now `size` bytes long, may still add: the free space of its
    folder's device, and under a file size limit, what is left of that limit."""
    device = os.statvfs(path.parent)
    # ramfs (and tmpfs without a size) report no blocks at all: no limit to ask about. Root may
    # also use the blocks the file system keeps for it.
    free = device.f_bfree if os.geteuid() == 0 else device.f_bavail
    room = free * device.f_frsize if device.f_blocks else UNKNOWN_ROOM
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY:
        room = min(room, limit - size)
    return max(room, 0)
