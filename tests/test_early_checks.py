"""Stored bytes checked before the records are paired (sessions.compare.early_checks): only where
both captures lay out the same records alike, in a process of their own, and an answer is used
only for bytes the checked stretches cover, all found equal."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sessions.capture.opening import open_capture
from sessions.compare import byte_checks, comparison, early_checks
from sessions.compare.byte_checks import (
    EARLY_READER,
    STRETCH_BYTES,
    ByteChecks,
    KnownStretches,
    early_threads,
)
from sessions.compare.comparison import iter_compare
from sessions.compare.early_checks import early_stretches
from sessions.compare.options import CompareOptions
from sessions.progress import run_to_end
from tests.test_compare import _many_small_records

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="child processes are found through /proc")


@pytest.fixture(autouse=True)
def early_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """These captures are kilobytes: a comparison checks them early only when told that is worth it."""
    monkeypatch.setattr(byte_checks, "EARLY_MIN_BYTES", 1)
    monkeypatch.setattr(early_checks, "EARLY_MIN_REGION_BYTES", 1)


def _early_readers() -> list[int]:
    """This process's children that run the early reader."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if EARLY_READER.encode() in command:
                found.append(int(pid))
    return found


def _settled(known: KnownStretches, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while known.settled < len(known.equal) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_check_is_answered_only_where_equal_stretches_cover_it_at_the_same_place_on_both_sides() -> None:
    known = KnownStretches(3, 4, [(100, 1000, 3 * STRETCH_BYTES)])
    known.equal[:] = [True, True, False]
    assert known.covers((3, 100), (4, 1000), 2 * STRETCH_BYTES), "the first two stretches, equal"
    assert known.covers((3, 100 + 5), (4, 1000 + 5), STRETCH_BYTES), "inside them, across their border"
    assert not known.covers((3, 100 + STRETCH_BYTES), (4, 1000 + STRETCH_BYTES), STRETCH_BYTES + 1), "reaches the third, which differs"
    assert not known.covers((3, 100), (4, 1001), 10), "not the same place in the region on both sides"
    assert not known.covers((3, 99), (4, 999), 10), "starts before the region"
    assert not known.covers((3, 100), (5, 1000), 10), "another file"
    assert not known.covers((3, 100 + 3 * STRETCH_BYTES - 1), (4, 1000 + 3 * STRETCH_BYTES - 1), 2), "runs past the region's end"


def test_captures_laid_out_alike_are_one_region_per_stretch_of_back_to_back_records_and_captures_of_other_records_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 0's records, then steps 1 and 2's, whose packs follow one another in the file (their
    step groups were made together, as the first of block 1)."""
    native, oracle = _many_small_records(tmp_path, flip_at=30)
    with open_capture(native) as n, open_capture(oracle) as o:
        known = early_stretches(n, o, None)
        ends = [int(n.packed_addresses[seq]) + int(n.columns["nbytes"][seq]) for seq in (21, 65)]
        assert known.regions == [(int(n.packed_addresses[first]), int(o.packed_addresses[first]), end - int(n.packed_addresses[first])) for first, end in zip((0, 22), ends)]
        assert early_stretches(n, o, 1).regions == known.regions[:1], "a step budget of one step checks one step's bytes early"
        assert [region[2] for region in early_stretches(n, o, None, limit=3000).regions] == [2816, 184], "no more than the limit"
        assert early_stretches(n, n, None).regions != [], "a capture with itself"
        monkeypatch.setattr(early_checks, "EARLY_MIN_REGION_BYTES", 5633)
        assert early_stretches(n, o, None).regions == [], "regions too short to be worth a line each"
    other = tmp_path / "other"
    other.mkdir()
    _, renamed = _many_small_records(other, flip_at=-1)
    with open_capture(native) as n, h5_renamed(renamed) as o:
        assert early_stretches(n, o, None).regions == [], "no row holds the same record on both sides"


@pytest.mark.parametrize(
    "change",
    [
        {"step": 3},
        {"segment": b"prefill"},
        {"layer": 5},
        {"name": b"ffn_out"},
        {"name": b"ffn_act", "occurrence": 1},
        {"dtype": b"float16"},
        {"shape": [8, 8, 0, 0, 0, 0, 0, 0]},
        {"ndim": 3, "shape": [4, 16, 1, 0, 0, 0, 0, 0]},
    ],
    ids=lambda change: "+".join(change),
)
def test_the_last_row_whose_record_differs_in_one_field_is_the_one_row_not_alike(tmp_path: Path, change: dict[str, object]) -> None:
    """The fields that say which record a row holds, one by one (the rank with its shape, the
    occurrence with a name it repeats); when a record was made leaves its row alike."""
    import h5py

    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    with h5py.File(oracle, "r+") as file:
        index = file["index"][()]
        for field, value in change.items():
            index[-1][field] = value
        index[0]["t_end_ns"] += 1000
        file["index"][...] = index
    with open_capture(native) as n, open_capture(oracle) as o:
        assert np.flatnonzero(~early_checks.alike_rows(n, o, None)).tolist() == [len(n.index) - 1]


class h5_renamed:
    """A capture whose records are all renamed (another engine's names), opened."""

    def __init__(self, path: Path) -> None:
        import h5py

        with h5py.File(path, "r+") as file:
            index = file["index"][()]
            index["name"] = np.char.add(b"blk.", index["name"])
            file["index"][...] = index
        self.capture = open_capture(path)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self.capture

    def __exit__(self, *_: object) -> None:
        self.capture.close()


def test_the_early_process_finds_each_stretch_equal_or_not_and_is_gone_once_the_checks_close(tmp_path: Path) -> None:
    size = 3 * STRETCH_BYTES + 1000
    data = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8).tobytes()
    changed = bytearray(data)
    changed[STRETCH_BYTES + 7] ^= 0x40
    (tmp_path / "n.bin").write_bytes(data)
    (tmp_path / "o.bin").write_bytes(bytes(changed))
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "o.bin", "rb") as b:
        known = KnownStretches(a.fileno(), b.fileno(), [(0, 0, size)])
        with ByteChecks(2) as checks:
            checks.check_early(known)
            _settled(known)
            assert known.equal == [True, False, True, True], "the second stretch holds the difference"
            assert checks.equal((a.fileno(), 0), (b.fileno(), 0), STRETCH_BYTES), "answered from the first stretch"
            assert not checks.equal((a.fileno(), 0), (b.fileno(), 0), 2 * STRETCH_BYTES), "checked again: the second differs"
        assert _early_readers() == []


