"""Moving through a comparison from the keyboard and the panels: Ctrl+J, F8 and Shift+F8 (under
a filter too), the Worst ops table following the selection, Swap roles keeping the op, and what
the window says while one capture alone is open.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from sessions.compare.verdict import Kind
from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import COMPARED_WITHIN_MS as WAIT_MS
from tests.viewer_windows import shown_tip, wait_compared, wait_idle
from viewer.window.main_window import TABS, MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_f8_and_shift_f8_step_through_divergences_from_the_keyboard(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    window.open_pair(*demo_pairs["swiglu-order"])
    wait_compared(qtbot, window)
    comparison = window.model.comparison.comparison
    diverged = [p for p in comparison.pairs if not p.metrics.bit_exact and not p.post_eos]
    assert len(diverged) >= 2
    assert window.model.selected is diverged[0]
    window.activateWindow()
    window.tree.view.setFocus()
    qtbot.keyClick(window.tree.view, Qt.Key.Key_F8)
    assert window.model.selected is diverged[1]
    stepped = [p for p in comparison.pairs if p.verdict != Kind.BIT_EXACT and not p.post_eos]
    assert window.statusBar().currentMessage() == f"{diverged[1].key}: {diverged[1].verdict} (op 2 of the {len(stepped)} that are not bit-exact)", (
        "each step says where it is: the last line stayed up beside another op"
    )
    qtbot.keyClick(window.tree.view, Qt.Key.Key_F8, Qt.KeyboardModifier.ShiftModifier)
    assert window.model.selected is diverged[0]
    for expected in [*diverged[1:], diverged[-1]]:
        window.findings.step(+1)
        assert window.model.selected is expected, "F8 walks every divergence in order and stays on the last"
    assert window.statusBar().currentMessage() == "No differing op after this one.", "F8 on the last said nothing"
    window.model.select(comparison.pairs[-1])
    window.findings.step(-1)
    assert window.model.selected is next(p for p in reversed(diverged) if p is not comparison.pairs[-1])
    wait_idle(qtbot, window)


def test_f8_under_a_filter_steps_through_the_ops_it_shows_and_keeps_it(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """F8 went to o_proj, which the filter "ffn_down" hid, and cleared the filter the user typed."""
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    qtbot.waitUntil(lambda: window.model.selected is not None, timeout=WAIT_MS)
    comparison = window.model.comparison.comparison
    downs = [p for p in comparison.pairs if p.key.op == "ffn_down" and p.verdict != Kind.BIT_EXACT and not p.post_eos]
    assert len(downs) >= 3
    window.tree.filter.setText("ffn_down")
    seen = []
    for _ in range(3):
        window.findings.step(+1)
        seen.append(window.model.selected)
    assert seen == downs[:3] and window.tree.filter.text() == "ffn_down"
    stepped = [p for p in comparison.pairs if p.verdict != Kind.BIT_EXACT and not p.post_eos]
    which = stepped.index(downs[2]) + 1
    assert window.statusBar().currentMessage() == f"{downs[2].key}: {downs[2].verdict} (op {which} of the {len(stepped)} that are not bit-exact; {len(downs)} of them shown by the filter)"
    window.tree.filter.setFocus()
    qtbot.keyClick(window.tree.filter, Qt.Key.Key_Escape)
    assert window.tree.filter.text() == "", "Esc clears the filter, as in every search box"
    window.tree.filter.setText("ffn_down")
    window.model.select(downs[-1])
    window.findings.step(+1)
    assert window.model.selected is downs[-1] and window.statusBar().currentMessage() == "No differing op the filter shows after this one (“ffn_down”)."
    # What the contract card tells the user to do to reach its other op.
    [card] = [b for b in window.banners.banners("comparison") if "native ran" in b.text]
    assert "1 more op(s) have contract findings (filter the tree by “contract-mismatch”, then F8 steps through them)" in shown_tip(card.details.text())
    window.tree.filter.setText("contract-mismatch")
    window.jump_action.trigger()
    window.findings.step(+1)
    assert window.model.selected.key.text() == "0:visual:1:sdpa"
    wait_idle(qtbot, window)


def test_the_worst_ops_table_follows_the_selection_and_swapping_roles_keeps_the_op(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """Worst ops kept highlighting the op clicked last beside another in the tree, and a click on
    it then did nothing; Swap roles went back to the first finding."""
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    qtbot.waitUntil(lambda: window.model.selected is not None, timeout=WAIT_MS)
    window.show_panel(TABS.index("Worst ops"))
    table = window.worst_ops.table
    table.selectRow(3)
    clicked = window.model.selected
    assert clicked.key.text() == window.worst_ops.keys()[3]
    window.jump_action.trigger()
    first = window.model.selected
    assert first is not clicked
    rows = {index.row() for index in table.selectionModel().selectedRows()}
    assert [window.worst_ops.keys()[r] for r in rows] == [first.key.text()]
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=table.visualItemRect(table.item(3, 1)).center())
    assert window.model.selected is clicked, "a click on a listed op selects it again"
    window.swap_roles()
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.model.selected is not None, timeout=WAIT_MS)
    assert window.model.selected.key == clicked.key, "the swapped pair shows the op the user was on"
    wait_idle(qtbot, window)


def test_a_pair_whose_first_finding_has_agreeing_bits_opens_on_the_tab_that_shows_it(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """A dispatch-only pair opened on Tensor diff: a green "bit-exact" map and "no differing elements" beside the verdict."""
    window.open_pair(*demo_pairs["head-chunk"])
    wait_compared(qtbot, window)
    qtbot.waitUntil(lambda: window.model.selected is not None, timeout=WAIT_MS)
    assert str(window.model.selected.key) == "0:text-after:0:sdpa" and window.tabs.tabText(window.tabs.currentIndex()) == "Dispatch timeline"
    wait_idle(qtbot, window)


def test_f8_where_no_op_differs_points_at_the_verdicts_finding_instead(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """Under a failing verdict whose findings are not differing bits, F8 said only "nothing to step through"."""
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", x, layer=0, dtype="bfloat16")], [(0, 5, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")], [(0, 6, False)])
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    window.findings.step(+1)
    first = window.model.comparison.comparison.verdict.first
    assert first is not None and first.kind == Kind.TOKENS
    assert window.statusBar().currentMessage() == (
        f"No op differs before any shared EOS: nothing to step through; the first finding, tokens at {first.key}, is in the Token parity tab (Ctrl+J)."
    )
    wait_idle(qtbot, window)


def test_with_one_capture_open_every_empty_view_says_which_to_open(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """Tensor diff said "Select an op in the alignment tree" over an empty tree, and the timeline
    "open a pair whose captures record attention calls" of a capture that records them."""
    window.open_files([demo_pairs["swiglu-order"][0]])
    qtbot.waitUntil(lambda: window.model.native is not None and not window.tasks.busy, timeout=WAIT_MS)
    said = "Open the oracle run's capture (drop it on the window): one capture alone has nothing to compare"
    assert window.tensor_view.title.text() == said
    window.show_panel(TABS.index("Dispatch timeline"))
    qtbot.waitUntil(lambda: window.dispatch.timeline.summary.text() == said)
    assert window.tree.summary.text() == said
    window.findings.step(+1)
    assert window.statusBar().currentMessage() == "Open a pair first.", "F8 said nothing"
    window.open_files([demo_pairs["swiglu-order"][1]])
    wait_compared(qtbot, window)
    assert window.dispatch.timeline.summary.text() != said and window.statusBar().currentMessage() != "Open a pair first."
    wait_idle(qtbot, window)
