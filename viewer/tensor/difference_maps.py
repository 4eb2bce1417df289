"""The heatmaps of one pair, linked: native, oracle and their difference, with their colour bars.

A widget of its own, apart from the tensor view that fills and reads it: the HTML export's camera
builds one while the window stays responsive, a part per turn of the event loop (the maps are
three plots and two colour bars, 45 ms of the view's 58 ms to build).
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

MAPS = ("native", "oracle", "difference")
MARK = "#00e5ff"
"""The pinned element's square on every map."""


class DifferenceMaps(pg.GraphicsLayoutWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ci.setSpacing(2)
        self.plots: dict[str, pg.PlotItem] = {}
        self.images: dict[str, pg.ImageItem] = {}
        self.detail_images: dict[str, pg.ImageItem] = {}
        """The zoomed-in region at finer resolution, drawn over the whole slice's image."""
        self.marks: dict[str, pg.ScatterPlotItem] = {}
        for row, name in enumerate(MAPS):
            plot = self.addPlot(row=row, col=0, title=name, enableMenu=False)  # no view-box menu built (one made, then disabled, was a quarter of building this view)
            plot.invertY(True)
            plot.getAxis("left").setWidth(44)
            if name != "difference":
                plot.hideAxis("bottom")  # the maps share their columns (linked below): one column axis, under the last, leaves the maps their height
            image = pg.ImageItem()
            plot.addItem(image)
            detail = pg.ImageItem()
            detail.setZValue(1)
            plot.addItem(detail)
            mark = pg.ScatterPlotItem(size=14, pen=pg.mkPen(MARK, width=2), brush=None, symbol="s")
            mark.setZValue(2)
            plot.addItem(mark)
            self.plots[name], self.images[name], self.detail_images[name], self.marks[name] = plot, image, detail, mark
        # The bars label the scales; the images arrive already coloured with the same maps.
        self.value_bar = pg.ColorBarItem(colorMap=pg.colormap.get("viridis"), interactive=False, width=12)
        self.addItem(self.value_bar, row=0, col=1, rowspan=2)
        self.diff_bar = pg.ColorBarItem(colorMap=pg.colormap.get("inferno"), interactive=False, width=12)
        self.addItem(self.diff_bar, row=2, col=1)
        for name in ("oracle", "difference"):
            self.plots[name].setXLink(self.plots["native"])
            self.plots[name].setYLink(self.plots["native"])
