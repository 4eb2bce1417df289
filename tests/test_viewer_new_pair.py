"""Opening another pair starts a clean investigation; unsaved work is asked about first.

The old pair's banners (a saved rerun's live "Open native vs rerun" button among them), bookmarks and
session title must not carry over to the new pair, and saving afterwards must not re-point the
old session file at the new captures.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from sessions.capture.identity import identity_of_capture
from sessions.compare.align_modes import POSITIONS
from sessions.investigation.model import Investigation, SavedTolerance
from sessions.investigation.store import SessionDocument
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = [pytest.mark.slow, pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")]

WAIT_MS = 120_000


def never_asked() -> str:
    raise AssertionError("a session without unsaved work must not ask")


def wait_recorded(qtbot: QtBot, win: MainWindow, pair: tuple[Path, Path]) -> None:
    """The pair is compared and shown, and the session names exactly its two captures."""
    qtbot.waitUntil(
        lambda: win.model.comparison is not None
        and win.tensor_view.data is not None
        and not win.tasks.busy
        and {ref.path for ref in win.session_file.session.captures} == {p.absolute() for p in pair},
        timeout=WAIT_MS,
    )


def test_another_pair_asks_about_unsaved_work_then_starts_a_clean_session(qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    contract, chunked = demo_pairs["attention-contract"], demo_pairs["head-chunk"]
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1440, 900)
    win.show()
    qtbot.waitExposed(win)
    win.open_pair(*contract)
    wait_recorded(qtbot, win, contract)
    win.model.select(next(p for p in win.model.comparison.comparison.pairs if p.key.op == "sdpa"))
    win.tab_actions[5].trigger()
    with qtbot.waitSignal(win.dispatch.rerun.finished, timeout=WAIT_MS):
        qtbot.mouseClick(win.dispatch.rerun.run_button, Qt.MouseButton.LeftButton)
    win.dispatch.rerun.choose_save_path = lambda _parent, _suggested: tmp_path / "rerun.h5"
    with qtbot.waitSignal(win.dispatch.rerun_saved, timeout=WAIT_MS):
        qtbot.mouseClick(win.dispatch.rerun.save_button, Qt.MouseButton.LeftButton)
    [rerun_banner] = win.banners.banners("rerun")
    assert "Open native vs rerun" in rerun_banner.buttons
    contract_texts = win.banners.texts("comparison")
    assert contract_texts, "the contract pair has its own banners"
    win.session_file.session.set_title("attention contract drift")
    win.session_sync.add_bookmark("the contract changed here")
    saved_at = tmp_path / "contract.xray"
    win.session_file.choose_path = lambda _purpose: saved_at
    assert win.session_file.save_as()
    win.session_sync.add_bookmark("unsaved second look")
    assert win.session_file.worth_keeping(), "a bookmark added since the save is unsaved work"

    questions: list[str] = []
    win.session_file.ask_close = lambda: questions.append("asked") or "cancel"
    win.open_pair(*chunked)
    assert questions == ["asked"]
    assert win.tasks.task("open") is None, "cancelled: nothing is read"
    assert win.model.native.path == contract[0] and len(win.session_file.session.bookmarks) == 2

    win.session_file.ask_close = lambda: questions.append("asked") or "discard"
    win.open_pair(*chunked)
    wait_recorded(qtbot, win, chunked)
    assert questions == ["asked", "asked"]
    session = win.session_file.session
    assert session.bookmarks == () and session.title == "" and session.reruns == ()
    assert win.session_file.document.path is None and "contract.xray" not in win.windowTitle()
    assert win.bookmarks.list.count() == 0
    assert win.banners.banners("rerun") == [], "no live rerun button of the old pair"
    assert not set(contract_texts) & set(win.banners.texts()), "no banner of the old pair"

    asked_for: list[str] = []
    win.session_file.choose_path = lambda purpose: asked_for.append(purpose) and None
    assert not win.session_file.save()
    assert asked_for == ["save"], "the new session has no file yet: saving asks where"
    old = SessionDocument.open(saved_at).session
    assert {ref.path for ref in old.captures} == {p.absolute() for p in contract}
    assert [b.note for b in old.bookmarks] == ["the contract changed here"] and old.title == "attention contract drift"

    win.session_file.ask_close = never_asked
    win.open_pair(*contract)
    wait_recorded(qtbot, win, contract)
    assert win.session_file.session.bookmarks == () and win.banners.banners("rerun") == []
    win.close()


DECISIONS: dict[str, Callable[[Investigation], object]] = {
    "a tolerance": lambda session: session.set_tolerance(SavedTolerance(max_ulp=2)),
    "an op's tolerance": lambda session: session.set_tolerance(SavedTolerance(max_ulp=4), op="sdpa"),
    "a tolerance policy": lambda session: session.set_tolerance_policy(Path("policy.toml")),
    "the pairing mode": lambda session: session.set_alignment_mode(POSITIONS),
}
"""Decisions a new session records without naming its captures."""


def test_a_new_sessions_decisions_alone_are_unsaved_work_asked_about_before_they_go(qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """A pairing broken by hand with its reason, a rerun, a tolerance, a policy or a pairing mode,
    with no bookmark or title, were dropped on close without a word, and their recovery file with them."""
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    win.session_file.ask_close = never_asked
    qtbot.addWidget(win)
    win.show()
    win.open_pair(*demo_pairs["clean"])
    wait_recorded(qtbot, win, demo_pairs["clean"])
    assert not win.session_file.worth_keeping(), "an untouched new session is nothing to keep"
    first = win.model.comparison.comparison.pairs[0]
    assert win.session_sync.break_pairing(first, "checked by hand: not the same tensor")
    assert win.session_file.worth_keeping(), "a pairing broken by hand"
    win.session_file.start_new()
    native = win.model.native
    win.session_file.session.add_rerun(native.path, identity_of_capture(native), description="live rerun through MLX")
    assert win.session_file.worth_keeping(), "a rerun"
    for what, decide in DECISIONS.items():
        win.session_file.start_new()
        assert not win.session_file.worth_keeping()
        decide(win.session_file.session)
        assert win.session_file.worth_keeping(), what
    questions: list[str] = []
    win.session_file.ask_close = lambda: questions.append("asked") or "discard"
    win.close()
    assert questions == ["asked"]
