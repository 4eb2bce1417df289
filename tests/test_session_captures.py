"""A session's captures: moved ones are found or reported, changed ones are flagged before any data is shown."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from sessions.capture.identity import identity_of_file
from sessions.capture.meta import CaptureMeta
from sessions.capture.reader import CaptureError
from sessions.capture.writer import CaptureWriter
from sessions.compare.key import OpKey
from sessions.investigation.capture_gate import (
    CaptureIdentityError,
    CaptureState,
    accept_changed_capture,
    check_capture,
    check_captures,
    check_captures_progress,
    locate_capture,
    open_session_capture,
)
from sessions.investigation.model import Investigation
from sessions.investigation.store import SessionDocument
from sessions.progress import Progress


def write_capture(path: Path, role: str, seed: int) -> Path:
    """A two-layer capture whose values (and so whose index timings) depend on `seed`."""
    rng = np.random.default_rng(seed)
    with CaptureWriter(path, CaptureMeta(role=role, engine_name=f"{role}-engine", seed=seed)) as writer:
        for layer in range(2):
            writer.add_tensor(f"attn_norm-{layer}", rng.standard_normal((4, 8)).astype(np.float32), step=0, segment="prefill", layer=layer)
            writer.add_tensor(f"kqv_out-{layer}", rng.standard_normal((4, 8)).astype(np.float32), step=0, segment="prefill", layer=layer)
        writer.end_step()
    return path


@pytest.fixture
def investigation(tmp_path: Path) -> tuple[SessionDocument, Path]:
    """A saved session in work/ with its native and oracle captures in work/captures/."""
    captures = tmp_path / "work" / "captures"
    captures.mkdir(parents=True)
    session = Investigation(title="moved and changed")
    for role, seed in (("native", 1), ("oracle", 2)):
        path = write_capture(captures / f"{role}.h5", role, seed)
        session.add_capture(role, path, identity_of_file(path))
    document = SessionDocument(session)
    document.save_as(tmp_path / "work" / "s.xray")
    return document, captures


def states(session: Investigation, session_dir: Path | None = None) -> list[CaptureState]:
    return [status.state for status in check_captures(session, session_dir)]


def test_identity_depends_on_content_not_on_modified_time(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "a.h5", "native", 1)
    first = identity_of_file(path)
    os.utime(path, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    touched = identity_of_file(path)
    again = identity_of_file(write_capture(tmp_path / "b.h5", "native", 1))

    assert touched.mtime_ns != first.mtime_ns and touched.same_content(first)
    assert len(first.sha256) == 64 and first.size == path.stat().st_size
    assert not again.same_content(first), "a second run differs (timings, creation time) even with equal values"


def test_unchanged_captures_check_ok_and_a_touched_one_says_only_its_time_changed(investigation) -> None:
    document, captures = investigation
    assert states(document.session) == [CaptureState.OK, CaptureState.OK]
    os.utime(captures / "oracle.h5")
    [_, oracle] = check_captures(document.session)
    assert oracle.usable and "root attributes and index identical, tensor bytes not hashed" in oracle.message


def test_checking_yields_progress_per_capture(investigation) -> None:
    document, _ = investigation
    work = check_captures_progress(document.session)
    steps = []
    with pytest.raises(StopIteration) as done:
        while True:
            steps.append(next(work))
    assert steps == [Progress(0, 2, "checking native.h5"), Progress(1, 2, "checking oracle.h5"), Progress(2, 2, "captures checked")]
    assert [s.state for s in done.value.value] == [CaptureState.OK, CaptureState.OK]


def test_a_capture_path_no_file_system_takes_is_unreadable_with_a_short_message_not_a_crash(tmp_path: Path) -> None:
    from dataclasses import replace

    native = write_capture(tmp_path / "native.h5", "native", 1)
    session = Investigation(title="from a colleague")
    session.add_capture("native", native, identity_of_file(native))
    ref = replace(session.capture("native"), path=tmp_path / ("x" * 100_000))
    status = check_capture(ref, tmp_path)
    assert status.state is CaptureState.UNREADABLE and "cannot be checked (File name too long)" in status.message
    assert len(status.message) < 300


def test_a_capture_named_by_a_part_of_its_file_is_unreadable_not_opened_whole(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "native.h5", "native", 1)
    session = Investigation(title="hand-edited")
    ref = session.add_capture("native", native, identity_of_file(native), location="/no/such/group")
    status = check_capture(ref, tmp_path)
    assert (status.state, status.message) == (
        CaptureState.UNREADABLE, f"{native}::/no/such/group: names a part of a file; this version opens whole captures only (location '/')"
    )


def test_a_moved_capture_is_reported_and_relinked_only_to_the_same_capture(investigation, tmp_path: Path) -> None:
    document, captures = investigation
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(captures / "native.h5", elsewhere / "renamed.h5")

    [native, oracle] = check_captures(document.session)

    assert native.state is CaptureState.MISSING and native.candidate is None
    assert str(captures / "native.h5") in native.message and "locate" in native.message
    assert oracle.usable

    wrong = locate_capture(document.session, "native", captures / "oracle.h5")
    assert wrong.state is CaptureState.CHANGED
    assert document.session.capture("native").path == captures / "native.h5"

    right = locate_capture(document.session, "native", elsewhere / "renamed.h5")
    assert right.usable
    assert document.session.capture("native").path == elsewhere / "renamed.h5"
    assert document.dirty
    assert states(document.session) == [CaptureState.OK, CaptureState.OK]


def test_a_session_folder_moved_whole_finds_its_captures_beside_it(investigation, tmp_path: Path) -> None:
    document, _ = investigation
    moved = tmp_path / "handed-over"
    shutil.move(tmp_path / "work", moved)
    reopened = SessionDocument.open(moved / "s.xray")

    statuses = check_captures(reopened.session, moved)

    assert [s.state for s in statuses] == [CaptureState.MISSING, CaptureState.MISSING]
    assert [s.candidate for s in statuses] == [moved / "captures" / "native.h5", moved / "captures" / "oracle.h5"]
    for status in statuses:
        assert status.candidate is not None
        assert locate_capture(reopened.session, status.capture_id, status.candidate).usable
    assert states(reopened.session) == [CaptureState.OK, CaptureState.OK]


def test_a_changed_capture_is_flagged_and_no_data_is_read_until_accepted(investigation) -> None:
    document, captures = investigation
    write_capture(captures / "oracle.h5", "oracle", 99)

    [native, oracle] = check_captures(document.session)

    assert native.usable
    assert oracle.state is CaptureState.CHANGED and not oracle.usable
    assert str(captures / "oracle.h5") in oracle.message and "hash" in oracle.message
    with pytest.raises(CaptureIdentityError) as refused:
        open_session_capture(document.session.capture("oracle"))
    assert refused.value.status.state is CaptureState.CHANGED

    accepted = accept_changed_capture(document.session, "oracle")
    assert accepted.usable
    with open_session_capture(document.session.capture("oracle")) as capture:
        record = capture.records[1]
        assert record.name == "kqv_out-0"
        expected = np.random.default_rng(99)
        expected.standard_normal((4, 8))
        assert np.array_equal(capture.read_values(record), expected.standard_normal((4, 8)).astype(np.float32))


def test_a_missing_or_unreadable_capture_is_refused_by_the_gate_with_its_name(investigation) -> None:
    document, captures = investigation
    (captures / "native.h5").write_bytes(b"not an HDF5 file")
    (captures / "oracle.h5").unlink()

    [native, oracle] = check_captures(document.session)

    assert native.state is CaptureState.UNREADABLE and str(captures / "native.h5") in native.message
    assert oracle.state is CaptureState.MISSING
    with pytest.raises(CaptureError, match="not a readable HDF5 file"):
        open_session_capture(document.session.capture("native"))
    with pytest.raises(CaptureIdentityError, match="missing"):
        open_session_capture(document.session.capture("oracle"))


def test_rerun_captures_are_checked_like_the_capture_set(investigation) -> None:
    document, captures = investigation
    rerun = write_capture(captures / "rerun.h5", "rerun", 5)
    document.session.add_rerun(rerun, identity_of_file(rerun), description="sdpa unchunked", op=OpKey(0, "prefill", 0, "sdpa"))
    write_capture(rerun, "rerun", 6)
    assert states(document.session) == [CaptureState.OK, CaptureState.OK, CaptureState.CHANGED]
