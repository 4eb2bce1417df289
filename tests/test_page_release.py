"""A pair larger than memory lets the bytes it found equal go of the page cache
(sessions.compare.page_release): past a share of memory a side, in the order the comparison
takes its answers, in whole blocks, never the bytes of a check that differs. Pages are looked at
in the real page cache, with mincore(2) on a mapping of the file."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture, stored_span
from sessions.capture.writer import CaptureWriter
from sessions.compare import comparison, page_release, pair_reader
from sessions.compare.aligned_pairs import AlignedPair
from sessions.compare.byte_checks import STRETCH_BYTES, ByteChecks
from sessions.compare.comparison import Comparison, iter_compare
from sessions.compare.document import dumps
from sessions.compare.key import OpKey
from sessions.compare.mapped_record import BatchRow, MappedRecord
from sessions.compare.options import CompareOptions
from sessions.compare.page_release import (
    KEEP_ALL,
    KEPT_SHARE_OF_MEMORY,
    RELEASE_ALIGN,
    PageRelease,
    kept_in_page_cache,
)
from sessions.compare.pair_reader import PairReader
from sessions.progress import run_to_end
from tests.test_compare import _many_small_records

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="the page cache takes advice on Linux")

MIB = 1024 * 1024
FAR = 40 * MIB
"""Where the scenarios that need it start: past about 40 MiB of a sequential read, Linux 6 caches
a file in 2 MiB blocks (large folios), which a drop covering part of one leaves whole; before
it, in pages, which every drop clears."""


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


def _pages(fd: int, size: int, start: int, end: int) -> list[bool]:
    """Residency of the pages of [start, end)."""
    return _resident_pages(fd, size)[start // mmap.PAGESIZE : end // mmap.PAGESIZE]


def _cached_pair(tmp_path: Path, size: int, differ_at: tuple[int, ...] = ()) -> tuple[Path, Path]:
    """Two files of `size` bytes, equal but at `differ_at`, on the disk and read whole into the page
    cache (`_read_into_page_cache`)."""
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    changed = data.copy()
    changed[list(differ_at)] ^= 1
    paths = (tmp_path / "n.bin", tmp_path / "o.bin")
    for path, content in zip(paths, (data, changed)):
        path.write_bytes(content.tobytes())
        _read_into_page_cache(path)
    return paths


def _read_into_page_cache(path: Path) -> None:
    """The whole file in the page cache, from the disk; skipped where the file system keeps its
    pages whatever it is told (tmpfs) or caches them elsewhere (ZFS)."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        os.fsync(file.fileno())
        os.posix_fadvise(file.fileno(), 0, size, os.POSIX_FADV_DONTNEED)
        if any(_resident_pages(file.fileno(), size)):
            pytest.skip("this file system keeps its pages in memory whatever it is told")
        file.read()
        if not all(_resident_pages(file.fileno(), size)):
            pytest.skip("this file system caches its files outside the page cache")


