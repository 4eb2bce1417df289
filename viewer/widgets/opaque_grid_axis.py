"""Plot axes whose grid lines are drawn opaque, pre-mixed with the plot's background.

pyqtgraph draws grid lines with a translucent pen, and Qt's raster engine draws a translucent
line about 30x slower than an opaque one: 60 grid lines across a 1000x730 plot take 10.9 ms
against 0.4 ms. With both grids on, one Overview paint took about 35 ms, most of the freeze
of a tab switch. Mixing each colour with the known background first draws the same pixels
where a line crosses only background; over data an opaque line would stripe it, so
`show_grid` also draws the data above the grid.
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPen


def _background(axis: pg.AxisItem) -> QColor:
    scene = axis.scene()
    views = scene.views() if scene is not None else []
    if views:
        return views[0].backgroundBrush().color()
    return pg.mkColor(pg.getConfigOption("background"))


def _opaque(pen: QPen, background: QColor) -> QPen:
    colour = pen.color()
    alpha = colour.alphaF()
    if alpha >= 1.0:
        return pen
    mixed = QColor.fromRgbF(
        colour.redF() * alpha + background.redF() * (1 - alpha),
        colour.greenF() * alpha + background.greenF() * (1 - alpha),
        colour.blueF() * alpha + background.blueF() * (1 - alpha),
    )
    opaque = QPen(pen)
    opaque.setColor(mixed)
    return opaque


class OpaqueGridAxis(pg.AxisItem):
    def generateDrawSpecs(self, p: Any) -> Any:
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs
        background = _background(self)
        return axis, [(_opaque(pen, background), start, end) for pen, start, end in ticks], texts


def grid_axes() -> dict[str, pg.AxisItem]:
    """`axisItems` for PlotItem/addPlot: the left and bottom axes, which draw the y and x grids."""
    return {"left": OpaqueGridAxis("left"), "bottom": OpaqueGridAxis("bottom")}


def show_grid(plot: pg.PlotItem, x: bool, y: bool, alpha: float) -> None:
    """`plot.showGrid`, with the plot's data drawn above its grid lines."""
    plot.showGrid(x=x, y=y, alpha=alpha)
    plot.getViewBox().setZValue(1)
