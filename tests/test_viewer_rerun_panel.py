"""The rerun panel driven like a user: run, cancel, read the verdict, save as a third capture."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from backends.commands.rerun import render
from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.progress import run_to_end
from viewer.comparison_view import ViewedComparison
from viewer.panels.rerun_panel import (
    CHOOSE,
    COLUMNS,
    RerunPanel,
    RerunPanelModel,
    ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")]


@pytest.fixture
def panel(qtbot, demo_pairs: dict):  # type: ignore[no-untyped-def]
    native, oracle = (open_capture(p) for p in demo_pairs["attention-contract"])
    model = RerunPanelModel()
    model.set_pair(native, oracle, ViewedComparison.of(run_to_end(iter_compare(native, oracle))))
    widget = RerunPanel(model)
    qtbot.addWidget(widget)
    widget.resize(1440, 900)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    widget.shutdown()
    native.close()
    oracle.close()


def test_running_on_the_native_route_shows_the_three_way_table_and_the_verdict_and_saves_it_or_says_why_not(qtbot, panel: RerunPanel, tmp_path: Path, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    assert "0:visual:0:attention_block" in panel.model.keys
    panel.set_key("0:visual:0:attention_block")
    panel.route_from.setCurrentIndex(panel.route_from.findData("native"))
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert panel.table.rowCount() == 11
    sdpa_row = [panel.table.item(r, 0).text() for r in range(11)].index("sdpa")
    assert panel.table.item(sdpa_row, 3).text() == "bit-exact"
    assert "differ" in panel.table.item(sdpa_row, 2).text() and panel.table.item(sdpa_row, 5).text().startswith("oracle")
    assert panel.table.item(sdpa_row, 2).text() == "27,961 differ\nmax 29,937 ULP", "as every other surface writes a figure, on two lines"
    assert panel.verdict.text() == (
        "The rerun on the native route reproduces the bits of: native. First op where the bits differ: sdpa (contract-mismatch); "
        "against the float64 reference, the oracle side is closer to exact."
    )
    assert render(panel.model.result).splitlines()[0] == panel.verdict.text(), "the CLI's first line says what the panel says"
    assert "decomposed fallback" in panel.device_note.text()
    assert "all KV groups, heads 0..11, 72 rows × 77 kv" in panel.calls.text() and "Metal would take sdpa_full" in panel.calls.text()
    panel.grab().save(str(artifacts_dir / "rerun-panel-1440x900.png"))
    saved = panel.save_to(tmp_path / "rerun.h5")
    with open_capture(saved) as rerun:
        assert rerun.meta.role == "rerun" and len(rerun.records) == 11
    nowhere = tmp_path / "gone" / "rerun.h5"
    panel.choose_save_path = lambda _parent, _suggested: nowhere
    qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == f"Could not save the rerun to {nowhere}: cannot be written (No such file or directory)"
    oracle = panel.model.oracle.path
    before = oracle.read_bytes()
    panel.choose_save_path = lambda _parent, _suggested: oracle
    qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == (
        f"Could not save the rerun to {oracle}: {oracle} is one of the files this rerun was computed from: "
        "a saved rerun never replaces an input; choose another file"
    )
    assert oracle.read_bytes() == before, "the window's Save replaced the oracle capture with the rerun"
    panel.set_key("0:visual:0:sdpa")
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.run()
    panel.resize(850, 600)  # its tab's room in a 1280x720 window
    qtbot.waitUntil(lambda: panel.width() == 850)
    header = panel.table.horizontalHeader()
    for column in range(panel.table.columnCount()):
        title = max(header.fontMetrics().horizontalAdvance(line) for line in COLUMNS[column].splitlines())
        assert panel.table.columnWidth(column) >= max(panel.table.sizeHintForColumn(column), title), ("reads whole", COLUMNS[column])
    assert not panel.table.horizontalScrollBar().isVisible(), "every column in the tab's room, the closer-to-exact one cut off"
    panel.grab().save(str(artifacts_dir / "rerun-panel-tab-at-1280x720.png"))


def test_cancel_stops_the_rerun_and_says_so(qtbot, panel: RerunPanel) -> None:  # type: ignore[no-untyped-def]
    panel.set_key("0:visual:1:decoder_layer")
    with qtbot.waitSignal(panel.cancelled, timeout=60_000):
        panel.run()
        qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == "Rerun cancelled." and panel.model.result is None
    assert not panel.save_button.isEnabled()


def test_a_failed_cancelled_or_other_ops_rerun_never_leaves_the_last_runs_result_on_show(qtbot, panel: RerunPanel) -> None:  # type: ignore[no-untyped-def]
    """The table, the verdict and an enabled Save of the last sdpa run stayed beside a status
    saying a later run had failed, and Save would have written the old result."""

    def run_sdpa() -> None:
        panel.set_key("0:visual:0:sdpa")
        with qtbot.waitSignal(panel.finished, timeout=60_000):
            panel.run()
        assert panel.table.rowCount() == 1 and panel.save_button.isEnabled() and panel.progress.text() == "done"

    def cleared() -> bool:
        return panel.model.result is None and panel.table.rowCount() == 0 and panel.verdict.text() == "" and not panel.save_button.isEnabled()

    run_sdpa()
    panel.set_key("0:visual:4:sdpa")
    assert cleared(), "another op chosen: the sdpa result read as its own"
    assert panel.status.text() == ready("0:visual:4:sdpa"), "'Ran on cpu ... Route: ...' of the sdpa run stood beside the next op chosen"
    assert panel.progress.text() == "", "'done' of the run whose table went"
    with qtbot.waitSignal(panel.failed, timeout=60_000):
        panel.run()
    assert cleared() and panel.progress.text() == "failed"
    run_sdpa()
    panel.set_key("0:visual:1:decoder_layer")
    with qtbot.waitSignal(panel.cancelled, timeout=60_000):
        panel.run()
        qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert cleared() and panel.progress.text() == "cancelled", "the bar kept the label of a step it never finished"
    run_sdpa()
    panel.set_key("0:text-before:-1:embed")
    assert panel.table.rowCount() == 1, "a refused choice keeps the op, and its result, as they were"
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.run()
        panel.set_key("0:visual:1:sdpa")  # chosen while the sdpa of layer 0 runs
    assert panel.key.currentText() == "0:visual:0:sdpa", "the result stood under the op chosen meanwhile, and Save recorded it there"
    assert panel.model.result.target.text() == "0:visual:0:sdpa"


def test_another_pair_clears_the_refusal_and_the_status_of_the_last(qtbot, panel: RerunPanel, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    """A refusal naming an op of the last pair stayed over the next pair's panel."""
    panel.set_key("0:text-before:-1:embed")
    assert panel.status.text().startswith("0:text-before:-1:embed cannot be rerun")
    native, oracle = (open_capture(p) for p in demo_pairs["signed-zero"])
    try:
        panel.model.set_pair(native, oracle, ViewedComparison.of(run_to_end(iter_compare(native, oracle))))
        assert panel.status.text() == CHOOSE
        panel.set_key("0:text-before:0:sdpa")
        assert panel.status.text() == ready("0:text-before:0:sdpa") and panel.key.currentText() == "0:text-before:0:sdpa"
    finally:
        panel.model.set_pair(None, None, None)
        native.close()
        oracle.close()


