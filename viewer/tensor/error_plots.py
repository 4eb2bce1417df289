"""Where the error lives in one tensor: ULP and |error| histograms, per-row and per-head maxima.

The ULP histogram and the profiles are the diff engine's metrics of the whole pair
(sessions.compare.tensor_diff.TensorMetrics); the |error| histogram bins the element maps of the
slice on screen.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from sessions.compare.tensor_diff import AxisProfile, TensorMetrics
from viewer.tensor.tensor_loader import ABS_EDGES, TensorSlice
from viewer.widgets.opaque_grid_axis import grid_axes, show_grid

EXACT = "#2e9d57"
NO_DIFFERENCE = "no differing\nelements"
"""Two lines: one overran its neighbour plot at 1280x720."""
HOT = "#d64541"
MUTED = "#8a8f98"


def ulp_bucket_label(k: int) -> str:
    """TensorMetrics.ulp_histogram bucket k holds (2^(k-1), 2^k] ULP; bucket 0 is exactly 1."""
    return "1" if k == 0 else f"2^{k}"


class ErrorPlots(pg.GraphicsLayoutWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ci.setContentsMargins(2, 2, 2, 2)
        self.ci.layout.setHorizontalSpacing(2)
        self.ulp_plot = self.addPlot(title="ULP steps", axisItems=grid_axes(), enableMenu=False)
        self.abs_plot = self.addPlot(title="|error|", axisItems=grid_axes(), enableMenu=False)
        self.row_plot = self.addPlot(title="max ULP / row", axisItems=grid_axes(), enableMenu=False)
        self.head_plot = self.addPlot(title="max ULP / head", axisItems=grid_axes(), enableMenu=False)
        # At 1280x720 four plots share ~500 px: one y label says what both histograms count, and
        # the profiles' axes are wide enough for maxima like 30000.
        for plot, left_width in zip(self.plots, (42, 30, 48, 48)):
            plot.titleLabel.opts["size"] = "9pt"
            plot.setTitle(plot.titleLabel.text)
            show_grid(plot, x=False, y=True, alpha=0.2)
            plot.getAxis("left").setWidth(left_width)
            for side in ("left", "bottom"):
                plot.getAxis(side).enableAutoSIPrefix(False)
            plot.setMinimumWidth(90)
        self.ulp_plot.getAxis("left").setLabel("log10(1+n)")
        self.ulp_plot.setToolTip("differing elements by ULP steps apart; bar heights log10(1 + count)")
        self.abs_plot.setToolTip("differing elements of the shown slice by |native - oracle|; bar heights log10(1 + count)")
        self.ulp_plot.getAxis("bottom").setLabel("ULP ≤")
        self.row_plot.getAxis("bottom").setLabel("row")
        self.head_plot.getAxis("bottom").setLabel("head")
        self.abs_plot.getAxis("bottom").setLabel("log10")
        abs_ticks = [(i, f"{int(round(np.log10(ABS_EDGES[i + 1])))}") for i in range(0, len(ABS_EDGES) - 1, 8)]
        self.abs_plot.getAxis("bottom").setTicks(_two_then_the_rest(abs_ticks, (1, 3)))

    @property
    def plots(self) -> tuple[pg.PlotItem, ...]:
        return (self.ulp_plot, self.abs_plot, self.row_plot, self.head_plot)

    def clear_all(self, values: bool = False) -> None:
        """Empty every plot; `values`: whether the axes number an empty plot (they do not, so
        an empty panel is not a stack of made-up ticks)."""
        for plot in self.plots:
            plot.clear()
            plot.enableAutoRange()
            for side in ("left", "bottom"):
                plot.showAxis(side, True)
                plot.getAxis(side).setStyle(showValues=values)

    def show_slice(self, data: TensorSlice) -> None:
        self.clear_all(values=True)
        metrics = data.request.metrics
        histogram = np.asarray(metrics.ulp_histogram if metrics is not None else [], dtype=np.float64)
        used = int(np.nonzero(histogram)[0].max()) + 1 if histogram.any() else 1
        if data.raw_blocks is not None:
            _message(self.ulp_plot, "quantized: blocks are\ncompared byte by byte", MUTED)
        else:
            self._bars(self.ulp_plot, histogram[: max(used, 4)])
        ticks = [(k, ulp_bucket_label(k)) for k in range(max(used, 4))]
        self.ulp_plot.getAxis("bottom").setTicks(_two_then_the_rest(ticks, (0, 2 * (len(ticks) - 1) // 3)))
        self._bars(self.abs_plot, data.abs_hist.astype(np.float64), _no_error_text(metrics))
        exact = metrics is not None and metrics.differing == 0
        zeros = metrics is not None and metrics.differing > 0 and metrics.signed_zero_only == metrics.differing
        self._profile(self.row_plot, metrics.per_row if metrics is not None else None, "row", curve=True, exact=exact, signed_zeros_only=zeros)
        self._profile(self.head_plot, metrics.per_head if metrics is not None else None, "head", curve=False, exact=exact, signed_zeros_only=zeros)

    @staticmethod
    def _bars(plot: pg.PlotItem, counts: np.ndarray, empty: str = NO_DIFFERENCE) -> None:
        if counts.size == 0 or not counts.any():
            _message(plot, empty, EXACT)
            return
        heights = np.log10(counts + 1.0)
        plot.addItem(pg.BarGraphItem(x=np.arange(counts.size), height=heights, width=0.85, brush=HOT, pen=None))

    @staticmethod
    def _profile(plot: pg.PlotItem, profile: AxisProfile | None, name: str, curve: bool, exact: bool, signed_zeros_only: bool) -> None:
        """`exact`: nothing differs, so no profile was kept; a bit-exact [5, 384] tensor read "no row axis"."""
        if profile is None and exact:
            set_title(plot, f"max ULP / {name}")
            plot.setToolTip(f"no {name} differs")
            _message(plot, NO_DIFFERENCE, EXACT)
            return
        if profile is None:
            set_title(plot, f"per {name}: n/a")
            plot.setToolTip(f"this op has no {name} axis")
            _message(plot, f"no {name} axis", MUTED)
            return
        set_title(plot, f"max ULP / {name}")
        if signed_zeros_only:
            # Each swap is 1 ULP by bits and no error: a line at 1 over every row read as a 1-ULP error.
            plot.setToolTip(f"{int(np.count_nonzero(profile.differing))} of {len(profile.differing)} {name}s hold +0/-0 swaps, and nothing else differs")
            _message(plot, "+0/-0 swaps\nonly", MUTED)
            return
        values = np.asarray(profile.max_ulp, dtype=np.float64)
        plot.setToolTip(f"{int(np.count_nonzero(values))} of {values.size} {name}s differ")
        if curve:
            # One row (every decode step's op) is a line of one point, which draws nothing: a dot marks it.
            dot = {"symbol": "o", "symbolSize": 6, "symbolBrush": HOT, "symbolPen": None} if values.size == 1 else {}
            item = pg.PlotDataItem(np.arange(values.size), values, pen=pg.mkPen(HOT, width=1.5), **dot)
            plot.addItem(item)
            item.setDownsampling(auto=True, method="peak")
        else:
            brushes = [HOT if v > 0 else EXACT for v in values]
            plot.addItem(pg.BarGraphItem(x=np.arange(values.size), height=np.maximum(values, 0.02 * max(1.0, values.max())), width=0.8, brushes=brushes))


def _no_error_text(metrics: TensorMetrics | None) -> str:
    """What an empty |error| plot says: elements that differ only by sign, or only where a side is
    NaN, have no |error| to draw, which is not "no differing elements" (a signed-zero op's header
    counted 21 differing elements above that message)."""
    if metrics is None or metrics.differing == 0:
        return NO_DIFFERENCE
    if metrics.signed_zero_only == metrics.differing:
        return "|error| 0: signed\nzeros only"
    return "no finite\n|error|"


def _two_then_the_rest(ticks: list[tuple[int, str]], chosen: tuple[int, int]) -> list[list[tuple[int, str]]]:
    """Tick levels: pyqtgraph always labels the first level and the next only where it has room.
    The first level is two ticks (`chosen`, indices into `ticks`) far enough apart to fit a plot
    ~80 px wide (four of them at 1280x720) and inside it (a label at the very edge is dropped):
    two labels give the scale and its direction, where one ("1e-4") gave neither."""
    first = [ticks[i] for i in sorted(set(chosen)) if 0 <= i < len(ticks)]
    return [first, [tick for tick in ticks if tick not in first]]


def _message(plot: pg.PlotItem, text: str, colour: str) -> None:
    """A sentence in place of a plot that has nothing to draw (axes hidden: they would mean nothing)."""
    for side in ("left", "bottom"):
        plot.showAxis(side, False)
    item = pg.TextItem(text, color=colour, anchor=(0.5, 0.5))
    item.setPos(0.5, 0.5)
    plot.addItem(item)
    plot.setXRange(0, 1, padding=0)
    plot.setYRange(0, 1, padding=0)


def set_title(plot: pg.PlotItem, title: str) -> None:
    """PlotItem.setTitle relayouts the whole GraphicsLayout even for the same text; skip it then."""
    if plot.titleLabel.text != title:
        plot.setTitle(title)
