"""Whether two stretches of stored bytes are equal, read into reused buffers, on threads ahead of
the comparison when there are cores to use.

Most of an identical run's comparison is this check: read both sides' bytes and compare them. A
read (`os.preadv`) lets go of the interpreter lock, so threads read side by side: on 2 cores
an 8 GB pair's pieces took 0.89 s on two threads against 1.95 s on one (`cat` of both files:
1.49 s). The comparing process asks for the checks it will need before it needs them
(`ByteChecks.ahead`), so its own work on each pair overlaps the reads too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from sessions.capture.pack_read import pread_exact

STORED_PIECE_BYTES = 4 * 1024 * 1024
"""Stored bytes are compared this much at a time: both pieces stay in cache while compared."""
SMALL_PIECE_BYTES = 4096
"""Pieces up to this size are compared as bytes: for a run of a few tiny records one `==` of two
copies costs less than comparing arrays (0.2 against 1.7 us for 1.4 KB)."""
TASK_BYTES = STORED_PIECE_BYTES
"""Checks ahead are handed to a thread in batches of about this many bytes a side: a run of tiny
records is a check of a kilobyte, which a task of its own would cost more to hand over than to do."""
AHEAD_BYTES = 128 * 1024 * 1024
"""How far ahead of the comparison, a side, the threads may be checking."""

FileSpot = tuple[int, int]
"""(file descriptor, byte offset)."""
Check = tuple[FileSpot, FileSpot, int]
"""Native spot, oracle spot, and how many bytes from each."""


class Pieces:
    """Two reused buffers of one piece each, one per side: a fresh buffer per record faults its
    pages in again (a 33 MB record read into new memory cost 8x the same read into a kept buffer)."""

    def __init__(self) -> None:
        self.size = STORED_PIECE_BYTES
        self.native, self.oracle = bytearray(self.size), bytearray(self.size)
        self._words = np.frombuffer(self.native, np.uint64), np.frombuffer(self.oracle, np.uint64)

    def read(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """`size` (at most a piece) bytes of each side into the buffers; False on a short read
        (the file was cut short since its check: a difference, which the caller's full pass names)."""
        try:
            pread_exact(native[0], native[1], np.frombuffer(self.native, np.uint8, size))
            pread_exact(oracle[0], oracle[1], np.frombuffer(self.oracle, np.uint8, size))
        except OSError:
            return False
        return True

    def same(self, size: int) -> bool:
        """Whether the first `size` bytes read are equal. A whole piece is compared as bytes
        (memcmp); a shorter one up to SMALL_PIECE_BYTES as bytes too (its slices are copies, cheap
        at that size), past it as 8-byte words in place (copying a 4 MiB piece to compare it cost
        8x the comparison)."""
        a, b = self.native, self.oracle
        if size == self.size:
            return a == b
        if size <= SMALL_PIECE_BYTES:
            return a[:size] == b[:size]
        whole = size // 8
        return bool(np.array_equal(self._words[0][:whole], self._words[1][:whole])) and a[whole * 8 : size] == b[whole * 8 : size]

    def equal(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """Whether `size` bytes from each spot are equal, a piece at a time."""
        for done in range(0, size, self.size):
            n = min(self.size, size - done)
            if not (self.read((native[0], native[1] + done), (oracle[0], oracle[1] + done), n) and self.same(n)):
                return False
        return True


class ByteChecks:
    """Checks of stored bytes on `threads` threads, each with its own Pieces; with one thread,
    each check is made when its answer is asked for, in the caller's thread."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="byte-checks") if threads > 1 else None
        self.threads = threads
        self._local = threading.local()

    def _pieces(self) -> Pieces:
        pieces: Pieces | None = getattr(self._local, "pieces", None)
        if pieces is None:
            pieces = self._local.pieces = Pieces()
        return pieces

    def _all_equal(self, checks: list[Check]) -> list[bool]:
        pieces = self._pieces()
        return [pieces.equal(*check) for check in checks]

    def ahead(self, checks: list[Check]) -> Generator[bool, None, None]:
        """Whether each check's bytes are equal, in order, worked out on the threads ahead of
        the caller (at most AHEAD_BYTES a side), who takes the answers as it reaches them.
        Closing the iterator (or `close`) drops the checks not yet begun."""
        if self._pool is None:
            pieces = self._pieces()
            return (pieces.equal(*check) for check in checks)
        return self._answers(_batches(checks), AHEAD_BYTES)

    def equal(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """Whether `size` bytes from each spot are equal: the pieces of a stretch longer than one
        piece are shared out between the threads at once, a share each (a task per piece cost
        a sixth more: 0.52 against 0.45 s for a 4 GiB pair of 64 MiB records)."""
        if self._pool is None or size <= STORED_PIECE_BYTES:
            return self._pieces().equal(native, oracle, size)
        pieces = [
            ((native[0], native[1] + done), (oracle[0], oracle[1] + done), min(STORED_PIECE_BYTES, size - done))
            for done in range(0, size, STORED_PIECE_BYTES)
        ]
        share = -(-len(pieces) // self.threads)
        return all(self._answers(iter([pieces[i : i + share] for i in range(0, len(pieces), share)]), size))

    def _answers(self, batches: Iterator[list[Check]], window: int) -> Generator[bool, None, None]:
        """The batches' answers in order, each batch handed to the threads once those before it
        hold less than `window` bytes a side. Checks ahead keep AHEAD_BYTES: far enough ahead to
        keep every thread reading, not so far that a capture larger than memory pushes out of
        the page cache what the comparison has yet to read again (a run whose bytes differ is
        compared pair by pair)."""
        assert self._pool is not None
        pending: deque[tuple[Future[list[bool]], int]] = deque()
        ahead = 0
        try:
            while True:
                while ahead < window:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    size = sum(check[2] for check in batch)
                    pending.append((self._pool.submit(self._all_equal, batch), size))
                    ahead += size
                if not pending:
                    return
                future, size = pending.popleft()
                ahead -= size
                yield from future.result()
        finally:
            for future, _ in pending:
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _batches(checks: list[Check]) -> Iterator[list[Check]]:
    """Consecutive checks in batches of at least TASK_BYTES a side (the last one may hold less)."""
    start, held = 0, 0
    for index, check in enumerate(checks):
        held += check[2]
        if held >= TASK_BYTES or index + 1 == len(checks):
            yield checks[start : index + 1]
            start, held = index + 1, 0
