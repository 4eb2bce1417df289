"""Autosave and crash recovery: a recovery file beside nothing of the user's, offered once, only for the dead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.compare.key import OpKey
from sessions.investigation.model import Investigation, SavedTolerance, ViewState
from sessions.investigation.recovery import (
    Autosaver,
    ProcessIdentity,
    claim_recovery_offers,
    process_start_token,
)
from sessions.investigation.store import SessionChangedError, SessionDocument

ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def saved_document(tmp_path: Path) -> SessionDocument:
    folder = tmp_path / "work"
    folder.mkdir(exist_ok=True)
    document = SessionDocument(Investigation(title="investigation"))
    document.save_as(folder / "user.xray")
    return document


def test_decisions_are_autosaved_at_once_the_selection_and_view_on_the_timer(tmp_path: Path) -> None:
    clock = FakeClock()
    document = saved_document(tmp_path)
    saver = Autosaver(document, tmp_path / "recovery", interval_s=30, clock=clock)

    mark = document.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "tiled reduction")
    assert saver.path.exists()
    document.session.set_note(mark.id, "tiled reduction, FP32")
    assert json.loads(saver.path.read_bytes())["document"]["session"]["bookmarks"][0]["note"] == "tiled reduction, FP32"
    document.session.set_tolerance(SavedTolerance(max_ulp=2))
    assert json.loads(saver.path.read_bytes())["document"]["session"]["tolerances"]["default"]["max_ulp"] == 2
    document.session.set_alignment_mode("positions")
    assert json.loads(saver.path.read_bytes())["document"]["session"]["alignment_mode"] == "positions"

    document.session.set_view(ViewState(slices=(3,)))
    clock.now += 29
    assert not saver.tick()
    assert json.loads(saver.path.read_bytes())["document"]["session"]["view"]["slices"] == []
    clock.now += 1
    assert saver.tick()
    assert json.loads(saver.path.read_bytes())["document"]["session"]["view"]["slices"] == [3]
    clock.now += 60
    assert not saver.tick(), "nothing changed since the last autosave"


def test_a_new_session_with_nothing_a_user_would_miss_leaves_nothing_to_recover(tmp_path: Path) -> None:
    """A window only opened on a pair and killed was offered back after the restart as
    "unsaved work (0 bookmark(s))": its view and selection are nothing the close question asks about."""
    clock = FakeClock()
    document = SessionDocument(Investigation())
    saver = Autosaver(document, tmp_path / "recovery", interval_s=30, clock=clock)
    document.session.set_view(ViewState(slices=(3,)))
    document.session.select_op(OpKey(0, "visual", 0, "sdpa"))
    clock.now += 60
    assert document.dirty and document.unsaved_work() == []
    assert not saver.tick() and not saver.path.exists()

    document.session.set_tolerance(SavedTolerance(max_ulp=2))
    document.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "tiled reduction")
    assert document.unsaved_work() == ["1 bookmark(s)", "tolerances"] and saver.path.exists()


def test_autosave_never_writes_the_users_file_and_stops_once_saved(tmp_path: Path) -> None:
    document = saved_document(tmp_path)
    user_file = document.path
    assert user_file is not None
    before = user_file.read_bytes()
    saver = Autosaver(document, tmp_path / "recovery", clock=FakeClock())

    document.session.add_bookmark(OpKey(1, "decode", 2, "o_proj"), "unsaved work")

    assert user_file.read_bytes() == before
    assert sorted(p.name for p in user_file.parent.iterdir()) == ["user.xray"]
    assert saver.path.parent == tmp_path / "recovery"
    assert json.loads(saver.path.read_bytes())["session_path"] == str(user_file)

    document.save()
    saver.tick()
    assert not saver.path.exists(), "a saved session has nothing to recover"
    document.session.set_title("edited again")
    assert saver.path.exists()
    saver.close()
    assert not saver.path.exists()


def test_an_autosave_that_cannot_write_reports_it_without_raising(tmp_path: Path) -> None:
    blocker = tmp_path / "recovery"
    blocker.write_text("a file where the folder should be")
    document = saved_document(tmp_path)
    saver = Autosaver(document, blocker, clock=FakeClock())
    document.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "kept in memory")
    assert saver.last_error is not None and str(saver.path) in saver.last_error
    assert document.session.bookmarks[0].note == "kept in memory"


CRASHING_APP = """
import sys, time
from pathlib import Path
from sessions.investigation.model import Investigation
from sessions.compare.key import OpKey
from sessions.investigation.recovery import Autosaver
from sessions.investigation.store import SessionChangedError, SessionDocument

