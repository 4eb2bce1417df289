"""The centre of an investigation: native, oracle and difference of one aligned pair, linked.

Heatmaps are pre-aggregated to screen size by the loader (viewer.tensor.tensor_loader), so
painting never touches the full tensor; hovering maps a pixel back to its block of elements
and inspects the worst element in it, from the full-resolution bits kept in memory. Zooming
in asks (`detail_requested`) for the region on screen at finer resolution, drawn over the
whole-slice image once it is ready, down to one pixel per element.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QMenu,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from sessions.bits.quant_blocks import block_of
from sessions.compare.slice_export import FORMATS, WHAT
from sessions.compare.tensor_diff import element_maps, worst_index
from viewer.pair_model import COLOUR_SCALES, PairModel
from viewer.tensor.difference_maps import DifferenceMaps
from viewer.tensor.display_aggregate import block_factors
from viewer.tensor.error_plots import ErrorPlots, set_title
from viewer.tensor.inspector import ElementInspector, InspectedElement, inspect
from viewer.tensor.tensor_loader import (
    DetailRegion,
    SliceSpec,
    TensorSlice,
    detail_bounds,
)
from viewer.widgets.plain_text import plain_label, plain_tip

pg.setConfigOptions(imageAxisOrder="row-major")

SCALE_TITLES = {
    "absolute": "absolute error |native − oracle|",
    "relative": "relative error |native − oracle| / |oracle|",
    "ULP": "ULP distance, as log2(1 + ULP)",
}
NATIVE_PEN = "#4a90d9"
ORACLE_PEN = "#e8913a"
DETAIL_DELAY_MS = 150
"""Wait for the zoom or pan to rest before asking for the finer region."""


class AxisPicker(QWidget):
    """Which two axes of an N-D tensor are shown, and where the others are held."""

    changed = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._shape: tuple[int, ...] = ()
        self._spec: SliceSpec | None = None
        self.rows = QComboBox()
        self.cols = QComboBox()
        for combo in (self.rows, self.cols):
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.rows.setToolTip("Axis shown as heatmap rows")
        self.cols.setToolTip("Axis shown as heatmap columns")
        self._layout.addWidget(plain_label("rows"))
        self._layout.addWidget(self.rows)
        self._layout.addWidget(plain_label("cols"))
        self._layout.addWidget(self.cols)
        self._spins: list[QSpinBox] = []
        self.rows.activated.connect(self._emit)
        self.cols.activated.connect(self._emit)

    def set_shape(self, shape: tuple[int, ...], spec: SliceSpec) -> None:
        self._shape, self._spec = shape, spec
        for spin in self._spins:
            self._layout.removeWidget(spin)
            spin.deleteLater()
        self._spins = []
        for combo, axis in ((self.rows, spec.row_axis), (self.cols, spec.col_axis)):
            combo.blockSignals(True)
            combo.clear()
            for i, n in enumerate(shape):
                combo.addItem(f"axis {i} ({n})", i)
            if axis is not None:
                combo.setCurrentIndex(axis)
            combo.blockSignals(False)
        self.rows.setEnabled(len(shape) >= 2)
        self.cols.setEnabled(len(shape) >= 2)
        for axis, n in enumerate(shape):
            if axis in (spec.row_axis, spec.col_axis):
                continue
            spin = QSpinBox()
            spin.setRange(0, max(0, n - 1))
            spin.setValue(spec.index[axis])
            spin.setPrefix(f"axis {axis} = ")
            spin.setToolTip(f"Index held on axis {axis} (size {n})")
            spin.setProperty("axis", axis)
            spin.setKeyboardTracking(False)  # typed digits count on Enter; an arrow click at once (it read 2 and showed 0)
            spin.valueChanged.connect(self._emit)
            self._layout.addWidget(spin)
            self._spins.append(spin)

    def _emit(self) -> None:
        if self._spec is None or len(self._shape) < 2:
            return
        rows, cols = int(self.rows.currentData()), int(self.cols.currentData())
        if rows == cols:
            cols = next(a for a in range(len(self._shape)) if a != rows)
        index = list(self._spec.index)
        for spin in self._spins:
            index[int(spin.property("axis"))] = spin.value()
        spec = SliceSpec(rows, cols, tuple(index))
        if spec != self._spec:
            self.changed.emit(spec)


MAPS_MIN_HEIGHT = 240
"""The three maps' least height together, 35 px of data each: with no least height, a second
banner above them (a swapped pair's warning beside the contract card) took them to 0 px, tick
labels drawn over one another; the banners scroll instead. No more: with the error plots' least
height the window must still fit a 1024x768 screen."""
ERROR_PLOTS_MIN_HEIGHT = 170
TITLE_PARTS = "  ·  "
"""Between the title's parts: three spaces each side cut a signed-zero slice's title at 1280 px."""
"""Below this the histograms' titles and axis labels run into each other (seen at 1280x720)."""


class TensorView(QWidget):
    """Linked heatmaps (or curves for 1-D), the colour-scale switch, error plots and inspector."""

    slice_requested = Signal(object)
    slice_shown = Signal()
    """A requested slice (or the reason it cannot be shown) is on screen: screenshots may be taken."""
    detail_requested = Signal(object, object, object)
    """(slice, rows, cols): the zoomed-in region [rows) x [cols) of `slice` is wanted finer."""
    detail_shown = Signal()
    export_requested = Signal(str, str)
    """(what, suffix): write the shown slice's native, oracle or difference values as .npy or .csv."""

    def __init__(self, model: PairModel, parent: QWidget | None = None, errors: ErrorPlots | None = None, maps: DifferenceMaps | None = None) -> None:
        """`errors`, `maps`: the error plots and the heatmaps, when built beforehand (the HTML
        export's camera builds its view a part per turn of the event loop)."""
        super().__init__(parent)
        self._model = model
        self.data: TensorSlice | None = None
        self._blank = False
        """Nothing drawn since the last clear: clearing again only sets the message (clearing
        re-ranges every plot and redraws its axes, ~60 ms of the first paint after a pair opens)."""
        self.detail: DetailRegion | None = None
        self.pinned: tuple[int, ...] | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.setSpacing(4)
        self.title = plain_label("Select an op in the alignment tree")
        self.title.setObjectName("sectionTitle")
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        outer.addWidget(self.title)
        top = QHBoxLayout()
        self.axes = AxisPicker()
        self.axes.changed.connect(self.slice_requested)
        top.addWidget(self.axes)
        top.addStretch(1)
        top.addWidget(plain_label("colour scale"))
        self.scale_buttons = QButtonGroup(self)
        for scale in COLOUR_SCALES:
            button = QPushButton(scale)
            button.setCheckable(True)
            button.setChecked(scale == model.scale)
            button.setToolTip(f"Colour the difference map by {SCALE_TITLES[scale]}")
            button.clicked.connect(lambda _=False, s=scale: model.set_scale(s))
            self.scale_buttons.addButton(button)
            top.addWidget(button)
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setToolTip("Write the shown slice (either side, or native - oracle) as .npy or CSV")
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        export_menu = QMenu(self.export_button)
        for what in WHAT:
            for suffix in FORMATS:
                action = export_menu.addAction(f"{what} as {suffix}")
                action.triggered.connect(lambda _=False, w=what, s=suffix: self.export_requested.emit(w, s))
        self.export_button.setMenu(export_menu)
        top.addWidget(self.export_button)
        outer.addLayout(top)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        left = QSplitter(Qt.Orientation.Vertical)
        self.maps = maps if maps is not None else DifferenceMaps()
        self.plots, self.images, self.detail_images, self.marks = self.maps.plots, self.maps.images, self.maps.detail_images, self.maps.marks
        self.value_bar, self.diff_bar = self.maps.value_bar, self.maps.diff_bar
        self._detail_timer = QTimer(self)
        self._detail_timer.setSingleShot(True)
        self._detail_timer.setInterval(DETAIL_DELAY_MS)
        self._detail_timer.timeout.connect(self._request_detail)
        self.plots["native"].vb.sigRangeChanged.connect(self._detail_timer.start)
        self.curves = {
            "native": pg.PlotDataItem(pen=pg.mkPen(NATIVE_PEN, width=1.5), name="native"),
            "oracle": pg.PlotDataItem(pen=pg.mkPen(ORACLE_PEN, width=1.5, style=Qt.PenStyle.DashLine), name="oracle"),
            "difference": pg.PlotDataItem(pen=pg.mkPen("#d64541", width=1.5), name="difference"),
        }
        self.maps.scene().sigMouseMoved.connect(self._hovered)
        self.maps.scene().sigMouseClicked.connect(self._clicked)
        self.maps.setMinimumHeight(MAPS_MIN_HEIGHT)
        left.addWidget(self.maps)
        self.errors = errors if errors is not None else ErrorPlots()
        self.errors.setMinimumHeight(ERROR_PLOTS_MIN_HEIGHT)
        left.addWidget(self.errors)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 1)
        left.setSizes([560, 190])
        splitter.addWidget(left)
        self.inspector = ElementInspector()
        # Scrolled, not squeezed: in a short window (the contract card open) its rows drew over one another.
        inspector_area = QScrollArea()
        inspector_area.setWidget(self.inspector)
        inspector_area.setWidgetResizable(True)
        inspector_area.setFrameShape(QFrame.Shape.NoFrame)
        inspector_area.setMinimumWidth(330)
        splitter.addWidget(inspector_area)
        splitter.setStretchFactor(0, 1)
        splitter.setSizes([900, 340])
        outer.addWidget(splitter, 1)
        model.scale_changed.connect(self._scale_changed)
        model.selection_changed.connect(self._selection_changed)
        self.clear(self.title.text())

    # -- data in -----------------------------------------------------------------------------

    def _selection_changed(self, pair: object) -> None:
        if pair is None:
            self.clear(self._model.missing_side_text() or "Select an op in the alignment tree")

    def clear(self, message: str) -> None:
        self.title.setText(message)
        if self._blank:
            self.slice_shown.emit()
            return
        self._blank = True
        self.data = None
        self.pinned = None
        self._clear_detail()
        for image in self.images.values():
            image.clear()
        for mark in self.marks.values():
            mark.clear()
        for plot in self.plots.values():
            plot.setVisible(True)
            for side in ("left", "bottom"):
                plot.getAxis(side).setStyle(showValues=False)  # no made-up ticks over maps with nothing in them
        self._drop_curves()
        self.errors.clear_all()
        self.inspector.clear()
        self._show_plots(False)
        self.slice_shown.emit()

    def _show_plots(self, shown: bool) -> None:
        """The maps and error plots drawn, or (nothing to show) hidden inside their unchanged
        widgets: a cleared plot re-laid out its axes over 3-4 paints, 5-15 ms each, and a
        re-opened 240,000-record pair's window stalled 124-141 ms as the old op's plots cleared."""
        for layout in (self.maps.ci, self.errors.ci):
            layout.setVisible(shown)

    def show_loading(self, label: str) -> None:
        self.title.setText(f"Loading {label} …")

    def show_slice(self, data: TensorSlice) -> None:
        self._blank = False
        self.data = data
        self.inspector.label = data.request.label
        self.pinned = None
        self._clear_detail()
        self._show_title()
        self.axes.set_shape(data.shape, data.spec)
        self.axes.setVisible(len(data.shape) >= 2)
        for plot in self.plots.values():
            for side in ("left", "bottom"):
                plot.getAxis(side).setStyle(showValues=True)
        self._draw()
        self._fit_view()
        self.errors.show_slice(data)
        self._show_plots(True)
        if data.worst is not None:
            self.select_element(data.worst, pinned=True)
        else:
            self.select_element((0, 0) if not data.is_1d else (0,), pinned=True)
        self.slice_shown.emit()

    def _show_title(self) -> None:
        data = self.data
        assert data is not None
        shape = "×".join(str(n) for n in data.shape)
        verdict = "bit-exact" if data.differing == 0 else f"{data.differing:,} of {data.total:,} shown elements differ"
        factors = data.factors
        if factors == (1, 1):
            shrink = ""
        elif self.detail is not None:
            (r0, r1), (c0, c1) = self.detail.rows, self.detail.cols
            fy, fx = self.detail.factors
            each = "1 px each" if (fy, fx) == (1, 1) else f"1 px per {fy}×{fx} block"
            shrink = f"{TITLE_PARTS}zoomed: {r1 - r0}×{c1 - c0} at {each}"
        else:
            # Short: the title is one line, and the longer "shown at ... (max); zoom in for detail" was cut mid-word at 1280.
            shrink = f"{TITLE_PARTS}1 px per {factors[0]}×{factors[1]} (max; zoom in)"
        notes = "".join(f"{TITLE_PARTS}{note}" for note in data.notes)
        title = f"{data.request.label}{TITLE_PARTS}{data.request.dtype} [{shape}]{TITLE_PARTS}{verdict}{shrink}{notes}"
        self.title.setText(title)
        self.title.setToolTip(plain_tip(title))  # whole, where a narrow window cuts it

    def _scale_changed(self, scale: str) -> None:
        for button in self.scale_buttons.buttons():
            button.setChecked(button.text() == scale)
        if self.data is not None:
            self._draw()

    # -- drawing -----------------------------------------------------------------------------

    def _drop_curves(self) -> None:
        for name, curve in self.curves.items():
            for plot in self.plots.values():
                if curve in plot.items:
                    plot.removeItem(curve)

    def _draw(self) -> None:
        data = self.data
        if data is None:
            return
        scale = self._model.scale
        set_title(self.plots["difference"], f"difference: {SCALE_TITLES[scale]}")
        self._drop_curves()
        for plot in self.plots.values():
            plot.invertY(not data.is_1d)  # a map's row 0 on top; a curve's larger values up
        if data.is_1d:
            self._draw_curves(data, scale)
            return
        self.plots["oracle"].setVisible(True)
        rows, cols = data.native_bits.shape
        rect = QRectF(0, 0, cols, rows)
        for name, key in (("native", "native"), ("oracle", "oracle"), ("difference", scale)):
            item = self.images[name]
            item.setImage(data.rgba[key], autoLevels=False, levels=None)
            item.setRect(rect)
        self.value_bar.setLevels(data.levels["values"])
        self.diff_bar.setLevels(data.levels[scale])
        self._draw_detail()

    def _fit_view(self) -> None:
        """Show the whole of a new slice (a colour-scale switch keeps the user's zoom)."""
        data = self.data
        assert data is not None
        if data.is_1d:
            # The whole x range first: a curve clipped to the view fits its clipped points, and
            # from the default range only three of sixteen were ever drawn.
            self.plots["native"].setXRange(0, max(1, data.native_bits.size - 1), padding=0)
            self.plots["native"].autoRange()
        else:
            rows, cols = data.native_bits.shape
            self.plots["native"].setRange(QRectF(0, 0, cols, rows), padding=0)

    # -- zoomed-in detail --------------------------------------------------------------------

    def _clear_detail(self) -> None:
        self.detail = None
        for image in self.detail_images.values():
            image.clear()

    def _request_detail(self) -> None:
        data = self.data
        if data is None or data.is_1d:
            return
        (x0, x1), (y0, y1) = self.plots["native"].vb.viewRange()
        bounds = detail_bounds(data, (y0, y1), (x0, x1))
        if bounds is None:
            if self.detail is not None:
                self._clear_detail()
                self._show_title()
            return
        (r0, r1), (c0, c1) = bounds
        wanted = block_factors((r1 - r0, c1 - c0))
        detail = self.detail
        covered = detail is not None and detail.rows[0] <= y0 and y1 <= detail.rows[1] and detail.cols[0] <= x0 and x1 <= detail.cols[1]
        if covered and detail is not None and detail.factors[0] <= wanted[0] and detail.factors[1] <= wanted[1]:
            return
        self.detail_requested.emit(data, *bounds)

    def show_detail(self, detail: DetailRegion) -> None:
        """Draw a finer region over the whole-slice images (ignored if another slice is shown)."""
        if detail.data is not self.data:
            return
        self.detail = detail
        self._draw_detail()
        self._show_title()
        self.detail_shown.emit()

    def _draw_detail(self) -> None:
        detail = self.detail
        if detail is None:
            return
        (r0, r1), (c0, c1) = detail.rows, detail.cols
        rect = QRectF(c0, r0, c1 - c0, r1 - r0)
        for name, key in (("native", "native"), ("oracle", "oracle"), ("difference", self._model.scale)):
            item = self.detail_images[name]
            item.setImage(detail.rgba[key], autoLevels=False, levels=None)
            item.setRect(rect)

    def _draw_curves(self, data: TensorSlice, scale: str) -> None:
        for image in self.images.values():
            image.clear()
        # Into their plots before they hold data: pyqtgraph adds an item to the scene before its
        # view box, and a clipped curve with data asked the window, not a view box, for its range.
        self.plots["native"].addItem(self.curves["native"])
        self.plots["native"].addItem(self.curves["oracle"])
        self.plots["difference"].addItem(self.curves["difference"])
        for curve in self.curves.values():
            # After addItem, which sets both to its plot's defaults (off): every point of a 1-D
            # tensor was drawn, a 65,536-element one repainted in 1.2 s and a million held the window.
            curve.setDownsampling(auto=True, method="peak")
            curve.setClipToView(True)
        x = np.arange(data.native_bits.size)
        self.curves["native"].setData(x, data.images["native"])
        self.curves["oracle"].setData(x, data.images["oracle"])
        self.curves["difference"].setData(x, data.images[scale])
        set_title(self.plots["native"], "native (blue) and oracle (orange, dashed)")
        self.plots["oracle"].setVisible(False)

    # -- inspection --------------------------------------------------------------------------

    def _element_at(self, scene_pos: QPointF) -> tuple[int, ...] | None:
        data = self.data
        if data is None:
            return None
        for plot in self.plots.values():
            if not plot.isVisible() or not plot.sceneBoundingRect().contains(scene_pos):
                continue
            point = plot.vb.mapSceneToView(scene_pos)
            if data.is_1d:
                col = int(round(point.x()))
                return (col,) if 0 <= col < data.native_bits.size else None
            row, col = int(np.floor(point.y())), int(np.floor(point.x()))
            rows, cols = data.native_bits.shape
            if not (0 <= row < rows and 0 <= col < cols):
                return None
            return self._worst_in_block(row, col)
        return None

    def _worst_in_block(self, row: int, col: int) -> tuple[int, int]:
        """The pixel under the cursor is a block of elements: inspect the one that differs most."""
        data = self.data
        assert data is not None
        (fy, fx), (origin_row, origin_col) = data.factors, (0, 0)
        detail = self.detail
        if detail is not None and detail.rows[0] <= row < detail.rows[1] and detail.cols[0] <= col < detail.cols[1]:
            (fy, fx), (origin_row, origin_col) = detail.factors, (detail.rows[0], detail.cols[0])
        if (fy, fx) == (1, 1):
            return (row, col)
        r0 = origin_row + (row - origin_row) // fy * fy
        c0 = origin_col + (col - origin_col) // fx * fx
        nb = data.native_bits[r0 : r0 + fy, c0 : c0 + fx]
        ob = data.oracle_bits[r0 : r0 + fy, c0 : c0 + fx]
        abs_err, _, ulp = element_maps(nb, ob, data.dtype)
        ulp = np.where(np.isnan(ulp), np.inf, ulp)
        r, c = np.unravel_index(worst_index(ulp, abs_err != 0), ulp.shape)
        return (r0 + int(r), c0 + int(c))

    def _hovered(self, scene_pos: QPointF) -> None:
        if self.pinned is not None:
            return
        where = self._element_at(scene_pos)
        if where is not None:
            self.select_element(where, pinned=False)

    def _clicked(self, event: object) -> None:
        where = self._element_at(event.scenePos())  # type: ignore[attr-defined]
        if where is None:
            return
        if self.pinned == where:
            self.pinned = None
            self.inspector.unpinned()
            return
        self.select_element(where, pinned=True)

    def select_element(self, where: tuple[int, ...], pinned: bool) -> InspectedElement | None:
        """Show one element of the shown slice (row, col), or (index,) for 1-D, in the inspector."""
        data = self.data
        if data is None:
            return None
        coordinate = data.spec.coordinate(where[0] if len(where) == 2 else None, where[-1])
        block = None
        if data.raw_blocks is not None:
            flat = int(np.ravel_multi_index(coordinate, data.shape)) if data.shape else 0
            block = block_of(*data.raw_blocks, data.request.dtype, flat)
        element = inspect(
            coordinate=coordinate,
            native_bits=data.native_bits[where],
            oracle_bits=data.oracle_bits[where],
            dtype=data.dtype,
            pinned=pinned,
            block=block,
        )
        self.pinned = where if pinned else None
        self.inspector.show_element(element)
        if data.is_1d:
            spot = [{"pos": (where[0], float(data.images["native"][where[0]]))}]
            for name, mark in self.marks.items():
                mark.setData(spot if name == "native" else [])
        else:
            spot = [{"pos": (where[1] + 0.5, where[0] + 0.5)}]
            for mark in self.marks.values():
                mark.setData(spot)
        return element

