"""Manual alignment in the window: break a pairing or pair two records, with a reason, kept in the session."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from sessions.commands import report as report_command
from sessions.compare.document import loads
from sessions.compare.unaligned import MANUAL_BREAK
from tests.viewer_windows import shown_tip
from viewer.comparison_view import MANUAL_MARKER
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints", "This plugin does not support raise")

WAIT_MS = 60_000
REASON = "the oracle fuses its FFN down projection"


def _captures(folder: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    tensors = [("q_proj", bf16_bits(rng.standard_normal((3, 8)))), ("ffn_down", bf16_bits(rng.standard_normal((3, 8))))]
    native = write_capture(folder / "native.h5", "native", [T(name, data, layer=0, dtype="bfloat16") for name, data in tensors])
    oracle = write_capture(folder / "oracle.h5", "oracle", [T(name, data, layer=0, dtype="bfloat16") for name, data in tensors])
    return native, oracle


def _window(qtbot: QtBot, settings: Path) -> MainWindow:
    win = MainWindow(ViewerSettings(settings))
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    return win


def _compared(qtbot: QtBot, win: MainWindow, pairs: int) -> None:
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy and len(win.model.comparison.comparison.pairs) == pairs, timeout=WAIT_MS)


def _pair_recorded(qtbot: QtBot, tmp_path: Path) -> tuple[Path, Path, MainWindow]:
    """The two-op pair open in a window, compared and recorded in its session."""
    native, oracle = _captures(tmp_path)
    win = _window(qtbot, tmp_path / "first.ini")
    win.open_pair(native, oracle)
    _compared(qtbot, win, 2)
    qtbot.waitUntil(lambda: len(win.session_file.session.captures) == 2, timeout=WAIT_MS)
    return native, oracle, win


def _report_on_session(session: Path, out: Path) -> int:
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    return report_command.run(parser.parse_args(["--session", str(session), "--json", str(out), "--no-cache"]))


def test_a_broken_pairing_is_shown_with_its_reason_saved_and_still_applied_after_reopening(qtbot: QtBot, tmp_path: Path) -> None:
    native, oracle, win = _pair_recorded(qtbot, tmp_path)
    asked: list[str] = []
    win.tree.ask_reason = lambda what: asked.append(what) or REASON
    actions = win.tree.actions_at(win.tree.row_index("ffn_down"))
    assert [a.text() for a in actions] == ["Break this pairing…", "HDF5 attributes…"]
    actions[0].trigger()
    _compared(qtbot, win, 1)
    assert "ffn_down" in asked[0]
    unaligned = win.model.comparison.comparison.unaligned
    assert [(u.side, u.name, u.reason, u.detail) for u in unaligned] == [
        ("native", "ffn_down", MANUAL_BREAK, REASON),
        ("oracle", "ffn_down", MANUAL_BREAK, REASON),
    ]
    row = win.tree.row_index("native: ffn_down (step 0 prefill layer 0)")
    assert row.isValid() and row.siblingAtColumn(3).data() == f"broken by hand: {REASON}"
    assert [(o.action, o.left.key.name, o.right.key.name, o.reason) for o in win.session_file.session.overrides] == [("unpair", "ffn_down", "ffn_down", REASON)]
    win.session_file.choose_path = lambda _purpose: tmp_path / "investigation.xray"
    assert win.session_file.save_as()
    shown = win.model.comparison.comparison
    assert _report_on_session(tmp_path / "investigation.xray", tmp_path / "report.json") == shown.verdict.exit_code == 1
    reported = loads((tmp_path / "report.json").read_text())
    assert reported.verdict == shown.verdict, "`report --session` applies the session's manual break, as the window does"
    assert [(u.side, u.reason) for u in reported.unaligned] == [("native", MANUAL_BREAK), ("oracle", MANUAL_BREAK)]
    win.close()

    again = _window(qtbot, tmp_path / "second.ini")
    assert again.session_file.open_session(tmp_path / "investigation.xray")
    _compared(qtbot, again, 1)
    assert [(u.name, u.reason, u.detail) for u in again.model.comparison.comparison.unaligned] == [
        ("ffn_down", MANUAL_BREAK, REASON),
        ("ffn_down", MANUAL_BREAK, REASON),
    ]

    again.tree.choose_partner = lambda record, candidates: next(c for c in candidates if c.name == "ffn_down")
    again.tree.ask_reason = lambda what: "checked by hand: same tensor"
    actions = again.tree.actions_at(again.tree.row_index("oracle: ffn_down (step 0 prefill layer 0)"))
    assert [a.text() for a in actions] == ["Undo this break", "Pair with…", "HDF5 attributes…"]
    actions[1].trigger()
    _compared(qtbot, again, 2)
    assert again.model.comparison.comparison.unaligned == []
    manual = again.tree.row_index("ffn_down" + MANUAL_MARKER)
    assert manual.isValid()
    assert shown_tip(manual.data(Qt.ItemDataRole.ToolTipRole)).endswith("paired by hand: checked by hand: same tensor")
    assert [o.action for o in again.session_file.session.overrides] == ["unpair", "pair"]

    actions = again.tree.actions_at(manual)
    assert [a.text() for a in actions] == ["Undo this manual pairing", "HDF5 attributes…"]
    actions[0].trigger()
    qtbot.waitUntil(lambda: not again.tasks.busy and again.tree.row_index("ffn_down").isValid(), timeout=WAIT_MS)
    assert again.session_file.session.overrides == (), "undoing takes back every override of the record: the profiles pair it again"
    assert again.model.comparison.comparison.unaligned == [] and again.model.comparison.comparison.verdict.word == "PARITY"
    again.close()


def test_swapping_roles_keeps_each_capture_and_the_pairings_made_by_hand(qtbot: QtBot, tmp_path: Path) -> None:
    native, oracle, win = _pair_recorded(qtbot, tmp_path)
    win.tree.ask_reason = lambda what: REASON
    win.tree.actions_at(win.tree.row_index("ffn_down"))[0].trigger()
    _compared(qtbot, win, 1)
    win.swap_roles()
    _compared(qtbot, win, 1)
    session = win.session_file.session
    qtbot.waitUntil(lambda: [(r.id, r.role) for r in session.captures] == [("native", "oracle"), ("oracle", "native")], timeout=WAIT_MS)
    assert [r.path for r in session.captures] == [native, oracle], "one entry per capture, its role swapped"
    assert win.banners.texts("session") == [], "no 'remove the overrides first' warning"
    assert [(o.action, o.reason) for o in session.overrides] == [("unpair", REASON)]
    assert [(u.side, u.reason) for u in win.model.comparison.comparison.unaligned] == [("native", MANUAL_BREAK), ("oracle", MANUAL_BREAK)], "the break still applies"
    win.session_file.choose_path = lambda _purpose: tmp_path / "swapped.xray"
    assert win.session_file.save_as()
    assert _report_on_session(tmp_path / "swapped.xray", tmp_path / "report.json") == win.model.comparison.comparison.verdict.exit_code
    assert loads((tmp_path / "report.json").read_text()).native_path == str(oracle), "report --session compares the swapped pair"
    win.close()


def test_breaking_one_position_pair_says_it_unpairs_every_position_pair_of_the_native_record(qtbot: QtBot, tmp_path: Path) -> None:
    from tests.test_align_positions import _prompt_tensors, combined, segmented

    data = _prompt_tensors()
    native, oracle = combined(tmp_path / "n.h5", data), segmented(tmp_path / "o.h5", data)
    win = _window(qtbot, tmp_path / "positions.ini")
    win.open_pair(native, oracle)
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    pair = next(p for p in win.model.comparison.comparison.pairs if p.key.op == "layer_out")
    asked: list[str] = []
    win.tree.ask_reason = lambda what: asked.append(what) or ""
    win.tree.break_pairing(pair)
    assert asked and asked[0].endswith("A break names the whole native record: it unpairs all 3 position pairs it is part of.")
    win.close()
