"""The Diagnosis panel driven like a user: diagnose, read the verdict, pick an op, cancel; the tree's cause column."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics

from sessions.capture.opening import open_capture
from sessions.capture.reader import Capture
from sessions.compare.result_cache import iter_compare_cached
from sessions.progress import run_to_end
from tests.viewer_windows import shown_tip
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.panels.diagnosis_panel import (
    CANDIDATE_COLUMNS,
    NO_PAIR,
    NOT_COMPARED,
    OP_COLUMNS,
    READY,
    DiagnosisPanel,
)
from viewer.settings import ViewerSettings
from viewer.window.main_window import TABS, TREE_WIDTH_WITH_CAUSES, MainWindow

pytestmark = [pytest.mark.slow, pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")]


@pytest.fixture
def window(qtbot, tmp_path: Path, demo_pairs: dict):  # type: ignore[no-untyped-def]
    """The window on the attention-contract pair, compared, with the Diagnosis tab shown."""
    main = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(main)
    main.resize(1280, 720)
    main.show()
    qtbot.waitExposed(main)
    main.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: main.model.comparison is not None and not main.tasks.busy, timeout=120_000)
    main.show_panel(TABS.index("Diagnosis"))
    yield main
    main.close()


def test_diagnosing_every_op_leads_with_the_verdict_and_fills_the_tree_cause_column(qtbot, window: MainWindow, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    panel = window.diagnosis
    assert window.tree.view.isColumnHidden(4)
    panel.scope.setCurrentIndex(panel.scope.findData("all"))
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert shown_tip(panel.verdict.text()).startswith("0:visual:0:sdpa is local: the native ran attn.bf16.single_range (bit-exact reproduction)")
    assert [panel.ops.item(r, 0).text() for r in range(panel.ops.rowCount())] == ["0:visual:0:sdpa", "0:visual:1:sdpa"]
    assert panel.ops.item(0, 2).text() == "attn.bf16.single_range"
    candidates = {panel.candidates.item(r, 0).text(): panel.candidates.item(r, 1).text() for r in range(panel.candidates.rowCount())}
    assert candidates["attn.bf16.single_range"] == "bit-exact" and candidates["attn.f32.tiled64x64"] == "27,961 differ · max 29,937 ULP"
    assert panel.details.tabText(1) == "Budget of 6:decode:-1:logits" and panel.budget.item(0, 1).text() == "100%"
    assert "105 differing op(s) classified: 2 local, 103 inherited, 0 undetermined" in shown_tip(panel.summary.text())
    assert window.model.selected.key.text() == "0:visual:0:sdpa"
    assert not window.tree.view.isColumnHidden(4)
    pairs = {p.key.text(): p for p in window.model.comparison.comparison.pairs}
    assert window.tree.cause_of(pairs["0:visual:0:sdpa"]) == "local" and window.tree.cause_of(pairs["0:visual:0:o_proj"]) == "inherited"
    assert window.tree.cause_of(pairs["0:text-before:0:sdpa"]) == ""
    verdict = panel.verdict
    qtbot.waitUntil(lambda: verdict.height() >= verdict.heightForWidth(verdict.width()) > 2 * verdict.fontMetrics().height())
    qtbot.waitUntil(lambda: window.tree_dock.width() >= TREE_WIDTH_WITH_CAUSES)
    window.grab().save(str(artifacts_dir / "diagnosis-panel-1280x720.png"))
    window.tree.filter.setText("local")  # the cause column: F8 found nothing the filter showed
    window.model.select(pairs["0:visual:0:sdpa"])
    window.findings.step(+1)
    assert window.model.selected.key.text() == "0:visual:1:sdpa" and window.tree.filter.text() == "local"
    window.tree.filter.clear()
    panel.show_inherited.setChecked(True)
    assert panel.ops.rowCount() == 105
    panel.ops.setCurrentCell(1, 0)
    assert window.model.selected.key.text() == "0:visual:0:o_proj"
    assert panel.candidates.rowCount() == 0 and panel.details.tabText(0) == "Candidates at 0:visual:0:o_proj"
    assert shown_tip(panel.why.text()).startswith("0:visual:0:o_proj is inherited: the oracle's route on the native's inputs gives the native's bits")
    window.resize(1440, 900)
    panel.show_inherited.setChecked(False)
    qtbot.waitUntil(lambda: verdict.height() >= verdict.heightForWidth(verdict.width()))
    qtbot.waitUntil(lambda: window.banners.height() >= window.banners.sizeHint().height())  # the card's details, shown at this size
    window.grab().save(str(artifacts_dir / "diagnosis-panel-1440x900.png"))


def test_beside_the_cause_column_the_trees_op_names_and_figures_show_whole_at_1280x720(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    with qtbot.waitSignal(window.diagnosis.finished, timeout=120_000):
        window.diagnosis.run()
    tree, view = window.tree, window.tree.view
    assert not view.isColumnHidden(4)
    pairs = {p.key.text(): p for p in window.model.comparison.comparison.pairs}
    tree.reveal(pairs["0:visual:0:attn_residual"])
    qtbot.waitUntil(lambda: view.visualRect(view.currentIndex()).isValid())
    layer = view.currentIndex().parent()
    rows = [layer.model().index(r, 0, layer) for r in range(layer.model().rowCount(layer))]
    icon = view.iconSize().width() if view.iconSize().isValid() else view.style().pixelMetric(view.style().PixelMetric.PM_SmallIconSize)
    fonts = view.fontMetrics()
    cut = [(row.data(), view.visualRect(row).width()) for row in rows if view.visualRect(row).width() < icon + fonts.horizontalAdvance(row.data()) + 12]
    assert not cut, f"op names cut beside the cause column: {cut}"
    for column in (2, 3, 4):
        widest = max(fonts.horizontalAdvance(str(row.siblingAtColumn(column).data() or "")) for row in rows)
        assert view.columnWidth(column) >= widest + 8, (view.model().headerData(column, Qt.Orientation.Horizontal), view.columnWidth(column), widest)


def test_at_1280x720_the_scope_reads_whole_and_the_ops_table_shows_op_cause_and_contract_without_scrolling(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    panel = window.diagnosis
    panel.scope.setCurrentIndex(panel.scope.findData("all"))
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        panel.run()
    qtbot.wait(50)
    scope = panel.scope
    assert scope.currentText() == "Every differing op + budget"
    assert scope.width() >= scope.fontMetrics().horizontalAdvance(scope.currentText()) + 24, (scope.width(), scope.currentText())
    ops = panel.ops
    assert ops.width() >= 380, f"the ops table gets a usable share of the panel: {ops.width()} px"
    for column in range(3):
        assert ops.columnWidth(column) >= ops.sizeHintForColumn(column), (OP_COLUMNS[column], ops.columnWidth(column))
    assert not ops.horizontalScrollBar().isVisible(), "the local error is elided, its tooltip whole"
    assert sum(ops.columnWidth(c) for c in range(len(OP_COLUMNS))) <= ops.viewport().width()
    assert "local error:" in shown_tip(ops.item(0, 3).toolTip())
    bold = QFont(ops.horizontalHeader().font())
    bold.setBold(True)  # as the style sheet draws a header, which clips a title too long rather than elide it
    assert ops.columnWidth(3) >= QFontMetrics(bold).horizontalAdvance(OP_COLUMNS[3]) + 12, "the error column's title reads whole"
    candidates = panel.candidates
    assert candidates.rowCount() == 11
    qtbot.waitUntil(lambda: not candidates.horizontalScrollBar().isVisible())  # the four columns show without a sideways scroll
    for column in range(3):
        assert candidates.columnWidth(column) >= candidates.sizeHintForColumn(column), (CANDIDATE_COLUMNS[column], candidates.columnWidth(column))
    assert candidates.columnWidth(3) >= 150, "what a candidate computes gets a readable width"
    assert candidates.viewport().height() >= 4 * candidates.rowHeight(0), "four candidates show without scrolling"
    assert ops.viewport().height() >= 2 * ops.rowHeight(0), "both local ops show whole"


def test_a_new_pair_takes_back_the_last_diagnosis_cause_column_tab_titles_and_progress(qtbot, window: MainWindow, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    panel = window.diagnosis
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        panel.run()
    assert not window.tree.view.isColumnHidden(4) and panel.details.tabText(0) == "Candidates at 0:visual:0:sdpa" and panel.progress.text() == "done"
    window.open_pair(*demo_pairs["clean"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=120_000)
    assert window.tree.view.isColumnHidden(4), "no empty cause column squeezes the new pair's op names"
    assert (panel.details.tabText(0), panel.details.tabText(1)) == ("Candidates", "Budget")
    assert panel.progress.text() != "done"


@pytest.fixture
def panel(qtbot, demo_pairs: dict):  # type: ignore[no-untyped-def]
    """The panel alone, on a model holding the attention-contract pair and its comparison."""
    native, oracle = (open_capture(p) for p in demo_pairs["attention-contract"])
    model = PairModel()
    model.set_captures(native, oracle)
    comparison = run_to_end(iter_compare_cached(native, oracle))
    model.set_comparison(cv.ViewedComparison.of(comparison))
    widget = DiagnosisPanel(model)
    qtbot.addWidget(widget)
    widget.show()
    yield widget
    widget.shutdown()
    native.close()
    oracle.close()


def test_before_any_diagnosis_every_table_header_shows_whole(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    panel = window.diagnosis
    for table in (panel.ops, panel.candidates, panel.budget):
        header = table.horizontalHeader()
        for column in range(table.columnCount() - 1):  # the last one stretches
            assert table.columnWidth(column) >= header.sectionSizeHint(column), (table.horizontalHeaderItem(column).text(), table.columnWidth(column))


def test_the_diagnosis_sentences_show_contract_ids_as_code_without_their_backticks(qtbot, panel: DiagnosisPanel) -> None:  # type: ignore[no-untyped-def]
    panel.scope.setCurrentIndex(panel.scope.findData("op"))
    panel.model.select(next(p for p in panel.model.comparison.comparison.pairs if p.key.text() == "0:visual:0:sdpa"))
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.run()
    assert panel.diagnosis is not None and "the native ran `attn.bf16.single_range` (bit-exact" in panel.diagnosis.verdict, "the CLI's sentence keeps its backticks"
    assert "the native ran <code>attn.bf16.single_range</code> (bit-exact" in panel.verdict.text()
    for label in (panel.verdict, panel.summary, panel.why):
        assert label.textFormat() == Qt.TextFormat.RichText and "`" not in shown_tip(label.text()), shown_tip(label.text())
    assert "`" not in shown_tip(panel.ops.item(0, 0).toolTip())


def test_cancel_stops_the_diagnosis_and_says_so(qtbot, panel: DiagnosisPanel) -> None:  # type: ignore[no-untyped-def]
    panel.scope.setCurrentIndex(panel.scope.findData("all"))
    with qtbot.waitSignal(panel.cancelled, timeout=60_000):
        panel.run()
        qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert shown_tip(panel.verdict.text()) == "Diagnosis cancelled." and panel.diagnosis is None and panel.model.locality == {}


def test_the_selected_op_scope_needs_a_selection_and_then_diagnoses_it(qtbot, panel: DiagnosisPanel) -> None:  # type: ignore[no-untyped-def]
    panel.scope.setCurrentIndex(panel.scope.findData("op"))
    panel.run()
    assert shown_tip(panel.verdict.text()) == "Select an op in the alignment tree first, or choose another scope."
    panel.model.select(next(p for p in panel.model.comparison.comparison.pairs if p.key.text() == "0:visual:0:o_proj"))
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.run()
    assert shown_tip(panel.verdict.text()) == "All 1 diagnosed op(s) are inherited: each did what the oracle's route does with its inputs."
    panel.show_inherited.setChecked(True)
    assert panel.ops.item(0, 1).text() == "inherited"


def test_the_panel_says_what_diagnose_needs_and_drops_an_old_verdict_when_the_comparison_changes(qtbot, panel: DiagnosisPanel) -> None:  # type: ignore[no-untyped-def]
    assert shown_tip(panel.verdict.text()) == READY
    panel.scope.setCurrentIndex(panel.scope.findData("op"))
    panel.model.select(next(p for p in panel.model.comparison.comparison.pairs if p.key.text() == "0:visual:0:o_proj"))
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.run()
    assert shown_tip(panel.verdict.text()).startswith("All 1 diagnosed op(s) are inherited")
    viewed, native, oracle = panel.model.comparison, panel.model.native, panel.model.oracle
    panel.model.set_comparison(viewed)
    assert shown_tip(panel.verdict.text()) == READY and panel.ops.rowCount() == 0 and panel.diagnosis is None
    panel.model.set_captures(None, None)
    assert shown_tip(panel.verdict.text()) == NO_PAIR
    panel.model.set_captures(native, oracle)
    assert shown_tip(panel.verdict.text()) == NOT_COMPARED
    panel.run()
    assert shown_tip(panel.verdict.text()) == NOT_COMPARED


def _panel_on(qtbot, native: Capture, oracle: Capture) -> DiagnosisPanel:  # type: ignore[no-untyped-def]
    """A panel shown on its own over the pair's comparison, as the window gives it one."""
    model = PairModel()
    model.set_captures(native, oracle)
    model.set_comparison(cv.ViewedComparison.of(run_to_end(iter_compare_cached(native, oracle))))
    panel = DiagnosisPanel(model)
    qtbot.addWidget(panel)
    panel.show()
    return panel


