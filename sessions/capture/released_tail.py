"""An unfinished recording whose writer was killed while libhdf5 gave back the end of the file.

At a flush, libhdf5 releases the unused space at the end of the file (what its allocators had
set aside) by truncating the file first and writing the superblock that says so after. A
writer killed between the two leaves a file a few KiB shorter than its superblock says, which
libhdf5 refuses as "truncated" although nothing the file holds is missing: the absent bytes
were never written (the truncation that had made room for them filled them with zeros). The
kill-safety test met it 1 run in 27 ("cut short: 580,357 of its 581,893 bytes are there").

Such a file is opened as it stood before the truncation, its absent tail read as zeros, and
only when it says it is unfinished: a finished capture or a longer gap is a copy that did not
finish, whose missing bytes held data. The capture file itself is never touched.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import h5py

from sessions.capture import format as cf

RELEASED_TAIL_MAX_BYTES = 4096
"""What a flush can give back at once: libhdf5's two allocators set aside 2 KiB each (the releases
measured in a recording were 512 to 1,820 bytes). A longer gap is a cut copy."""


class _ZeroTailedFile(io.RawIOBase):
    """The file at `path` read as `size` bytes long: past its real end, zeros."""

    def __init__(self, path: Path, size: int) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._size = size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = base + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), max(self._size - self._at, 0))
        done = 0
        while done < wanted:
            got = os.preadv(self._fd, [view[done:wanted]], self._at + done)
            if got == 0:
                view[done:wanted] = bytes(wanted - done)  # past the real end: the released tail
                break
            done += got
        self._at += wanted
        return wanted

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_unfinished_with_released_tail(path: Path, present: int, whole: int) -> h5py.File | None:
    """`path` opened for reading as if its last `whole - present` bytes were there, when that
    gap is small enough to be released space and the capture says it is unfinished; else None."""
    if whole - present > RELEASED_TAIL_MAX_BYTES:
        return None
    view = _ZeroTailedFile(path, whole)
    try:
        file = h5py.File(view, "r")
    except OSError:
        view.close()
        return None
    try:
        unfinished = int(file.attrs.get(cf.ATTR_COMPLETE, 1)) == 0
    except (OSError, TypeError, ValueError):
        unfinished = False
    if unfinished:
        return file
    file.close()
    view.close()
    return None
