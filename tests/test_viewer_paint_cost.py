"""What keeps a panel switch from freezing the window: opaque grid lines and hidden panels
laid out and painted before they are shown."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from sessions.progress import Progress
from viewer.settings import ViewerSettings
from viewer.theme import PALETTES, restyle_plots
from viewer.widgets.opaque_grid_axis import OpaqueGridAxis, grid_axes
from viewer.window.main_window import MainWindow
from viewer.window.panel_tabs import PanelTabs

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def _plot(qtbot: QtBot, axis_items: dict[str, pg.AxisItem] | None, background: str) -> pg.PlotWidget:
    widget = pg.PlotWidget(background=background, axisItems=axis_items)
    qtbot.addWidget(widget)
    widget.resize(400, 300)
    widget.showGrid(x=True, y=True, alpha=0.15)
    widget.setRange(xRange=(0, 100), yRange=(0, 10), padding=0)
    return widget


def _pixels(widget: pg.PlotWidget) -> np.ndarray:
    """RGB of the widget as drawn, shape (height, width, 3)."""
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    pixels = np.frombuffer(image.constBits(), dtype=np.uint8).reshape(image.height(), image.bytesPerLine())
    bgra = pixels[:, : image.width() * 4].reshape(image.height(), image.width(), 4)
    return bgra[..., 2::-1].astype(int).copy()


def _assert_same_grid(opaque: np.ndarray, translucent: np.ndarray, background: str) -> None:
    """Identical except where two grid lines cross: translucent lines blend twice there."""
    bg = np.array([int(background[i : i + 2], 16) for i in (1, 3, 5)])
    drawn = np.abs(translucent - bg).sum(axis=2) > 0
    height, width = drawn.shape
    horizontal = drawn.sum(axis=1) > width // 2
    vertical = drawn.sum(axis=0) > height // 2
    assert horizontal.sum() >= 10 and vertical.sum() >= 10, "both grids are drawn"
    crossings = np.outer(horizontal, vertical)
    difference = np.abs(opaque - translucent).max(axis=2)
    assert difference[~crossings].max() <= 1
    assert (difference > 1).sum() <= crossings.sum()


@pytest.mark.parametrize("background", ["#161a20", "#ffffff"])
def test_opaque_grid_draws_the_pixels_of_pyqtgraphs_translucent_grid(qtbot: QtBot, background: str) -> None:
    translucent = _pixels(_plot(qtbot, None, background))
    opaque = _pixels(_plot(qtbot, grid_axes(), background))
    _assert_same_grid(opaque, translucent, background)


def test_opaque_grid_is_mixed_anew_when_the_theme_changes(qtbot: QtBot) -> None:
    light = PALETTES["light"]
    switched = _plot(qtbot, grid_axes(), PALETTES["dark"].plot_background)
    _pixels(switched)
    restyle_plots(switched, light)
    fresh = _plot(qtbot, None, light.plot_background)
    restyle_plots(fresh, light)
    _assert_same_grid(_pixels(switched), _pixels(fresh), light.plot_background)
    assert isinstance(switched.getPlotItem().getAxis("left"), OpaqueGridAxis)


def test_a_theme_switch_recolours_plot_titles_and_axes(qtbot: QtBot, tmp_path: Path) -> None:
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.toggle_theme()
    foreground = PALETTES[window.settings.theme()].plot_foreground
    for plot in (window.overview.ulp_plot, window.tensor_view.plots["native"], window.tensor_view.errors.row_plot):
        assert plot.titleLabel.opts["color"] == foreground
        assert plot.getAxis("left").textPen().color().name() == foreground
    window.close()


class _EventCounter(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[QEvent.Type] = Counter()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        self.count[event.type()] += 1
        return False


def test_hidden_panels_follow_the_shown_panels_size(qtbot: QtBot) -> None:
    tabs = PanelTabs()
    qtbot.addWidget(tabs)
    pages = [QLabel(f"page {i}") for i in range(3)]
    for i, page in enumerate(pages):
        tabs.addTab(page, f"tab {i}")
    tabs.resize(700, 500)
    tabs.show()
    qtbot.waitExposed(tabs)
    tabs.resize(900, 600)
    qtbot.waitUntil(lambda: pages[0].width() > 800)
    assert [p.geometry() for p in pages[1:]] == [pages[0].geometry()] * 2


def _shown_window(qtbot: QtBot, tmp_path: Path) -> MainWindow:
    """A shown 1440x900 window with no pair."""
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(1440, 900)
    window.show()
    return window


def _idle_empty_window(qtbot: QtBot, tmp_path: Path) -> MainWindow:
    """A shown window with no pair whose panels were painted offscreen behind the drop hint."""
    window = _shown_window(qtbot, tmp_path)
    qtbot.waitExposed(window)
    qtbot.waitUntil(lambda: not window.tabs.prerendering, timeout=10_000)
    return window


def test_an_idle_window_paints_its_hidden_panels_once_and_then_rests(qtbot: QtBot, tmp_path: Path) -> None:
    """Painting a hidden page offscreen sends it a resize to its own size; taken for a new size,
    it started the next round of offscreen paints, forever, while the window sat idle."""
    window = _idle_empty_window(qtbot, tmp_path)
    busy = []
    for _ in range(40):
        qtbot.wait(25)
        busy.append(window.tabs.prerendering)
    assert not any(busy)
    window.close()


def test_opening_a_pair_shows_panels_laid_out_at_their_size_and_a_strip_that_was_already_there(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """The panels wait behind the drop hint at the size they are shown at, below a verdict strip
    that is there from the start: opening a pair resizes no plot (a resize re-ranged every plot
    and redrew its axes in the first paint)."""
    window = _idle_empty_window(qtbot, tmp_path)
    strip = window.verdict_strip
    assert strip.isVisible() and strip.word.text() == "No pair open"
    height = strip.height()
    events = {name: _EventCounter() for name in ("maps", "errors")}
    window.tensor_view.maps.installEventFilter(events["maps"])
    window.tensor_view.errors.installEventFilter(events["errors"])
    window.open_pair(*demo_pairs["clean"])
    qtbot.waitUntil(lambda: window.tensor_view.maps.isVisible())
    qtbot.wait(50)
    assert {name: counter.count[QEvent.Type.Resize] for name, counter in events.items()} == {"maps": 0, "errors": 0}
    assert strip.height() == height and strip.word.text() in ("Comparing…", "PARITY")
    window.close()


def test_a_verdict_with_a_finding_arrives_without_resizing_the_strip_or_the_plots(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """The strip keeps one height from "Comparing…" to a two-line finding with its button: when
    it grew, every panel below was resized and every plot's axes redrawn in the arrival."""
    window = _idle_empty_window(qtbot, tmp_path)
    window.resize(1280, 720)
    qtbot.waitUntil(lambda: not window.tabs.prerendering, timeout=10_000)
    strip = window.verdict_strip
    window.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: window.tensor_view.maps.isVisible())
    height = strip.height()
    events = {name: _EventCounter() for name in ("maps", "errors")}
    window.tensor_view.maps.installEventFilter(events["maps"])
    window.tensor_view.errors.installEventFilter(events["errors"])
    qtbot.waitUntil(lambda: window.model.comparison is not None, timeout=60_000)
    qtbot.waitUntil(lambda: window.tensor_view.data is not None and not window.tasks.busy, timeout=60_000)
    assert strip.go.isVisible() and strip.word.text() == "DIVERGENCE"
    assert strip.detail.heightForWidth(strip.detail.width()) > strip.detail.fontMetrics().lineSpacing()
    assert strip.height() == height
    assert {name: counter.count[QEvent.Type.Resize] for name, counter in events.items()} == {"maps": 0, "errors": 0}
    window.close()


