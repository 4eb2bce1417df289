"""Dark and light themes from assets/, applied to both Qt widgets and pyqtgraph plots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon
from PySide6.QtWidgets import QApplication, QWidget

from sessions.compare.verdict import PARITY, Kind
from sessions.report.word_colours import WORD_COLOURS
from viewer.comparison_view import BY_DESIGN_STATUS

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class Palette:
    name: str
    plot_background: str
    plot_foreground: str


PALETTES = {
    "dark": Palette("dark", "#161a20", "#c9d1db"),
    "light": Palette("light", "#ffffff", "#2a3240"),
}

STATUS_COLOURS: dict[str, str] = {
    Kind.BIT_EXACT: WORD_COLOURS[PARITY],
    Kind.WITHIN_TOLERANCE: "#c9a227",
    Kind.DIVERGED: "#d64541",
    Kind.SIGNED_ZERO_ONLY: "#e07b39",
    Kind.CONTRACT_MISMATCH: "#9b59d0",
    Kind.DISPATCH_ONLY: "#2f86c9",
    Kind.UNALIGNED: "#b03a2e",
    BY_DESIGN_STATUS: "#8a8f98",
    Kind.POST_EOS: "#6b7480",
    Kind.TOKENS: "#d64541",
}
"""One colour per verdict kind (sessions.compare.verdict), also used by the status icons in assets/;
bit-exact is the PARITY word's green, so the tree's icons and the verdict strip are one green."""
LOCALITY_COLOURS: dict[str, str] = {"local": "#d64541", "inherited": "#8a8f98", "covered": "#8a8f98", "undetermined": "#c9a227"}
"""A diagnosed op's cause (backends.diagnosis.classify.Locality): local ops are where to look."""


def locality_colour(word: str) -> QColor:
    return QColor(LOCALITY_COLOURS.get(word, LOCALITY_COLOURS["undetermined"]))


def asset(name: str) -> Path:
    return ASSETS / name


def icon(name: str) -> QIcon:
    return QIcon(str(asset(name)))


def status_icon(status: str) -> QIcon:
    return icon(f"status-{status.replace(' ', '-')}.svg")


def status_colour(status: str) -> QColor:
    return QColor(STATUS_COLOURS.get(status, STATUS_COLOURS[BY_DESIGN_STATUS]))


def apply_theme(app: QApplication, name: str) -> Palette:
    """Style sheet for widgets; pyqtgraph reads its colours at item creation, so set them first."""
    palette = PALETTES[name]
    app.setStyleSheet(asset(f"{name}.qss").read_text(encoding="utf-8"))
    pg.setConfigOptions(background=palette.plot_background, foreground=palette.plot_foreground, antialias=False)
    return palette


def restyle_plots(root: QWidget, palette: Palette) -> None:
    """Recolour every plot under `root` for a theme: pyqtgraph items take their colours when
    created, so a switched theme would leave dark-theme titles and axes on a white plot."""
    views = root.findChildren(pg.GraphicsView)
    for view in [root, *views] if isinstance(root, pg.GraphicsView) else views:
        view.setBackground(palette.plot_background)
        for item in view.scene().items():
            if isinstance(item, pg.AxisItem):
                item.setPen(palette.plot_foreground)
                item.setTextPen(palette.plot_foreground)
            elif isinstance(item, pg.LabelItem):
                item.setText(item.text, color=palette.plot_foreground)
            elif isinstance(item, pg.TextItem) and item.fill.style() != Qt.BrushStyle.NoBrush:
                item.fill = pg.mkBrush(palette.plot_background)  # a label's backing (the Overview's first finding) kept the dark fill
                item.update()
