"""Error growth across execution order: where the first bit flips and how it amplifies.

One point per aligned op (max ULP above, NMSE below), coloured by verdict, with the first
divergence marked; a run of more than POINT_BINS ops shows each colour's worst op per stretch
of it (`sessions.report.plot_bins.worst_per_bin`, chosen on the worker thread). Clicking a point selects
that op everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.theme import STATUS_COLOURS
from viewer.widgets.opaque_grid_axis import grid_axes, show_grid
from viewer.widgets.part_names_axis import PartNamesAxis
from viewer.widgets.plain_text import plain_label
from viewer.widgets.stale_while_hidden import StaleWhileHidden

FIRST = "#d64541"
PART_LINE = "#8a8f98"
LABEL_ROOM = 0.22
"""Room above the highest ULP point, as a share of the plot's range, for the first finding's label."""


class OverviewPlot(QWidget):
    op_clicked = Signal(object)

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.points: list[Any] = []
        self._position: dict[int, int] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.headline = plain_label("Open a pair to see where the runs part")
        self.headline.setObjectName("sectionTitle")
        self.headline.setWordWrap(True)
        layout.addWidget(self.headline)
        self.plot_widget = pg.GraphicsLayoutWidget()
        self.part_names = PartNamesAxis()
        self.ulp_plot = self.plot_widget.addPlot(
            row=0, col=0, title="max ULP distance per op (log2(1 + ULP))", axisItems={**grid_axes(), "top": self.part_names}, enableMenu=False
        )
        self.nmse_plot = self.plot_widget.addPlot(row=1, col=0, title="NMSE per op (log10; bit-exact ops on the floor)", axisItems=grid_axes(), enableMenu=False)
        self.nmse_plot.setXLink(self.ulp_plot)
        for plot in (self.ulp_plot, self.nmse_plot):
            show_grid(plot, x=True, y=True, alpha=0.15)
            plot.getAxis("left").setWidth(52)
        self.nmse_plot.getAxis("bottom").setLabel("aligned op, in execution order")
        # One scatter per verdict colour: pyqtgraph styles a whole scatter at array speed, but
        # one point at a time when each point has its own brush (seconds for a real model's run).
        self.ulp_scatters = {status: pg.ScatterPlotItem(size=8, hoverable=True, tip=None, brush=pg.mkBrush(colour), pen=None) for status, colour in STATUS_COLOURS.items()}
        self.nmse_scatters = {status: pg.ScatterPlotItem(size=8, hoverable=True, tip=None, brush=pg.mkBrush(colour), pen=None) for status, colour in STATUS_COLOURS.items()}
        # A real model's run is hundreds of thousands of ops: the lines are thinned to the pixels
        # they cover and drawn only where the view is (a paint of 220,000 points: 130 ms -> 18 ms).
        # Set on the plots: a plot gives each line it is handed its own settings, not the line's.
        self.ulp_line = pg.PlotDataItem(pen=pg.mkPen("#6b7480", width=1), skipFiniteCheck=True)
        self.nmse_line = pg.PlotDataItem(pen=pg.mkPen("#6b7480", width=1), skipFiniteCheck=True)
        for plot, line, scatters in ((self.ulp_plot, self.ulp_line, self.ulp_scatters), (self.nmse_plot, self.nmse_line, self.nmse_scatters)):
            plot.setDownsampling(auto=True, mode="peak")
            plot.setClipToView(True)
            plot.addItem(line)
            for scatter in scatters.values():
                plot.addItem(scatter)
                scatter.sigClicked.connect(self._clicked)
        self.first_lines = [pg.InfiniteLine(angle=90, pen=pg.mkPen(FIRST, width=2, style=Qt.PenStyle.DashLine)) for _ in range(2)]
        self.first_label = pg.TextItem("", color=FIRST, anchor=(0, 1), fill=pg.mkBrush(pg.getConfigOption("background")))
        self.first_label.setZValue(10)
        self.selected_lines = [pg.InfiniteLine(angle=90, pen=pg.mkPen("#00e5ff", width=1)) for _ in range(2)]
        self.part_lines: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        """Where each part of the run after the first starts (`cv.GrowthSeries.parts`), in both plots."""
        layout.addWidget(self.plot_widget, 1)
        self._refresh = StaleWhileHidden(self, self.rebuild)
        # The selected op's line moves when the Overview is seen: moved while hidden, each
        # selection still cost the hidden plots 10-22 ms of scene updates on a real model's run.
        self._selection = StaleWhileHidden(self, lambda: self._show_selection(self._model.selected))
        model.comparison_changed.connect(self._refresh.request)
        model.selection_changed.connect(lambda _pair: self._selection.request())

    def rebuild(self) -> None:
        for plot, first, selected in zip((self.ulp_plot, self.nmse_plot), self.first_lines, self.selected_lines):
            for item in (first, selected):
                if item in plot.items:
                    plot.removeItem(item)
        if self.first_label in self.ulp_plot.items:
            self.ulp_plot.removeItem(self.first_label)
        for plot, line in self.part_lines:
            plot.removeItem(line)
        self.part_lines = []
        comparison = self._model.comparison
        if comparison is None:
            self._show_parts([], 0)
            self.points, self._position = [], {}
            for scatter in (*self.ulp_scatters.values(), *self.nmse_scatters.values()):
                scatter.clear()
            self.ulp_line.setData([], [])
            self.nmse_line.setData([], [])
            self.headline.setText(self._model.waiting() if self._model.has_pair else "Open a pair to see where the runs part")
            return
        series = cv.growth_series(comparison)
        self.points, self._position = series.pairs, series.position
        x = np.arange(len(series.pairs), dtype=np.float64)
        empty = np.zeros(0, dtype=np.int64)
        for status in STATUS_COLOURS:
            upper, lower = series.points.get(status, (empty, empty))
            self.ulp_scatters[status].setData(x=x[upper], y=series.ulp_log[upper], data=upper)
            self.nmse_scatters[status].setData(x=x[lower], y=series.nmse_log[lower], data=lower)
        self.ulp_line.setData(x, series.ulp_log)
        self.nmse_line.setData(x, series.nmse_log)
        self._show_parts(series.parts, len(series.pairs))
        first = cv.first_finding_pair(comparison)
        self.headline.setText(cv.headline(comparison))
        at: float | None = None
        if first is not None and id(first) in self._position:
            at = float(self._position[id(first)])
            finding = cv.first_finding(comparison)
            assert finding is not None  # it named `first`
            colour = STATUS_COLOURS.get(finding.kind, FIRST)  # the verdict strip's: red under a blue DISPATCH-ONLY strip read as another finding
            for plot, line in zip((self.ulp_plot, self.nmse_plot), self.first_lines):
                line.setPen(pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine))
                line.setPos(at)
                plot.addItem(line)
            self.first_label.setColor(colour)
            self.first_label.setText(f"first {finding.kind}: {first.key}")  # the finding's kind: a token finding keys a bit-exact logits pair
            self.ulp_plot.addItem(self.first_label)
        self.ulp_plot.autoRange()
        self.nmse_plot.autoRange()
        if series.ulp_log.size and not np.ptp(series.ulp_log):
            # One value throughout (PARITY: all 0): auto-ranged, it sat in -0.4..0.4, a ULP count below 0.
            self.ulp_plot.setYRange(0.0, max(1.0, float(series.ulp_log[0])), padding=0.05)
        if series.nmse_log.size and not np.ptp(series.nmse_log):
            # All on the floor (or one value): auto-ranged, ticks -30.4..-29.6 read as measured NMSEs.
            level = float(series.nmse_log[0])
            self.nmse_plot.setYRange(level - 1.0, level + 5.0, padding=0)
        if at is not None:
            # Above the highest point, in room added on top: drawn over the points, it hid the worst.
            low, high = self.ulp_plot.viewRange()[1]
            self.first_label.setPos(at + 0.5, high)
            self.ulp_plot.setYRange(low, high + (high - low) * LABEL_ROOM, padding=0)
        self._show_selection(self._model.selected)

    def _show_parts(self, parts: list[tuple[int, str]], ops: int) -> None:
        """Each part's name above the plots and a dotted line where it starts (the first needs none)."""
        stops = [first for first, _ in parts[1:]] + [ops]
        self.part_names.set_parts([(first - 0.5, stop - 0.5, name) for (first, name), stop in zip(parts, stops)])
        self.ulp_plot.showAxis("top", bool(parts))
        for first, _ in parts[1:]:
            for plot in (self.ulp_plot, self.nmse_plot):
                line = pg.InfiniteLine(pos=first - 0.5, angle=90, pen=pg.mkPen(PART_LINE, width=1, style=Qt.PenStyle.DotLine))
                plot.addItem(line)
                self.part_lines.append((plot, line))

    def _clicked(self, _item: pg.ScatterPlotItem, spots: list[Any], event: Any = None) -> None:
        """Points overlap when hundreds of ops share the axis: take the one nearest the click."""
        if not len(spots):
            return
        x = event.pos().x() if event is not None else spots[0].pos().x()
        nearest = min(spots, key=lambda spot: abs(spot.pos().x() - x))
        self.op_clicked.emit(self.points[int(nearest.data())])

    def _show_selection(self, pair: Any) -> None:
        if self._refresh.stale:
            return  # the points are another comparison's until the rebuild, which shows the selection
        for plot, line in zip((self.ulp_plot, self.nmse_plot), self.selected_lines):
            if pair is None or id(pair) not in self._position:
                if line in plot.items:
                    plot.removeItem(line)
                continue
            line.setPos(float(self._position[id(pair)]))
            if line not in plot.items:
                plot.addItem(line)