def test_a_contract_only_mismatch_says_which_declaration_the_bits_bear_out(qtbot, demo_pairs: dict, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """diagnose said so on the command line; the panel showed the sentence and nothing per op."""
    from test_diagnosis_demo import declaring

    native, oracle = (open_capture(p) for p in declaring(demo_pairs["clean"], tmp_path, "kqv_out-0", "text-before", "attn.f16.single_range"))
    panel = _panel_on(qtbot, native, oracle)
    try:
        with qtbot.waitSignal(panel.finished, timeout=60_000):
            panel.run()
        assert shown_tip(panel.why.text()) == "0:text-before:0:sdpa: the native's attn.f16.single_range does not; the oracle's attn.bf16.single_range does"
    finally:
        panel.shutdown()
        native.close()
        oracle.close()


def test_weights_chosen_in_the_panel_are_the_ones_the_reruns_read_as_with_diagnose_weights(qtbot, demo_pairs: dict, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A pair moved away from its weights left 67 ops undetermined in the window, whose verdict
    asked for `--weights FILE`, which the window had no way to give."""
    from test_diagnosis_demo import copied

    native, oracle = (open_capture(p) for p in copied(demo_pairs["attention-contract"], tmp_path, weights=False))
    panel = _panel_on(qtbot, native, oracle)
    panel.scope.setCurrentIndex(panel.scope.findData("all"))
    try:
        with qtbot.waitSignal(panel.finished, timeout=120_000):
            panel.run()
        assert panel.diagnosis is not None and len(panel.diagnosis.open_ops) == 67
        weights = demo_pairs["attention-contract"][0].parent / "demo-qwen3-tiny.safetensors"
        panel.use_weights(str(weights))
        assert (panel.weights_button.text(), panel.weights_button.toolTip().splitlines()[0]) == ("Weights: demo-qwen3-tiny.saf…", str(weights))
        with qtbot.waitSignal(panel.finished, timeout=120_000):
            panel.run()
        assert panel.diagnosis.open_ops == [] and len(panel.diagnosis.local_chain) == 2
    finally:
        panel.shutdown()
        native.close()
        oracle.close()
