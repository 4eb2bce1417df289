"""Whether two stretches of stored bytes are equal, read into reused buffers, on threads ahead of
the comparison when there are cores to use, and before it while it pairs records.

Most of an identical run's comparison is this check: read both sides' bytes and compare them. A
read (`os.preadv`) lets go of the interpreter lock, so threads read side by side: on 2 cores
an 8 GB pair's pieces took 0.89 s on two threads against 1.95 s on one (`cat` of both files:
1.49 s). The comparing process asks for the checks it will need before it needs them
(`ByteChecks.ahead`), so its own work on each pair overlaps the reads too. Before that, while
it pairs the records, a process of its own checks the bytes the two captures lay out alike
(`ByteChecks.check_early`): a 240,000-record 8 GB warm report on 2 cores took 5.0-5.7 s with
it against 6.1-6.7 s without (four runs each, alternating).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from sessions.capture.pack_read import pread_exact
from sessions.child_env import child_env, module_command
from sessions.compare import early_reader
from sessions.compare.early_reader import PIECE_BYTES
from sessions.compare.page_release import KEEP_ALL, FileSpan, Kept, PageRelease

EARLY_MIN_BYTES = 256 * 1024 * 1024
"""Fewer alike bytes a side than this are not checked early: starting the process (30-60 ms)
would cost about what the comparison's own threads take to check them."""
EARLY_READER = early_reader.__name__
"""The module a process of its own runs to check stretches before the comparison asks (`ByteChecks.check_early`)."""
EARLY_READER_THREADS = 4
"""The most threads the early process reads on. Past a few, reads from the page cache gain
little: a many-GB pair compared fastest on 4 processes of 16 cores (issue 16's device runs)."""

STRETCH_BYTES = 4 * 1024 * 1024
"""Stored bytes are handed out this much at a time: a run of small records is cut where its bytes
pass a multiple of it (sessions.compare.pair_compare), a long record is shared out between the
threads in stretches of it, and a thread is handed checks in batches of about it."""
SMALL_PIECE_BYTES = 4096
"""Pieces up to this size are compared as bytes: for a run of a few tiny records one `==` of two
copies costs less than comparing arrays (0.2 against 1.7 us for 1.4 KB)."""
AHEAD_BYTES = 128 * 1024 * 1024
"""How far ahead of the comparison, a side, the threads may be checking."""

FileSpot = tuple[int, int]
"""(file descriptor, byte offset)."""
Check = tuple[FileSpot, FileSpot, int]
"""Native spot, oracle spot, and how many bytes from each."""


def early_threads(threads: int) -> int:
    """Threads for the early process of a comparison allowed `threads`: one core stays with the
    pairing, which runs meanwhile (on 2 cores the early process reads on one thread)."""
    return max(1, min(EARLY_READER_THREADS, threads - 1))