def test_a_pair_that_fits_in_memory_keeps_every_byte_and_one_that_does_not_keeps_a_share_of_memory_a_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "n.bin").write_bytes(b"n" * 3000)
    (tmp_path / "o.bin").write_bytes(b"o" * 3000)
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "o.bin", "rb") as b, open(tmp_path / "n.bin", "rb") as again:
        monkeypatch.setattr(page_release, "available_memory", lambda: 6000)
        assert kept_in_page_cache(a.fileno(), b.fileno()) == (KEEP_ALL, KEEP_ALL)
        assert kept_in_page_cache(a.fileno(), again.fileno()) == (KEEP_ALL, KEEP_ALL)
        monkeypatch.setattr(page_release, "available_memory", lambda: 5999)
        assert kept_in_page_cache(a.fileno(), b.fileno()) == (5999 // KEPT_SHARE_OF_MEMORY, 5999 // KEPT_SHARE_OF_MEMORY)
        monkeypatch.setattr(page_release, "available_memory", lambda: 3000)
        assert kept_in_page_cache(a.fileno(), again.fileno()) == (KEEP_ALL, KEEP_ALL), "a capture compared with itself is cached once"
        assert kept_in_page_cache(a.fileno(), b.fileno()) == (750, 750)
        assert kept_in_page_cache(None, b.fileno()) == (KEEP_ALL, KEEP_ALL), "a capture read without a descriptor"


def test_bytes_that_follow_one_another_are_let_go_in_whole_blocks_as_they_come(tmp_path: Path) -> None:
    """Let go check by check, half of a real pair's pages past the share kept stayed, in alternate
    blocks. (What is held past the last whole block is let go on `close`, or when bytes that do
    not follow it come: part of a block, which a system caching in large blocks keeps either way.)"""
    size = FAR + 4 * RELEASE_ALIGN
    native, oracle = _cached_pair(tmp_path, size)
    with open(native, "rb") as a, open(oracle, "rb") as b:
        release = PageRelease((0, FAR + RELEASE_ALIGN))
        release.add((a.fileno(), FAR + 100, RELEASE_ALIGN + 5), (b.fileno(), FAR + 100, RELEASE_ALIGN + 5))
        second = 2 * RELEASE_ALIGN - 98
        release.add((a.fileno(), FAR + RELEASE_ALIGN + 105, second), (b.fileno(), FAR + RELEASE_ALIGN + 105, second))
        native_pages = _pages(a.fileno(), size, FAR, size)
        oracle_pages = _pages(b.fileno(), size, FAR, size)
        release.close()
    block = RELEASE_ALIGN // mmap.PAGESIZE
    assert not any(native_pages[block : 3 * block]), "let go up to the last whole block"
    assert all(native_pages[3 * block :]), "held: the next check may go on from there"
    assert all(oracle_pages[:block]), "kept: the share of memory this side keeps"
    assert not any(oracle_pages[block : 3 * block])


@pytest.mark.parametrize("threads", [1, 2])
def test_bytes_found_equal_are_let_go_past_the_kept_offset_and_bytes_that_differ_are_kept(tmp_path: Path, threads: int) -> None:
    size = 4 * STRETCH_BYTES
    native, oracle = _cached_pair(tmp_path, size, differ_at=(3 * STRETCH_BYTES + 7,))
    with open(native, "rb") as a, open(oracle, "rb") as b, ByteChecks(threads, (RELEASE_ALIGN, RELEASE_ALIGN)) as checks:
        n, o = a.fileno(), b.fileno()
        assert checks.equal((n, 0), (o, 0), STRETCH_BYTES), "before the kept offset, then past it"
        assert list(checks.ahead([((n, STRETCH_BYTES), (o, STRETCH_BYTES), STRETCH_BYTES), ((n, 3 * STRETCH_BYTES), (o, 3 * STRETCH_BYTES), STRETCH_BYTES)])) == [True, False]
        for fd in (n, o):
            assert all(_pages(fd, size, 0, RELEASE_ALIGN)), "kept: the share of memory a side keeps"
            assert not any(_pages(fd, size, RELEASE_ALIGN, 2 * STRETCH_BYTES)), "found equal: let go"
            assert all(_pages(fd, size, 2 * STRETCH_BYTES, size)), "never asked about, and a check that differs"


def test_a_long_record_that_differs_in_its_last_stretch_keeps_every_byte_as_it_is_read_again(tmp_path: Path) -> None:
    """Its stretches are shared out between the threads; those found equal are its bytes too."""
    size = 3 * STRETCH_BYTES
    native, oracle = _cached_pair(tmp_path, size, differ_at=(size - 1,))
    with open(native, "rb") as a, open(oracle, "rb") as b, ByteChecks(2, (0, 0)) as checks:
        assert not checks.equal((a.fileno(), 0), (b.fileno(), 0), size)
        assert all(_resident_pages(a.fileno(), size)) and all(_resident_pages(b.fileno(), size))
        assert checks.equal((a.fileno(), 0), (b.fileno(), 0), 2 * STRETCH_BYTES), "all equal: let go"
        assert not any(_pages(a.fileno(), size, 0, 2 * STRETCH_BYTES))


def test_answers_let_go_in_the_order_they_are_taken_with_checks_made_between_them(tmp_path: Path) -> None:
    """A comparison takes a run's answer, checks a larger record itself, then takes the next run's
    (sessions.compare.pair_compare). Both runs' answers came in one batch, and were let go as the
    batch was taken, before the record between them: the block it shares with the first run was
    then never let go whole."""
    size = FAR + 8 * MIB
    native, oracle = _cached_pair(tmp_path, size)
    with open(native, "rb") as a, open(oracle, "rb") as b, ByteChecks(2, (0, 0)) as checks:
        n, o = a.fileno(), b.fileno()
        runs = checks.ahead([((n, FAR), (o, FAR), 3 * MIB), ((n, FAR + 4 * MIB), (o, FAR + 4 * MIB), 2 * MIB)])
        assert next(runs)
        assert checks.equal((n, FAR + 3 * MIB), (o, FAR + 3 * MIB), MIB)
        assert next(runs)
        assert not any(_pages(n, size, FAR, FAR + 6 * MIB)) and not any(_pages(o, size, FAR, FAR + 6 * MIB))
        assert all(_pages(n, size, FAR + 6 * MIB, size))


@pytest.mark.parametrize("flip_at", [-1, 30])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_comparison_that_lets_its_bytes_go_of_the_page_cache_says_what_one_keeping_them_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flip_at: int, threads: int
) -> None:
    """As if this pair were larger than memory, every byte found equal is let go, and a run that
    differs is read again pair by pair."""
    native, oracle = _many_small_records(tmp_path, flip_at=flip_at)
    monkeypatch.setattr(comparison, "check_threads", lambda options: threads)
    with open_capture(native) as n, open_capture(oracle) as o:
        kept = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        monkeypatch.setattr(page_release, "available_memory", lambda: 0)
        assert kept_in_page_cache(n.descriptor, o.descriptor) == (0, 0)
        let_go = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    assert let_go.verdict == kept.verdict
    assert [p.metrics for p in let_go.pairs] == [p.metrics for p in kept.pairs]
    assert let_go.verdict.word == ("PARITY" if flip_at == -1 else "DIVERGENCE")