def test_ending_the_early_process_keeps_its_answers_and_leaves_the_rest_to_be_checked_when_asked(tmp_path: Path) -> None:
    size = 2 * STRETCH_BYTES
    data = np.random.default_rng(4).integers(0, 256, size, dtype=np.uint8).tobytes()
    changed = bytearray(data)
    changed[STRETCH_BYTES + 3] ^= 2
    (tmp_path / "n.bin").write_bytes(data)
    (tmp_path / "o.bin").write_bytes(bytes(changed))
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "o.bin", "rb") as b, ByteChecks(2) as checks:
        known = KnownStretches(a.fileno(), b.fileno(), [(0, 0, size)])
        checks.check_early(known)
        _settled(known)
        checks.end_early()
        assert _early_readers() == []
        assert known.equal == [True, False] and checks.known is known, "the answers given stay"
        assert checks.equal((a.fileno(), 0), (b.fileno(), 0), STRETCH_BYTES)
        assert not checks.equal((a.fileno(), 0), (b.fileno(), 0), size), "checked by the comparison's own threads"
        checks.end_early()


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.2])
def test_ending_the_early_process_while_it_answers_keeps_what_it_said_and_raises_nothing_in_its_reader(tmp_path: Path, after_s: float) -> None:
    """Ended as the comparison begins, the process is often still answering: its pipe was closed
    before the thread reading it had stopped, whose next read then failed in the thread."""
    regions = [(at * 8192, at * 8192, 4096) for at in range(2000)]
    data = np.random.default_rng(5).integers(0, 256, 2000 * 8192, dtype=np.uint8).tobytes()
    changed = bytearray(data)
    changed[7 * 8192 + 5] ^= 1
    (tmp_path / "n.bin").write_bytes(data)
    (tmp_path / "o.bin").write_bytes(bytes(changed))
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "o.bin", "rb") as b, ByteChecks(2) as checks:
        known = KnownStretches(a.fileno(), b.fileno(), regions)
        checks.check_early(known)
        time.sleep(after_s)
        checks.end_early()
        assert _early_readers() == []
        settled = known.settled
        assert known.equal[:settled] == [at != 7 for at in range(settled)], "each answer given is the right one"
        assert not any(known.equal[settled:]), "nothing unanswered is taken for equal"
        assert not checks.equal((a.fileno(), 7 * 8192), (b.fileno(), 7 * 8192), 4096)
        assert checks.equal((a.fileno(), 1999 * 8192), (b.fileno(), 1999 * 8192), 4096)