def test_the_plots_of_an_op_no_longer_shown_are_hidden_inside_their_widgets_not_cleared_in_view(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """Cleared in view, each plot re-laid out its axes over 3-4 paints: re-opening a
    240,000-record pair stalled the window 124-141 ms. Hidden, nothing of the old op is drawn,
    the widgets keep their size, and the next op's plots are drawn again."""
    window = _idle_empty_window(qtbot, tmp_path)
    view = window.tensor_view
    layouts = (view.maps.ci, view.errors.ci)
    assert not any(layout.isVisible() for layout in layouts), "an empty window draws no plots"
    window.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: view.data is not None and not window.tasks.busy, timeout=60_000)
    assert all(layout.isVisible() for layout in layouts)
    sizes = (view.maps.size(), view.errors.size())
    window.model.select(None)
    assert view.data is None and not any(layout.isVisible() for layout in layouts)
    assert (view.maps.size(), view.errors.size()) == sizes
    window.findings.jump_to_first()
    qtbot.waitUntil(lambda: view.data is not None and not window.tasks.busy, timeout=60_000)
    assert all(layout.isVisible() for layout in layouts)
    window.close()


def test_a_progress_step_is_drawn_with_the_window_not_at_once(qtbot: QtBot, tmp_path: Path) -> None:
    """A progress bar that repainted itself at once drew everything else waiting in the window
    with it (the heatmaps and plots, on each step of an opening)."""
    window = _idle_empty_window(qtbot, tmp_path)
    window.progress.setVisible(True)
    qtbot.waitUntil(lambda: window.progress.isVisible())
    qtbot.wait(50)
    waiting, bar = _EventCounter(), _EventCounter()
    window.tree.view.viewport().installEventFilter(waiting)
    window.progress.installEventFilter(bar)
    window.tree.view.viewport().update()
    window.tasks.progressed.emit(Progress(1, 4, "reading"))
    assert (waiting.count[QEvent.Type.Paint], bar.count[QEvent.Type.Paint]) == (0, 0)
    qtbot.waitUntil(lambda: bar.count[QEvent.Type.Paint] > 0)
    assert waiting.count[QEvent.Type.Paint] == 1 and window.progress.text() == "reading  25%"
    window.close()