def _diverged_captures(tmp_path: Path, records: int = 6) -> tuple[Path, Path]:
    """A pair of `records` records of 2.2 MB, a few ULP apart in most elements of every one, as a
    run whose first error reaches every later op; in the page cache. Each record is longer than a
    2 MiB block, so none lies wholly inside one that a system caching in large blocks keeps."""
    rows = bf16_bits(np.random.default_rng(8).standard_normal((1100, 1024)))
    paths = []
    for role in ("native", "oracle"):
        path = tmp_path / f"{role}.h5"
        with CaptureWriter(path, CaptureMeta(role=role, engine_name=f"hand-{role}", weights_hash="sha256:aa")) as writer:
            for layer in range(records):
                bits = rows ^ np.random.default_rng(layer).integers(0, 4, size=rows.shape, dtype=np.uint16) if role == "native" else rows
                writer.add_tensor("layer_out", bits, step=0, segment="decode", layer=layer, dtype="bfloat16")
            writer.end_step()
        paths.append(path)
    for path in paths:
        _read_into_page_cache(path)
    return paths[0], paths[1]


def _records_resident(capture: Capture) -> list[bool]:
    """Whether each record's stored bytes are all in the page cache."""
    assert capture.descriptor is not None
    size = os.fstat(capture.descriptor).st_size
    pages = _resident_pages(capture.descriptor, size)
    spans = [stored_span(capture, record) for record in capture.records]
    assert all(span is not None for span in spans)
    return [all(pages[at // mmap.PAGESIZE : -(-(at + nbytes) // mmap.PAGESIZE)]) for at, nbytes in spans]  # type: ignore[misc]


def _cached_pages_within(capture: Capture) -> list[int]:
    """How many pages lying wholly inside each record are in the page cache: a record let go
    whole has none, where one let go in part and then read again still has some."""
    assert capture.descriptor is not None
    pages = _resident_pages(capture.descriptor, os.fstat(capture.descriptor).st_size)
    spans = [stored_span(capture, record) for record in capture.records]
    assert all(span is not None for span in spans)
    return [sum(pages[-(-at // mmap.PAGESIZE) : (at + nbytes) // mmap.PAGESIZE]) for at, nbytes in spans]  # type: ignore[misc]


def _kept_then_let_go(native: Path, oracle: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Comparison, Comparison]:
    """The pair compared as one that fits in memory, every record of it then still in the page
    cache; and as one that does not, none of them then left there."""
    with open_capture(native) as n, open_capture(oracle) as o:
        kept = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        assert all(_records_resident(n)) and all(_records_resident(o)), "a pair that fits keeps every byte"
        monkeypatch.setattr(page_release, "available_memory", lambda: 0)
        let_go = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        assert not any(_records_resident(n)) and not any(_records_resident(o))
    return kept, let_go


@pytest.mark.parametrize("threads", [1, 2])
def test_records_compared_element_by_element_are_let_go_once_compared_and_kept_when_the_pair_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A diverged run larger than memory has no byte found equal: kept whole, it made the kernel
    reclaim a page for every page read, as an identical one did before its bytes were let go."""
    monkeypatch.setattr(comparison, "check_threads", lambda options: threads)
    kept, let_go = _kept_then_let_go(*_diverged_captures(tmp_path), monkeypatch)
    assert kept.verdict.word == let_go.verdict.word == "DIVERGENCE"
    assert sum(p.metrics.differing > 0 for p in let_go.pairs) == 6
    assert [p.metrics for p in let_go.pairs] == [p.metrics for p in kept.pairs]


def test_each_pair_is_told_whether_it_is_the_last_to_read_its_records(tmp_path: Path) -> None:
    native, oracle = _diverged_captures(tmp_path, records=3)
    key = OpKey(0, "decode", 0, "layer_out")
    with open_capture(native) as n, open_capture(oracle) as o:

        def pair(native_record: int, oracle_record: int) -> AlignedPair:
            return AlignedPair(key, *(MappedRecord(c.records[r], key, None, (1100, 1024)) for c, r in ((n, native_record), (o, oracle_record))))

        pairs = [pair(0, 1), pair(1, 1), pair(0, 2), pair(2, 1)]
        assert pair_reader.last_reads(pair_reader.record_seqs(pairs)) == [(False, False), (True, False), (True, True), (True, True)]
        assert pair_reader.last_reads(pair_reader.record_seqs([])) == []


def test_a_record_read_by_several_pairs_goes_with_the_last_of_them_and_a_batched_record_whole(tmp_path: Path) -> None:
    """A window of positions is part of its record, whose other rows later pairs read: it goes
    with the last pair that reads it. A batched run's record holds one request, which its pair
    reads, so it goes whole; a side read whole goes whatever the other side is."""
    native, oracle = _diverged_captures(tmp_path, records=4)
    key = OpKey(0, "decode", 0, "layer_out")
    with open_capture(native) as n, open_capture(oracle) as o:
        with ByteChecks(1, (0, 0)) as checks, PairReader(n, o, checks) as reader:
            for record, windows, batch, last in (
                (0, ((0, 16), (0, 16)), None, (False, False)),
                (1, (None, None), BatchRow(1, 0), (True, True)),
                (2, ((0, 16), None), None, (False, True)),
                (3, ((16, 32), (0, 16)), None, (True, True)),
            ):
                sides = (MappedRecord(c.records[record], key, None, (1100, 1024), window, batch) for c, window in zip((n, o), windows))
                reader.done_with(AlignedPair(key, *sides), last)
        assert _records_resident(n) == [True, False, True, False]
        assert _records_resident(o) == [True, False, False, False]


def _cut_differently(tmp_path: Path) -> tuple[Path, Path]:
    """Two layers of a 2,200-position prefill, the native's one call, the oracle's two calls of
    1,100 positions (each record 2.25 MB, past a 2 MiB block), a bit apart in one row of each
    layer; in the page cache. Paired by position, each native record is read in two windows."""
    rows = bf16_bits(np.random.default_rng(10).standard_normal((2200, 512)))
    flipped = rows.copy()
    flipped[1500, 7] ^= 1
    native = [T("layer_out", flipped, layer=layer, dtype="bfloat16", position=0) for layer in range(2)]
    oracle = [T("layer_out", rows[start : start + 1100], segment=segment, layer=layer, dtype="bfloat16", position=start) for start, segment in ((0, "a"), (1100, "b")) for layer in range(2)]
    paths = write_capture(tmp_path / "native.h5", "native", native), write_capture(tmp_path / "oracle.h5", "oracle", oracle)
    for path in paths:
        _read_into_page_cache(path)
    return paths


def test_a_run_cut_differently_lets_each_record_go_once_its_last_window_is_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real prefill cut differently is most of a run's bytes, each record read in windows by
    several pairs: let go with the first, it was read back from the disk by the next; never let
    go, it was kept whole in a pair larger than memory."""
    native, oracle = _cut_differently(tmp_path)
    kept, let_go = _kept_then_let_go(native, oracle, monkeypatch)
    with open_capture(native) as n, open_capture(oracle) as o:
        assert _cached_pages_within(n) == [0, 0] and _cached_pages_within(o) == [0, 0, 0, 0]
    assert [p.native_window for p in let_go.pairs] == [(0, 1100), (1100, 2200)] * 2
    assert [p.metrics.differing for p in let_go.pairs] == [0, 1, 0, 1]
    assert dumps(let_go) == dumps(kept)


def test_a_pair_is_let_go_only_after_its_metrics_are_finished_which_read_its_oracle_rows_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long pair whose first chunks are equal sums their oracle squares only once a later chunk
    differs, as its metrics are finished: let go before, those rows came back from the disk."""
    equal = bf16_bits(np.random.default_rng(9).standard_normal((64, 1024)))
    differs = equal.copy()
    differs[-1, -1] ^= 1
    native, oracle = write_capture(tmp_path / "n.h5", "native", [T("layer_out", differs, layer=0, dtype="bfloat16")]), write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", equal, layer=0, dtype="bfloat16")])
    events: list[str] = []
    rows, done_with = pair_reader._Side.rows, PairReader.done_with
    monkeypatch.setattr(pair_reader._Side, "rows", lambda side, span: events.append(f"{side.capture.meta.role} rows {span}") or rows(side, span))
    monkeypatch.setattr(PairReader, "done_with", lambda reader, pair, last: events.append("let go") or done_with(reader, pair, last))
    monkeypatch.setattr(page_release, "available_memory", lambda: 0)
    with open_capture(native) as n, open_capture(oracle) as o:
        compared = run_to_end(iter_compare(n, o, CompareOptions(workers=1, chunk_bytes=32 * 1024)))
    assert compared.pairs[0].metrics.differing == 1
    assert events.count("oracle rows (0, 16)") == 2, "read, then read again for its squares"
    assert events[-1] == "let go"
