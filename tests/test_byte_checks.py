"""Stored bytes checked on threads ahead of the comparison (sessions.compare.byte_checks): the same
answers as one thread, in the order asked, and no thread left once the checks are closed."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from sessions.compare.byte_checks import PIECE_BYTES, STRETCH_BYTES, ByteChecks, Check


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