def test_ending_an_early_process_still_answering_lets_the_thread_reading_it_take_what_it_said_and_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`yes` stands in for an early process that answers faster than it can be read, and more
    than it was asked: its pipe was closed while the thread reading it still read, which then
    failed in the thread (an unhandled thread exception is an error here), and an answer past the
    last stretch failed there too."""
    monkeypatch.setattr(byte_checks, "module_command", lambda *_: ["yes", "1"])
    (tmp_path / "n.bin").write_bytes(b"n")
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "n.bin", "rb") as b:
        for _ in range(10):
            with ByteChecks(2) as checks:
                known = KnownStretches(a.fileno(), b.fileno(), [(at, at, 1) for at in range(200_000)])
                checks.check_early(known)
                deadline = time.monotonic() + 20
                while known.settled == 0 and time.monotonic() < deadline:  # answering: on a busy machine `yes` takes a while to start
                    time.sleep(0.001)
                checks.end_early()
                assert 0 < known.settled <= len(known.equal)
                assert known.equal[: known.settled] == [at % 2 == 0 for at in range(known.settled)], "'1', newline, '1', ...: every answer read is kept"


def test_the_early_process_reads_on_several_threads_where_there_are_cores_and_answers_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On one thread, 16 cores left a 240,000-record comparison waiting 1.2 s for the early
    process after its pairing ended. On four, the answers still come stretch by stretch, in order."""
    size = 12 * STRETCH_BYTES
    data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
    changed = bytearray(data)
    for stretch in (2, 7, 11):
        changed[stretch * STRETCH_BYTES + 99] ^= 1
    (tmp_path / "n.bin").write_bytes(data)
    (tmp_path / "o.bin").write_bytes(bytes(changed))
    assert [early_threads(threads) for threads in (1, 2, 3, 16)] == [1, 1, 2, 4]
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(command: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(command)
        return real_popen(command, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(byte_checks.subprocess, "Popen", popen)
    with open(tmp_path / "n.bin", "rb") as a, open(tmp_path / "o.bin", "rb") as b:
        known = KnownStretches(a.fileno(), b.fileno(), [(0, 0, size)])
        with ByteChecks(16) as checks:
            checks.check_early(known)
            _settled(known)
    assert [command[-1] for command in started] == ["4"]
    assert known.equal == [stretch not in (2, 7, 11) for stretch in range(12)]


def test_one_thread_asked_for_or_too_few_bytes_start_no_early_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    with open_capture(native) as n, open_capture(oracle) as o:
        with ByteChecks(1) as checks:
            checks.check_early(early_stretches(n, o, None))
            assert _early_readers() == [] and checks.known.regions == []
        monkeypatch.setattr(byte_checks, "EARLY_MIN_BYTES", 3 * 2816 + 1)
        with ByteChecks(2) as checks:
            checks.check_early(early_stretches(n, o, None))
            assert _early_readers() == [] and checks.known.regions == [], "three steps of 2,816 bytes are not worth a process"


@pytest.mark.parametrize("flip_at", [-1, 30])
def test_a_comparison_with_bytes_checked_early_says_what_one_without_them_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flip_at: int) -> None:
    """The flipped bit lies inside an early region: that stretch differs, so the pair is compared
    as a pair and named, element and all."""
    native, oracle = _many_small_records(tmp_path, flip_at=flip_at)
    started: list[KnownStretches] = []
    real = ByteChecks.check_early

    def recorded(checks: ByteChecks, known: KnownStretches) -> None:
        real(checks, known)
        if checks.known is known:
            started.append(known)
            _settled(known)

    with open_capture(native) as n, open_capture(oracle) as o:
        monkeypatch.setattr(comparison, "check_threads", lambda options: 2)
        monkeypatch.setattr(ByteChecks, "check_early", recorded)
        early = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
        monkeypatch.setattr(comparison, "check_threads", lambda options: 1)
        plain = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    assert len(started) == 1, "one thread asked for: no early checks"
    assert started[0].equal == [flip_at == -1 or region != 1 for region in range(2)], "the region holding the flip (steps 1 and 2) differs"
    assert early.verdict == plain.verdict
    assert [p.metrics for p in early.pairs] == [p.metrics for p in plain.pairs]
    assert early.verdict.word == ("PARITY" if flip_at == -1 else "DIVERGENCE")


def test_a_comparison_closed_while_its_bytes_are_checked_early_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    monkeypatch.setattr(comparison, "check_threads", lambda options: 2)
    with open_capture(native) as n, open_capture(oracle) as o:
        work = iter_compare(n, o, CompareOptions(workers=1))
        next(work)
        next(work)
        assert _early_readers(), "the early reader runs while the records are paired"
        work.close()
        assert _early_readers() == []


def test_the_early_process_ends_once_the_records_are_paired_and_the_comparison_checks_the_rest_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside the comparison's own threads the early process read the same bytes again: a warm
    pair of a few large records, paired at once, was read twice over."""
    native, oracle = _many_small_records(tmp_path, flip_at=30)
    monkeypatch.setattr(comparison, "check_threads", lambda options: 2)
    with open_capture(native) as n, open_capture(oracle) as o:
        work = iter_compare(n, o, CompareOptions(workers=1))
        assert next(work).label == "aligning records"
        assert next(work).label.startswith("execution state checked") and _early_readers(), "the early reader runs while the records are paired"
        next(work)
        assert _early_readers() == [], "gone once pairs are compared, before the comparison ends"
        compared = run_to_end(work)
    assert [p.key.text() for p in compared.pairs if not p.metrics.bit_exact] == ["1:decode:0:ffn_up"]


def test_without_a_process_to_check_early_the_comparison_checks_when_it_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The early checks only save time: an interpreter that cannot be started costs none of the answers."""
    native, oracle = _many_small_records(tmp_path, flip_at=30)
    monkeypatch.setattr(comparison, "check_threads", lambda options: 2)
    with open_capture(native) as n, open_capture(oracle) as o:
        with ByteChecks(2) as checks:
            monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
            checks.check_early(early_stretches(n, o, None))
            assert checks.known.regions == [] and _early_readers() == []
        compared = run_to_end(iter_compare(n, o, CompareOptions(workers=1)))
    assert [p.key.text() for p in compared.pairs if not p.metrics.bit_exact] == ["1:decode:0:ffn_up"]


def test_without_a_temporary_folder_to_hand_the_stretches_over_the_checks_are_made_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "no-such-folder"))
    with open_capture(native) as n, open_capture(oracle) as o, ByteChecks(2) as checks:
        checks.check_early(early_stretches(n, o, None))
        assert checks.known.regions == [] and _early_readers() == []


