"""Stored bytes checked on threads ahead of the comparison (sessions.compare.byte_checks): the same
answers as one thread, in the order asked, and no thread left once the checks are closed."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from sessions.compare import byte_checks
from sessions.compare.byte_checks import (
    KEEP_ALL,
    KEPT_SHARE_OF_MEMORY,
    PIECE_BYTES,
    STRETCH_BYTES,
    ByteChecks,
    Check,
    kept_in_page_cache,
)
from sessions.compare.early_reader import RELEASE_ALIGN, PageRelease


def _files(tmp_path: Path, size: int) -> tuple[Path, Path, bytes, bytearray]:
    data = np.random.default_rng(11).integers(0, 256, size, dtype=np.uint8).tobytes()
    changed = bytearray(data)
    for at in (5, 70_000, PIECE_BYTES + 3, STRETCH_BYTES + 3, size - 1):
        if at < size:
            changed[at] ^= 0x01
    native, oracle = tmp_path / "n.bin", tmp_path / "o.bin"
    native.write_bytes(data)
    oracle.write_bytes(bytes(changed))
    return native, oracle, data, changed


def _byte_check_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("byte-checks")]


def test_checks_ahead_on_threads_give_one_threads_answers_in_the_order_asked(tmp_path: Path) -> None:
    size = 2 * STRETCH_BYTES + 1000
    native, oracle, data, changed = _files(tmp_path, size)
    rng = np.random.default_rng(3)
    starts = rng.integers(0, size - 1, 300)
    lengths = [int(rng.choice([1, 100, 5000, 300_000, STRETCH_BYTES + 17])) for _ in starts]
    with open(native, "rb") as a, open(oracle, "rb") as b:
        checks: list[Check] = [((a.fileno(), int(s)), (b.fileno(), int(s)), min(n, size - int(s))) for s, n in zip(starts, lengths)]
        expected = [data[s : s + n] == bytes(changed[s : s + n]) for (_, s), _, n in checks]
        assert 0 < sum(expected) < len(expected), "some checks hold a difference, some do not"
        for threads in (1, 2, 3):
            checks_ahead = ByteChecks(threads)
            try:
                assert list(checks_ahead.ahead(checks)) == expected, threads
                assert [checks_ahead.equal(*check) for check in checks] == expected, threads
            finally:
                checks_ahead.close()


def test_closing_checks_ahead_and_then_the_checks_leaves_no_thread(tmp_path: Path) -> None:
    native, _, _, _ = _files(tmp_path, STRETCH_BYTES)  # compared with itself: every check equal
    with open(native, "rb") as a:
        spot = (a.fileno(), 0)
        checks = ByteChecks(2)
        answers = checks.ahead([(spot, spot, STRETCH_BYTES)] * 200)
        assert next(answers) is True
        assert _byte_check_threads(), "the checks run on their own threads"
        answers.close()
        checks.close()
    assert _byte_check_threads() == []


def test_a_comparison_cancelled_while_its_bytes_are_checked_ahead_leaves_no_thread(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from sessions.capture.opening import open_capture
    from sessions.compare import comparison
    from sessions.compare.options import CompareOptions
    from tests.test_compare import _many_small_records

    monkeypatch.setattr(comparison, "check_threads", lambda options: 2)
    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    with open_capture(native) as n, open_capture(oracle) as o:
        work = comparison.iter_compare(n, o, CompareOptions(workers=1))
        labels = [next(work).label for _ in range(3)]
        assert _byte_check_threads(), f"the comparison checks its runs' bytes on threads ({labels})"
        work.close()
    assert _byte_check_threads() == []


def test_a_pair_readers_checks_stop_their_threads_when_their_owner_is_done_with_them(tmp_path: Path) -> None:
    from sessions.capture.opening import open_capture
    from sessions.compare.pair_reader import PairReader
    from tests.test_compare import _many_small_records

    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    with open_capture(native) as n, open_capture(oracle) as o:
        with ByteChecks(2) as checks:
            with PairReader(n, o, checks) as reader:
                spot = (n.descriptor, 0)
                assert list(reader.checks.ahead([(spot, spot, 64)] * 3)) == [True] * 3
            assert _byte_check_threads(), "the reader leaves its owner's checks running"
        assert _byte_check_threads() == [], "gone while the captures are still open"


def test_checks_ahead_go_no_further_ahead_than_the_window(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A capture larger than memory must not be read far ahead of the comparison, which may have
    to read a run again (pair by pair) and would find it pushed out of the page cache."""
    from sessions.compare import byte_checks

    monkeypatch.setattr(byte_checks, "AHEAD_BYTES", 2 * byte_checks.STRETCH_BYTES)
    begun: list[int] = []
    real = ByteChecks._all_equal

    def counted(checks, batch):  # type: ignore[no-untyped-def]
        begun.append(len(batch))
        return real(checks, batch)

    monkeypatch.setattr(ByteChecks, "_all_equal", counted)
    native, _, _, _ = _files(tmp_path, STRETCH_BYTES)
    with open(native, "rb") as a:
        spot = (a.fileno(), 0)
        checks = ByteChecks(2)
        answers = checks.ahead([(spot, spot, STRETCH_BYTES // 4)] * 100)
        assert next(answers) is True
        answers.close()
        checks.close()
    assert begun and len(begun) <= 2, f"batches begun: {begun} (25 were asked for, 2 fit the window)"
    assert begun[0] == 4, "a batch holds STRETCH_BYTES a side"


def _resident_pages(fd: int, size: int) -> list[bool]:
    """Which of a file's pages are in the page cache, by mincore(2) on a mapping of it: a read
    that may not wait (RWF_NOWAIT) would tell too, but starts the kernel's read-ahead of the pages after."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        pages = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        assert libc.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
        return [bool(flag & 1) for flag in pages.raw]
    finally:
        libc.munmap(address, size)


def _cached_files(tmp_path: Path, size: int) -> tuple[Path, Path]:
    """`_files` on the disk and read whole into the page cache; skipped where the file system
    keeps its pages whatever it is told (tmpfs)."""
    native, oracle, _, _ = _files(tmp_path, size)
    for path in (native, oracle):
        with open(path, "rb") as file:
            os.fsync(file.fileno())
            if not hasattr(os, "posix_fadvise"):
                pytest.skip("this system takes no advice on its page cache")
            os.posix_fadvise(file.fileno(), 0, size, os.POSIX_FADV_DONTNEED)
            if any(_resident_pages(file.fileno(), size)):
                pytest.skip("this file system keeps its pages in memory whatever it is told")
            file.read()
            assert all(_resident_pages(file.fileno(), size))
    return native, oracle


@pytest.mark.parametrize("threads", [1, 2])
def test_bytes_found_equal_are_let_go_of_the_page_cache_past_the_kept_offset_and_bytes_that_differ_are_kept(tmp_path: Path, threads: int) -> None:
    """A pair larger than memory is read once through: what is kept past its share pushes out
    what the next comparison reads first, and costs the kernel a reclaimed page per page read."""
    size = 2 * STRETCH_BYTES
    native, oracle = _cached_files(tmp_path, size)  # differing at 5, 70,000, PIECE_BYTES + 3, STRETCH_BYTES + 3, size - 1
    kept = PIECE_BYTES
    with open(native, "rb") as a, open(oracle, "rb") as b, ByteChecks(threads, (kept, kept)) as checks:
        equal_at, equal_size = 2 * PIECE_BYTES, STRETCH_BYTES - 2 * PIECE_BYTES
        assert checks.equal((a.fileno(), equal_at), (b.fileno(), equal_at), equal_size)
        assert not checks.equal((a.fileno(), STRETCH_BYTES), (b.fileno(), STRETCH_BYTES), STRETCH_BYTES)
        for fd in (a.fileno(), b.fileno()):
            pages = _resident_pages(fd, size)
            page = mmap.PAGESIZE
            assert all(pages[: equal_at // page]), "checked or not, bytes before the equal stretch stay"
            assert not any(pages[equal_at // page : STRETCH_BYTES // page]), "the equal stretch, past the kept offset, is let go"
            assert all(pages[STRETCH_BYTES // page :]), "bytes that differ are kept: the comparison reads them again"


def test_a_pair_that_fits_in_memory_keeps_every_byte_and_one_that_does_not_keeps_a_share_of_memory_a_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, oracle, _, _ = _files(tmp_path, 3000)
    with open(native, "rb") as a, open(oracle, "rb") as b:
        monkeypatch.setattr(byte_checks, "available_memory", lambda: 6000)
        assert kept_in_page_cache(a.fileno(), b.fileno()) == (KEEP_ALL, KEEP_ALL)
        monkeypatch.setattr(byte_checks, "available_memory", lambda: 5999)
        assert kept_in_page_cache(a.fileno(), b.fileno()) == (5999 // KEPT_SHARE_OF_MEMORY, 5999 // KEPT_SHARE_OF_MEMORY)
        assert kept_in_page_cache(None, b.fileno()) == (KEEP_ALL, KEEP_ALL), "a capture read without a descriptor"


def test_bytes_that_follow_one_another_are_let_go_in_whole_blocks_as_they_come(tmp_path: Path) -> None:
    """The kernel caches a file in blocks of up to 2 MiB and keeps one that a span to drop covers
    in part: let go check by check, half of a real pair's pages past the share kept stayed. (What
    is held past the last whole block is let go on `close`, or when bytes that do not follow it
    come: a part of a block, which a system caching in large blocks keeps either way.)"""
    size = 4 * RELEASE_ALIGN
    native, oracle = _cached_files(tmp_path, size)
    page = mmap.PAGESIZE
    with open(native, "rb") as a, open(oracle, "rb") as b:
        release = PageRelease((0, RELEASE_ALIGN))
        release.add((a.fileno(), 100), (b.fileno(), 100), RELEASE_ALIGN + 5)
        release.add((a.fileno(), RELEASE_ALIGN + 105), (b.fileno(), RELEASE_ALIGN + 105), 2 * RELEASE_ALIGN - 98)
        native_pages, oracle_pages = _resident_pages(a.fileno(), size), _resident_pages(b.fileno(), size)
        release.close()
    assert not any(native_pages[RELEASE_ALIGN // page : 3 * RELEASE_ALIGN // page]), "let go up to the last whole block"
    assert all(native_pages[3 * RELEASE_ALIGN // page :]), "held: the next check may go on from there"
    assert all(oracle_pages[: RELEASE_ALIGN // page]), "kept: the share of memory this side keeps"
    assert not any(oracle_pages[RELEASE_ALIGN // page : 3 * RELEASE_ALIGN // page])