document = SessionDocument(Investigation(title="crashed investigation"), Path(sys.argv[2]))
Autosaver(document, Path(sys.argv[1]))
document.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "written just before the crash")
print("autosaved", flush=True)
time.sleep(120)
"""


def test_a_killed_process_session_is_offered_exactly_once_and_a_live_ones_never(tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    user_file = tmp_path / "work" / "user.xray"
    app = subprocess.Popen(
        [sys.executable, "-c", CRASHING_APP, str(recovery), str(user_file)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert app.stdout is not None and app.stdout.readline() == "autosaved\n"
        assert claim_recovery_offers(recovery).offers == [], "its writer is still running"
    finally:
        app.send_signal(signal.SIGKILL)
        app.wait()
        app.stdout.close()
    live = saved_document(tmp_path)
    live_saver = Autosaver(live, recovery, clock=FakeClock())
    live.session.add_bookmark(OpKey(2, "decode", 1, "sdpa"), "this process is alive")
    assert live_saver.path.exists()

    scan = claim_recovery_offers(recovery)

    [offer] = scan.offers
    assert scan.notices == []
    assert offer.writer_pid == app.pid
    assert offer.session.title == "crashed investigation"
    assert offer.session.bookmarks[0].note == "written just before the crash"
    assert claim_recovery_offers(recovery).offers == [], "offered once, never again"

    restored = offer.restore()
    assert restored.path == user_file and restored.dirty
    restored_saver = Autosaver(restored, recovery, clock=FakeClock())
    assert restored_saver.flush()
    offer.discard()
    assert sorted(p.name for p in recovery.iterdir()) == sorted([live_saver.path.name, restored_saver.path.name])
    assert claim_recovery_offers(recovery).offers == []


def autosave_of_a_gone_writer(tmp_path: Path, recovery: Path, note: str) -> tuple[Autosaver, dict]:
    """A live autosaver's file in `recovery`, and its payload rewritten as a gone process's (a pid since reused)."""
    document = saved_document(tmp_path)
    saver = Autosaver(document, recovery, clock=FakeClock())
    document.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), note)
    payload = json.loads(saver.path.read_bytes())
    payload["writer"]["start"] = "an earlier process that had this pid"
    return saver, payload


def test_a_reused_pid_does_not_hide_a_dead_writer_and_another_hosts_file_is_left_alone(tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    saver, payload = autosave_of_a_gone_writer(tmp_path, recovery, "pid reused")
    reused = recovery / "autosave-reused.json"
    reused.write_text(json.dumps(payload))
    payload["writer"]["host"] = "another-machine"
    payload["writer"]["pid"] = 1
    (recovery / "autosave-elsewhere.json").write_text(json.dumps(payload))

    scan = claim_recovery_offers(recovery)

    assert [o.file.name for o in scan.offers] == ["autosave-reused.json.offered"]
    assert sorted(p.name for p in recovery.iterdir()) == sorted(
        ["autosave-elsewhere.json", "autosave-reused.json.offered", saver.path.name]
    )


def test_an_unreadable_recovery_file_is_set_aside_with_a_notice(tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    (recovery / "autosave-1-broken.json").write_text('{"format": "parity-xray-recov')
    scan = claim_recovery_offers(recovery)
    assert scan.offers == [] and "autosave-1-broken.json" in scan.notices[0]
    assert [p.name for p in recovery.iterdir()] == ["autosave-1-broken.json.unreadable"]
    assert claim_recovery_offers(recovery).notices == []


def test_a_fifo_named_like_a_recovery_file_is_set_aside_without_a_hang(tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    os.mkfifo(recovery / "autosave-1-fifo.json")  # no writer: a plain read would block the window's start for ever
    scan = claim_recovery_offers(recovery)
    assert scan.offers == [] and "not a regular file" in scan.notices[0]
    assert [p.name for p in recovery.iterdir()] == ["autosave-1-fifo.json.unreadable"]


def test_a_recovery_file_that_cannot_be_claimed_is_left_where_it_is_with_a_notice(tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    _, payload = autosave_of_a_gone_writer(tmp_path, recovery, "left by a gone process")
    stuck = recovery / f"autosave-1-{'x' * 236}.json"  # 252 bytes: with ".offered" past what a name may take
    stuck.write_text(json.dumps(payload))

    scan = claim_recovery_offers(recovery)

    assert scan.offers == []
    assert scan.notices == [f"recovery file {stuck} could not be claimed (File name too long); it is left where it is"]
    assert stuck.exists()


def test_process_identity_tells_this_process_from_a_gone_one() -> None:
    me = ProcessIdentity.current()
    assert not me.is_gone()
    assert process_start_token(os.getpid()) == me.start
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert process_start_token(child.pid) not in (None, me.start)
    child.kill()
    child.wait()
    assert process_start_token(child.pid) is None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombie state is read from /proc")
def test_a_dead_but_unreaped_writer_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert Path(f"/proc/{child.pid}/stat").exists(), "still a zombie"
    assert process_start_token(child.pid) is None
    child.wait()


def test_a_restored_session_saves_over_its_file_unless_another_program_changed_it_since(tmp_path: Path) -> None:
    """Every save of a restored session was refused as "changed on disk since this window opened
    or saved it", though nothing had touched the file."""
    recovery = tmp_path / "recovery"
    saver, payload = autosave_of_a_gone_writer(tmp_path, recovery, "written before the crash")
    (recovery / "autosave-gone.json").write_text(json.dumps(payload))
    saver.path.unlink()
    [offer] = claim_recovery_offers(recovery).offers
    restored = offer.restore()
    restored.save()
    assert not restored.dirty and restored.path is not None
    assert SessionDocument.open(restored.path).session.bookmarks[0].note == "written before the crash"

    (recovery / "autosave-gone.json").write_text(json.dumps(payload))
    [again] = claim_recovery_offers(recovery).offers
    with pytest.raises(SessionChangedError, match="it changed on disk since this window opened or saved it"):
        again.restore().save()
