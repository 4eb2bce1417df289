"""Letting a pair's bytes go of the page cache once the comparison is done with them, for a pair larger than memory.

A pair of captures larger than the memory the system could give is read once through. Each page
kept in the page cache pushes out another, and the kernel reclaims it in the reading thread: a
bare read of a 31.7 GB pair on a 23 GiB, 2-core machine (one thread, both files in turn, 256 KiB
pieces) took 34.3 s, 31.4 s of it system time; dropping what was read, 11.6 s and 3.8 s (`cat`
of both files: 17-19 s). The comparison keeps the first bytes of each file, which its next run
reads first, and lets the rest go (`kept_in_page_cache`): bytes found equal as their answer is
taken, bytes that differ once the pair holding them is compared element by element.
"""

from __future__ import annotations

import os
import sys

from sessions.machine import available_memory

KEEP_ALL = sys.maxsize
"""A file offset no byte reaches: every byte read stays in the page cache."""
KEPT_SHARE_OF_MEMORY = 4
"""A pair larger than the memory the system could give keeps at most this share of it, a side, in
the page cache (its first bytes, which the next comparison of the pair reads first): the rest
is let go once the comparison is done with it (`PageRelease`)."""

FileSpan = tuple[int, int, int]
"""(file descriptor, byte offset, bytes)."""
Kept = tuple[int, int]
"""From which offset of the native and of the oracle file bytes done with are let go of the page cache."""
RELEASE_ALIGN = 2 * 1024 * 1024
"""Bytes are let go of the page cache in spans that start and end on multiples of this where they
can: the kernel caches a file in blocks of up to 2 MiB (large folios) and keeps a block that a
span to drop covers only in part. Let go in checks' own unaligned spans, half of a 31.7 GB pair's
pages past the share kept stayed cached, in alternate 2 MiB blocks."""


class PageRelease:
    """Bytes of two files the comparison is done with (found equal, or compared element by
    element), let go of the page cache (POSIX_FADV_DONTNEED) past where each file's bytes are
    kept. Advice only: a file the system keeps otherwise (tmpfs) is unchanged.

    Bytes are handed in the order the comparison takes its answers, never by a thread as it
    finishes a check: another thread still reading an earlier stretch has the kernel read ahead
    of it, into the bytes just let go, which then stay (45% of a 31.7 GB pair's pages past the
    share kept were still cached after a comparison on 2 threads). Each file's bytes that
    follow one another are gathered and let go in RELEASE_ALIGN blocks; the rest on `close`."""

    def __init__(self, kept: tuple[int, int]) -> None:
        self.kept = kept
        self._held: list[tuple[int, int, int] | None] = [None, None]
        """Per side: (descriptor, start, end) of bytes done with and not let go yet."""

    @property
    def keeps_all(self) -> bool:
        """Whether every byte stays cached: `add` would let none go (a pair that fits in memory)."""
        return self.kept == (KEEP_ALL, KEEP_ALL)

    def add(self, native: FileSpan | None, oracle: FileSpan | None) -> None:
        """Each side's span (None: nothing of that side) done with: found equal, or compared."""
        for side, span in enumerate((native, oracle)):
            if span is not None:
                self._add(side, *span)

    def _add(self, side: int, fd: int, at: int, size: int) -> None:
        start, end = max(at, self.kept[side]), at + size
        if start >= end:
            return
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


def kept_in_page_cache(native_fd: int | None, oracle_fd: int | None) -> Kept:
    """Where each file's bytes stop being kept in the page cache once done with: nowhere when both
    files fit in the memory the system could give (a second comparison then reads them from
    memory); else after the first KEPT_SHARE_OF_MEMORY of it, a side. Kept whole, a pair larger
    than memory pushed out of the cache the bytes the next comparison reads first, and the
    kernel reclaimed a page for every page read, in the reading threads: a 31.7 GB pair on a
    23 GiB, 2-core machine (`report --workers 2`, two runs each) took 24.0-25.1 s from a cold
    cache (28-31 s of system time) and 11.4-12.3 s right after; letting go, 15.0-16.7 s (6-11 s)
    and 10.9-11.2 s. `cat` of both files: 18.1 and 12.2 s."""
    if native_fd is None or oracle_fd is None or not hasattr(os, "posix_fadvise"):
        return KEEP_ALL, KEEP_ALL  # (macOS takes no such advice)
    available = available_memory()
    native, oracle = os.fstat(native_fd), os.fstat(oracle_fd)
    same = (native.st_dev, native.st_ino) == (oracle.st_dev, oracle.st_ino)  # a capture compared with itself is cached once
    if native.st_size + (0 if same else oracle.st_size) <= available:
        return KEEP_ALL, KEEP_ALL
    return available // KEPT_SHARE_OF_MEMORY, available // KEPT_SHARE_OF_MEMORY