def test_a_capture_open_as_a_standard_descriptor_is_not_handed_to_the_early_process(tmp_path: Path) -> None:
    """Descriptor 0 would be the child's stdin, its list of stretches: the answers would be lost."""
    data = tmp_path / "n.bin"
    data.write_bytes(bytes(2 * STRETCH_BYTES))
    with open(data, "rb") as a, ByteChecks(2) as checks:
        checks.check_early(KnownStretches(0, a.fileno(), [(0, 0, 2 * STRETCH_BYTES)]))
        assert checks.known.regions == [] and _early_readers() == []


def test_no_thread_to_read_the_answers_ends_the_early_process_and_leaves_the_checks_to_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    native, oracle = _many_small_records(tmp_path, flip_at=-1)
    monkeypatch.setattr(byte_checks.threading, "Thread", NoThread)
    with open_capture(native) as n, open_capture(oracle) as o:
        with ByteChecks(2) as checks:
            checks.check_early(early_stretches(n, o, None))
            assert checks.known.regions == [] and _early_readers() == []
            spot = (n.descriptor, 0)
            assert checks.equal(spot, spot, 64)


def test_a_child_runs_the_projects_module_whatever_folder_it_is_started_in(tmp_path: Path) -> None:
    """A `sessions` package where the user stands must not stand in for the project's own."""
    from sessions.child_env import child_env, module_command

    fake = tmp_path / "sessions" / "compare"
    fake.mkdir(parents=True)
    (tmp_path / "sessions" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "early_reader.py").write_text("print('not the project')\n")
    done = subprocess.run(module_command(EARLY_READER, "3", "4", "1"), cwd=tmp_path, env=child_env(), input=b"", capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout == b"", done.stdout