class Pieces:
    """Two reused buffers of one piece each, one per side: a fresh buffer per record faults its
    pages in again (a 33 MB record read into new memory cost 8x the same read into a kept buffer)."""

    def __init__(self) -> None:
        self.size = PIECE_BYTES
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
        at that size), past it as 8-byte words in place (copying a piece to compare it cost
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


class KnownStretches:
    """Stretches of stored bytes checked before anyone asked: regions of the two files that hold
    alike records laid out alike (sessions.compare.early_checks), cut into STRETCH_BYTES from
    each region's start, each settled equal or not. A check inside a region is answered from
    the stretches that cover it: all equal means its bytes are equal; otherwise (a stretch
    differs somewhere, or is not settled yet) it is made as usual."""

    def __init__(self, native_fd: int, oracle_fd: int, regions: list[tuple[int, int, int]]) -> None:
        """`regions`: (native offset, oracle offset, bytes), sorted by native offset, disjoint."""
        self.descriptors = (native_fd, oracle_fd)
        self.regions = regions
        self._starts = [region[0] for region in regions]
        self._first: list[int] = []
        """Each region's first stretch's place in `equal` (and in `stretches`)."""
        count = 0
        for _, _, size in regions:
            self._first.append(count)
            count += -(-size // STRETCH_BYTES)
        self.equal = [False] * count
        """Whether each stretch was found equal (False: not yet checked, or differs)."""
        self.settled = 0
        """How many stretches, from the first, have their answer."""

    def stretches(self) -> list[Check]:
        """Every stretch's check, in the order of `equal`."""
        n_fd, o_fd = self.descriptors
        return [
            ((n_fd, n_at + done), (o_fd, o_at + done), min(STRETCH_BYTES, size - done))
            for n_at, o_at, size in self.regions
            for done in range(0, size, STRETCH_BYTES)
        ]

    def covers(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """Whether the stretches covering these bytes were all found equal."""
        if (native[0], oracle[0]) != self.descriptors or size <= 0:
            return False
        at = bisect_right(self._starts, native[1]) - 1
        if at < 0:
            return False
        n_at, o_at, region_size = self.regions[at]
        into = native[1] - n_at
        if oracle[1] - o_at != into or into + size > region_size:
            return False
        first = self._first[at]
        return all(self.equal[first + into // STRETCH_BYTES : first + (into + size - 1) // STRETCH_BYTES + 1])


class ByteChecks:
    """Checks of stored bytes on `threads` threads, each with its own Pieces; with one thread,
    each check is made when its answer is asked for, in the caller's thread. Stretches checked
    early (`check_early`) answer the checks they cover."""

    def __init__(self, threads: int, kept: Kept = (KEEP_ALL, KEEP_ALL)) -> None:
        """`kept`: from which offset of each file bytes done with are let go of the page cache
        (`page_release.kept_in_page_cache`)."""
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="byte-checks") if threads > 1 else None
        self.threads = threads
        self._release = PageRelease(kept)
        self._local = threading.local()
        self.known = KnownStretches(-1, -1, [])
        self._early: subprocess.Popen[bytes] | None = None
        self._early_answers: threading.Thread | None = None

    def check_early(self, known: KnownStretches) -> None:
        """Start checking `known`'s stretches now, in order, in a process of its own
        (sessions.compare.early_reader), while this one finds its pairs: these bytes are most of
        what the comparison will ask about. Only where the comparison may use more than one
        thread (asked for one, it gets no more) and there are EARLY_MIN_BYTES to check."""
        stretches = known.stretches()
        if self._pool is None or sum(size for _, _, size in stretches) < EARLY_MIN_BYTES or min(known.descriptors) <= 2:
            return  # (a capture opened as descriptor 0-2 would be the child's stdin, stdout or stderr)
        try:
            with tempfile.TemporaryFile() as asked:
                asked.write(b"".join(b"%d %d %d\n" % (native[1], oracle[1], size) for native, oracle, size in stretches))
                asked.seek(0)
                early = subprocess.Popen(
                    module_command(EARLY_READER, *(str(fd) for fd in known.descriptors), str(early_threads(self.threads))),
                    stdin=asked, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=known.descriptors, env=child_env(),
                )
        except (OSError, ValueError):
            return  # no temporary file, no process to spare, or none that can share descriptors: every check is made when asked
        answers = threading.Thread(target=self._settle, args=(early, known), daemon=True)
        try:
            answers.start()
        except RuntimeError:  # no thread to spare
            _end(early)
            return
        self.known, self._early, self._early_answers = known, early, answers

    def _settle(self, early: subprocess.Popen[bytes], known: KnownStretches) -> None:
        """Each answer of the early process into `known`, as it comes (until it ends or is killed)."""
        assert early.stdout is not None
        while known.settled < len(known.equal):
            answers = early.stdout.read1(4096)
            if not answers:
                return
            for answer in answers[: len(known.equal) - known.settled]:  # never past the stretches asked about
                known.equal[known.settled] = answer == ord("1")
                known.settled += 1

    def _pieces(self) -> Pieces:
        pieces: Pieces | None = getattr(self._local, "pieces", None)
        if pieces is None:
            pieces = self._local.pieces = Pieces()
        return pieces

    @property
    def keeps_all(self) -> bool:
        """Whether every byte stays in the page cache (a pair that fits in memory): nothing is let go."""
        return self._release.keeps_all

    def let_go(self, native: FileSpot, oracle: FileSpot, size: int) -> None:
        """Let `size` bytes at each spot, found equal, go of the page cache past where `kept` says
        (`page_release.PageRelease`), in the order the comparison takes the answers.
        Bytes that differ are kept: the comparison reads them again pair by pair, and lets them go
        once done (`done_with`)."""
        self.done_with((*native, size), (*oracle, size))

    def done_with(self, native: FileSpan | None, oracle: FileSpan | None) -> None:
        """Let each side's span (None: nothing of that side) go of the page cache past where `kept`
        says, once the comparison has compared it element by element and will not read it again."""
        if not self._release.keeps_all:
            self._release.add(native, oracle)

    def _equal_here(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """A check made in the caller's thread, its bytes let go once found equal."""
        if not self._pieces().equal(native, oracle, size):
            return False
        self.let_go(native, oracle, size)
        return True

    def _all_equal(self, checks: list[Check]) -> list[bool]:
        pieces, known = self._pieces(), self.known
        return [known.covers(*check) or pieces.equal(*check) for check in checks]

    def ahead(self, checks: list[Check]) -> Generator[bool, None, None]:
        """Whether each check's bytes are equal, in order, worked out on the threads ahead of
        the caller (at most AHEAD_BYTES a side), who takes the answers as it reaches them.
        Closing the iterator (or `close`) drops the checks not yet begun."""
        if self._pool is None:
            return (self._equal_here(*check) for check in checks)
        return self._answers(_batches(checks), AHEAD_BYTES)

    def equal(self, native: FileSpot, oracle: FileSpot, size: int) -> bool:
        """Whether `size` bytes from each spot are equal: the stretches of a record longer than
        one are shared out between the threads at once, a share each (a task per piece cost
        a sixth more: 0.52 against 0.45 s for a 4 GiB pair of 64 MiB records)."""
        if self.known.covers(native, oracle, size):
            return True
        if self._pool is None or size <= STRETCH_BYTES:
            return self._equal_here(native, oracle, size)
        pieces = [
            ((native[0], native[1] + done), (oracle[0], oracle[1] + done), min(STRETCH_BYTES, size - done))
            for done in range(0, size, STRETCH_BYTES)
        ]
        share = -(-len(pieces) // self.threads)
        if not all(self._answers(iter([pieces[i : i + share] for i in range(0, len(pieces), share)]), size, let_go=False)):
            return False  # the record is compared again, element by element: none of its bytes is let go
        self.let_go(native, oracle, size)
        return True

    def _answers(self, batches: Iterator[list[Check]], window: int, let_go: bool = True) -> Generator[bool, None, None]:
        """The batches' answers in order, each batch handed to the threads once those before it
        hold less than `window` bytes a side. Checks ahead keep AHEAD_BYTES: far enough ahead to
        keep every thread reading, not so far that a capture larger than memory pushes out of
        the page cache what the comparison has yet to read again (a run whose bytes differ is
        compared pair by pair). With `let_go`, each check's bytes found equal are let go as its
        answer is taken (`let_go`)."""
        assert self._pool is not None
        pending: deque[tuple[Future[list[bool]], list[Check], int]] = deque()
        ahead = 0
        try:
            while True:
                while ahead < window:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    size = sum(check[2] for check in batch)
                    pending.append((self._pool.submit(self._all_equal, batch), batch, size))
                    ahead += size
                if not pending:
                    return
                future, batch, size = pending.popleft()
                ahead -= size
                for check, answer in zip(batch, future.result()):
                    if answer and let_go:
                        self.let_go(*check)  # as the answer is taken: the taker checks other bytes between answers
                    yield answer
        finally:
            for future, _, _ in pending:
                future.cancel()

    def end_early(self) -> None:
        """End the early process, keeping the answers it gave. Called as the comparison begins:
        its own threads then check the rest, and the early process read the same bytes beside
        them (a 4.3 GB warm pair of 64 MiB records, paired in 2 ms, was read twice over)."""
        if self._early is not None and self._early_answers is not None:
            _end(self._early, self._early_answers)
            self._early = self._early_answers = None

    def close(self) -> None:
        self.end_early()
        self._release.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ByteChecks:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _end(early: subprocess.Popen[bytes], answers: threading.Thread | None = None) -> None:
    """Kill and reap the early process; its answers' pipe then ends, so `answers` (the thread
    reading them) takes what is left in it and returns before the pipe is closed. Closed first,
    the pipe made the thread's next read fail: an exception in the thread, and the answers still
    in the pipe lost."""
    early.kill()
    early.wait()
    if answers is not None:
        answers.join()
    if early.stdout is not None:
        early.stdout.close()


def _batches(checks: list[Check]) -> Iterator[list[Check]]:
    """Consecutive checks in batches of at least STRETCH_BYTES a side (the last one may hold less):
    a run of tiny records is a check of a kilobyte, which a task of its own would cost more to
    hand over than to do."""
    start, held = 0, 0
    for index, check in enumerate(checks):
        held += check[2]
        if held >= STRETCH_BYTES or index + 1 == len(checks):
            yield checks[start : index + 1]
            start, held = index + 1, 0
