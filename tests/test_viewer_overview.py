"""The Overview tab, driven for real offscreen: each op's error along the run, the first
finding's label, the names of the run's parts, and a long run's points and lines thinned to
the pixels they cover."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QImage, QPainter
from pytestqt.qtbot import QtBot

from sessions.compare.key import OpKey
from tests.viewer_windows import (
    wait_compared,
    wait_idle,
)
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_overview_click_on_a_point_selects_that_op(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    window.open_pair(*demo_pairs["signed-zero"])
    wait_compared(qtbot, window)
    window.show_panel(1)
    overview = window.overview
    target = 3
    spot = next(spot for scatter in overview.ulp_scatters.values() for spot in scatter.points() if spot.data() == target)
    scene = overview.ulp_plot.vb.mapViewToScene(spot.pos())
    point = overview.plot_widget.mapFromScene(scene)
    qtbot.mouseClick(overview.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(point.x(), point.y()))
    assert window.model.selected is overview.points[target]
    wait_idle(qtbot, window)


def test_the_overview_of_a_parity_pair_shows_its_ulp_axis_from_zero(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    window.open_pair(*demo_pairs["clean"])
    wait_compared(qtbot, window)
    window.show_panel(1)
    low, high = window.overview.ulp_plot.viewRange()[1]
    assert -0.1 < low <= 0.0 and high >= 1.0, "no ULP count below 0 on the axis of a run where none differs"
    low, high = window.overview.nmse_plot.viewRange()[1]
    assert (low, high) == (-31.0, -25.0), "the floor with whole decades around it, not ticks -30.4..-29.6 read as measured NMSEs"


def test_the_overviews_first_finding_label_sits_above_every_point(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """Drawn over the points, the label hid the worst ops; it sits in room added above them."""
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    window.show_panel(1)
    overview = window.overview
    assert overview.first_label.toPlainText() == "first contract-mismatch: 0:visual:0:sdpa"
    highest = max(float(spot.pos().y()) for scatter in overview.ulp_scatters.values() for spot in scatter.points())
    label = overview.first_label.mapRectToView(overview.first_label.boundingRect())
    low, high = overview.ulp_plot.viewRange()[1]
    assert highest < label.top() < label.bottom() <= high, (highest, label.top(), label.bottom(), high)
    wait_idle(qtbot, window)


def test_the_overview_names_the_prompts_segments_and_the_decode_steps_where_each_starts(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    window.show_panel(1)
    overview = window.overview
    series = window.model.comparison.growth
    assert [name for _, name in series.parts] == ["text-before", "visual", "text-after", "decode steps"]
    for (first, name), (_, before) in zip(series.parts[1:], series.parts):
        key, previous = series.pairs[first].key, series.pairs[first - 1].key
        assert (key.segment if key.step == 0 else "decode steps", previous.segment) == (name, before)
    assert series.pairs[series.parts[-1][0]].key.step == 1
    lines = sorted({line.value() for _, line in overview.part_lines})
    assert lines == [first - 0.5 for first, _ in series.parts[1:]] and len(overview.part_lines) == 6, "a dotted line in both plots"
    overview.grab()
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, names = overview.part_names.generateDrawSpecs(painter)
    finally:
        painter.end()
    assert [text for _, _, text in names] == ["text-before", "visual", "text-after", "decode steps"]
    wait_idle(qtbot, window)


def test_a_name_with_no_room_over_its_stretch_is_left_out_until_the_user_zooms_in(qtbot: QtBot) -> None:
    from viewer.widgets.part_names_axis import PartNamesAxis

    axis = PartNamesAxis()
    plot = pg.PlotWidget(axisItems={"top": axis})
    qtbot.addWidget(plot)
    plot.resize(1000, 300)
    plot.showAxis("top")
    plot.show()
    axis.set_parts([(0, 400, "text-before"), (400, 1300, "visual"), (1300, 1600, "text-after"), (1600, 240_000, "decode steps")])

    def names(first: float, stop: float) -> list[str]:
        plot.setXRange(first, stop, padding=0)
        plot.grab()
        image = QImage(10, 10, QImage.Format.Format_ARGB32)
        painter = QPainter(image)
        try:
            return [text for _, _, text in axis.generateDrawSpecs(painter)[2]]
        finally:
            painter.end()

    assert names(0, 240_000) == ["decode steps"], "a real run's prompt is a few pixels: its names piled up at the left edge"
    assert names(0, 1650) == ["text-before", "visual", "text-after"], "the few decode ops seen leave no room for their name"
    assert names(0, 3000) == ["text-before", "visual", "text-after", "decode steps"]


def test_a_run_cut_into_more_parts_than_a_plot_can_name_marks_none() -> None:
    from viewer.comparison_view import PARTS_SHOWN, _parts

    prompt = [SimpleNamespace(key=OpKey(0, f"chunk-{i}", 0, "attn_norm", 0)) for i in range(PARTS_SHOWN)]
    decode = [SimpleNamespace(key=OpKey(step, "decode", 0, "attn_norm", 0)) for step in (1, 2)]
    assert [name for _, name in _parts(prompt[:-1] + decode)] == [f"chunk-{i}" for i in range(PARTS_SHOWN - 1)] + ["decode steps"]
    assert _parts(prompt + decode) == []


def test_a_long_runs_overview_shows_each_colours_worst_op_of_every_stretch() -> None:
    from sessions.report.plot_bins import worst_per_bin
    from viewer.comparison_view import POINT_BINS

    ops = np.arange(1, 10 * POINT_BINS, 3)
    y = np.sin(ops.astype(np.float64))
    shown = worst_per_bin(ops, y, 10 * POINT_BINS, POINT_BINS)
    stretches = shown * POINT_BINS // (10 * POINT_BINS)
    assert len(np.unique(stretches)) == len(shown) == POINT_BINS
    for op, stretch in zip(shown, stretches):
        inside = ops[ops * POINT_BINS // (10 * POINT_BINS) == stretch]
        assert y[np.searchsorted(ops, op)] == np.sin(inside.astype(np.float64)).max()
    few = np.array([0, 5, 9])
    assert worst_per_bin(few, np.zeros(3), 10, POINT_BINS).tolist() == [0, 5, 9]
    none = np.array([], dtype=np.int64)
    assert worst_per_bin(none, np.zeros(0), 10 * POINT_BINS, POINT_BINS).tolist() == [], "a verdict colour no op of a long run has draws nothing"


def test_the_overview_draws_a_long_runs_lines_thinned_to_the_pixels_they_cover(qtbot: QtBot) -> None:
    from viewer.pair_model import PairModel
    from viewer.panels.overview_plot import OverviewPlot

    overview = OverviewPlot(PairModel())
    qtbot.addWidget(overview)
    overview.resize(1000, 500)
    overview.show()
    ops = 220_000
    overview.ulp_line.setData(np.arange(ops, dtype=np.float64), np.random.default_rng(3).random(ops))
    overview.ulp_plot.autoRange()
    qtbot.wait(50)
    overview.grab()
    drawn = overview.ulp_line.curve.xData.size
    assert drawn < ops // 10, f"{drawn} of {ops} points drawn: the line is not thinned"