def _compared_window(qtbot: QtBot, tmp_path: Path, pair: tuple[Path, Path]) -> MainWindow:
    """A shown 1440x900 window that has compared `pair` and finished prerendering its panels."""
    window = _shown_window(qtbot, tmp_path)
    window.open_pair(*pair)
    qtbot.waitUntil(lambda: window.model.comparison is not None, timeout=60_000)
    qtbot.waitUntil(lambda: not window.tabs.prerendering, timeout=10_000)
    return window


def _show_overview(qtbot: QtBot, window: MainWindow) -> _EventCounter:
    """Switch to the Overview; the events its plot received on the way."""
    assert window.overview.geometry() == window.tensor_view.geometry()
    events = _EventCounter()
    window.overview.plot_widget.installEventFilter(events)
    window.show_panel(1)
    qtbot.waitUntil(lambda: events.count[QEvent.Type.Show] > 0)
    qtbot.wait(50)
    return events


def test_after_a_comparison_the_hidden_overview_is_laid_out_before_it_is_shown(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """Shown without a resize, the Overview's first paint on a click reuses what prerendering
    computed: no new range, axes or labels, so one ordinary paint."""
    window = _compared_window(qtbot, tmp_path, demo_pairs["swiglu-order"])
    events = _show_overview(qtbot, window)
    assert events.count[QEvent.Type.Show] == 1
    assert events.count[QEvent.Type.Resize] == 0
    window.close()


def test_after_a_window_resize_the_hidden_overview_is_laid_out_again_before_it_is_shown(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    window = _compared_window(qtbot, tmp_path, demo_pairs["clean"])
    window.resize(1200, 800)
    qtbot.waitUntil(lambda: window.tabs.prerendering, timeout=5_000)
    qtbot.waitUntil(lambda: not window.tabs.prerendering, timeout=10_000)
    events = _show_overview(qtbot, window)
    assert events.count[QEvent.Type.Resize] == 0
    window.close()
