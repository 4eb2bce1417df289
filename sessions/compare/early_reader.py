"""A process of its own that checks stretches of two open files, before the comparison asks.

Threads could not do this early work: while the comparing process pairs records it holds the
interpreter lock, and a thread reading beside it waited for the lock after every read (6.3 GB
took 4.4 s on a thread, and slowed the pairing). This process shares no lock: it is handed the
two descriptors and the stretches (one line each, "native-offset oracle-offset bytes"), and
answers with one byte per stretch, in order: b"1" when equal, b"0" when not or unreadable. It
imports nothing but the standard library and the project's two package files, so it starts in a
few tens of milliseconds. It reads on as many threads as it is told (a read lets go of the
interpreter lock while the system copies the bytes): on one thread, 16 cores left the
comparison waiting 1.2 s for the bytes of a 240,000-record 8 GB pair after its pairing ended.
Bytes found equal past where each file's bytes are kept in the page cache are let go of it
(`PageRelease`), as the comparison's own checks do.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

PIECE_BYTES = 256 * 1024
"""Stored bytes are read and compared this much at a time, here and by every check of the
comparison (sessions.compare.byte_checks), into two buffers that stay in a core's own cache:
reading and comparing an 8 GB warm pair took 1.05 s of CPU in pieces of 256 KiB against 1.51 s
in pieces of 4 MiB (`cat` of both files: 1.09 s). Defined here, where nothing heavy is imported."""


KEEP_ALL = sys.maxsize
"""A file offset no byte reaches: every byte checked stays in the page cache."""
RELEASE_ALIGN = 2 * 1024 * 1024
"""Bytes are let go of the page cache in spans that start and end on multiples of this where they
can: the kernel caches a file in blocks of up to 2 MiB (large folios) and keeps a block that a
span to drop covers only in part. Let go in checks' own unaligned spans, half of a 31.7 GB pair's
pages past the share kept stayed cached, in alternate 2 MiB blocks."""


class PageRelease:
    """Bytes of two files found equal, let go of the page cache (POSIX_FADV_DONTNEED) past where
    each file's bytes are kept: a pair of captures larger than memory is read once through, and
    each byte kept pushes out another that the kernel must reclaim in the reading thread. A cold
    31.7 GB pair read twice as fast so (one thread, both files in turn: 34.3 s and 31.4 s of system
    time kept, 11.6 s and 3.8 s let go; `cat` 17-19 s). Advice only: a file the system keeps
    otherwise (tmpfs) is unchanged.

    Bytes are handed in the order they were asked about, once every check before them is
    answered, never by a thread as it finishes one: another thread still reading an earlier
    stretch has the kernel read ahead of it, into the bytes just let go. Each file's bytes that
    follow one another are gathered and let go in RELEASE_ALIGN blocks; the rest on `close`."""

    def __init__(self, kept: tuple[int, int]) -> None:
        self.kept = kept
        self._held: list[tuple[int, int, int] | None] = [None, None]
        """Per side: (descriptor, start, end) of bytes found equal and not let go yet."""

    def add(self, native: tuple[int, int], oracle: tuple[int, int], size: int) -> None:
        """`size` bytes at each (descriptor, offset), found equal."""
        for side, (fd, at) in enumerate((native, oracle)):
            start, end = max(at, self.kept[side]), at + size
            if start >= end:
                continue
            held = self._held[side]
            if held is not None and (held[0] != fd or held[2] != start):
                _drop(*held)
                held = None
            fd, start = (fd, start) if held is None else held[:2]
            cut = end // RELEASE_ALIGN * RELEASE_ALIGN
            if cut > start:
                _drop(fd, start, cut)
                start = cut
            self._held[side] = (fd, start, end) if start < end else None

    def close(self) -> None:
        """Let go of what is held."""
        for held in self._held:
            if held is not None:
                _drop(*held)
        self._held = [None, None]


def _drop(fd: int, start: int, end: int) -> None:
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def stretch_equal(native_fd: int, oracle_fd: int, native_at: int, oracle_at: int, size: int, a: bytearray, b: bytearray) -> bool:
    """Whether `size` bytes at each offset are equal, a piece at a time into `a` and `b`."""
    for done in range(0, size, len(a)):
        count = min(len(a), size - done)
        views = (a, b) if count == len(a) else (memoryview(a)[:count], memoryview(b)[:count])
        try:
            if os.preadv(native_fd, [views[0]], native_at + done) < count or os.preadv(oracle_fd, [views[1]], oracle_at + done) < count:
                return False
        except OSError:
            return False
        if (a != b) if count == len(a) else (a[:count] != b[:count]):
            return False
    return True


def main() -> None:
    """argv: the two descriptors, how many threads read, and from which offset of each file
    bytes found equal are let go of the page cache (`PageRelease`)."""
    native_fd, oracle_fd, threads, native_kept, oracle_kept = (int(arg) for arg in sys.argv[1:6])
    stretches = [tuple(int(field) for field in line.split()) for line in sys.stdin.buffer]
    buffers = threading.local()

    def equal(stretch: tuple[int, ...]) -> bool:
        if not hasattr(buffers, "a"):
            buffers.a, buffers.b = bytearray(PIECE_BYTES), bytearray(PIECE_BYTES)
        native_at, oracle_at, size = stretch
        return stretch_equal(native_fd, oracle_fd, native_at, oracle_at, size, buffers.a, buffers.b)

    out = sys.stdout.buffer
    release = PageRelease((native_kept, oracle_kept))
    with ThreadPoolExecutor(threads) as pool:
        for (native_at, oracle_at, size), answer in zip(stretches, pool.map(equal, stretches)):  # in order, whichever thread finished first
            out.write(b"1" if answer else b"0")
            out.flush()
            if answer:
                release.add((native_fd, native_at), (oracle_fd, oracle_at), size)
    release.close()


if __name__ == "__main__":
    main()