def test_a_key_the_comparison_did_not_pair_is_shown_as_a_message(qtbot, panel: RerunPanel) -> None:  # type: ignore[no-untyped-def]
    panel.set_key("0:visual:4:sdpa")
    with qtbot.waitSignal(panel.failed, timeout=60_000) as failed:
        panel.run()
    assert "0:visual:4:sdpa is not an aligned op of this comparison" in failed.args[0]
    assert panel.status.text().startswith("The rerun could not run: 0:visual:4:sdpa is not an aligned op")


def test_a_key_typed_that_no_rerun_computes_fails_as_every_other_refusal_says_it(qtbot, panel: RerunPanel) -> None:  # type: ignore[no-untyped-def]
    panel.key.setCurrentText("0:text-before:-1:embed")
    with qtbot.waitSignal(panel.failed, timeout=10_000):
        panel.run()
    assert panel.status.text() == (
        "The rerun could not run: key '0:text-before:-1:embed': embed cannot be rerun: its input is token ids, not a captured tensor"
    )
    assert panel.progress.text() == "failed"


def test_an_op_no_rerun_computes_is_not_preselected_and_the_panel_says_why_and_what_run_reruns(qtbot, panel: RerunPanel) -> None:  # type: ignore[no-untyped-def]
    panel.set_key("0:visual:0:sdpa")
    assert panel.status.text() == ready("0:visual:0:sdpa"), "no 'Choose an op' beside the op chosen"
    panel.set_key("0:text-before:-1:embed")
    assert panel.key.currentText() == "0:visual:0:sdpa"
    assert panel.status.text() == "0:text-before:-1:embed cannot be rerun: its input is token ids, not a captured tensor. Run reruns 0:visual:0:sdpa, still chosen."
    panel.set_key("0:visual:1:sdpa")
    assert panel.key.currentText() == "0:visual:1:sdpa" and panel.status.text() == ready("0:visual:1:sdpa")


def test_a_first_difference_of_signed_zeros_alone_says_both_sides_are_equally_close(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    native, oracle = (open_capture(p) for p in demo_pairs["signed-zero"])
    model = RerunPanelModel()
    model.set_pair(native, oracle, ViewedComparison.of(run_to_end(iter_compare(native, oracle))))
    widget = RerunPanel(model)
    qtbot.addWidget(widget)
    try:
        widget.set_key("0:text-before:0:ffn_act")
        widget.route_from.setCurrentIndex(widget.route_from.findData("native"))
        with qtbot.waitSignal(widget.finished, timeout=60_000):
            widget.run()
        assert widget.table.item(0, 5).text() == "tie\n1.66e-03 / 1.66e-03 / 1.66e-03"
        assert widget.verdict.text() == (
            "The rerun on the native route reproduces the bits of: oracle. First op where the bits differ: ffn_act (signed-zero-only); "
            "against the float64 reference, both sides are equally close to exact."
        )
    finally:
        widget.shutdown()
        native.close()
        oracle.close()


def test_the_key_box_is_as_wide_as_its_minimum_not_as_its_longest_key(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    """Sized to its contents on first show, the box measured every key: a real run's 260,000 held
    the window for a second the first time the Rerun tab showed, and one long key widened the form."""
    from PySide6.QtCore import QStringListModel

    widget = RerunPanel(RerunPanelModel())
    qtbot.addWidget(widget)
    short = widget.key.sizeHint().width()
    widget.key.setModel(QStringListModel(["0:visual:0:sdpa", "0:" + "x" * 400 + ":0:sdpa"], widget.key))
    widget.show()
    qtbot.waitExposed(widget)
    assert widget.key.sizeHint().width() == short
    widget.shutdown()
