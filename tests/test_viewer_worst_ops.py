"""The worst-ops tab ranks like `report`, re-sorts by any column, and selecting a row selects the op."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from sessions.compare.comparison import worst_ops
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.mark.slow
def test_the_worst_ops_tab_ranks_like_report_and_selects_the_clicked_op(qtbot: QtBot, tmp_path: Path, demo_pairs: dict, artifacts_dir: Path) -> None:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1280, 720)
    win.show()
    win.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=120_000)
    comparison = win.model.comparison.comparison
    table = win.worst_ops
    assert table.keys() == [p.key.text() for p in worst_ops(comparison, len(comparison.pairs))]
    assert len(table.keys()) == 105 and table.keys()[:3] == ["0:visual:1:ffn_down", "0:visual:1:ffn_act", "0:visual:-1:logits"]
    win.tab_actions[7].trigger()
    table.table.sortItems(6, Qt.SortOrder.DescendingOrder)
    by_differing = sorted((p for p in comparison.pairs if not p.metrics.bit_exact), key=lambda p: p.metrics.differing, reverse=True)
    assert table.keys()[0] == by_differing[0].key.text()
    table.table.selectRow(3)
    assert win.model.selected is not None and win.model.selected.key.text() == table.keys()[3]
    qtbot.waitUntil(lambda: not win.tasks.busy, timeout=120_000)
    QApplication.processEvents()
    assert win.grab().save(str(artifacts_dir / "viewer-worst-ops-1280x720.png"))
    win.close()


def test_with_no_differing_bits_the_worst_ops_line_says_where_a_failing_verdicts_findings_are() -> None:
    from sessions.compare.verdict import DISPATCH_ONLY, PARITY
    from viewer.panels.worst_ops_table import worst_ops_summary

    assert worst_ops_summary(0, 0, DISPATCH_ONLY) == "No op's bits differ before any shared EOS; the DISPATCH-ONLY findings are in the tree (Ctrl+J) and the Dispatch tab"
    assert worst_ops_summary(0, 0, PARITY) == "No op's bits differ before any shared EOS"
    assert worst_ops_summary(120, 100, "DIVERGENCE").startswith("the worst 100 of 120 op(s) differ before any shared EOS")
