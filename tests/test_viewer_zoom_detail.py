"""Zooming into a downsampled heatmap: the region on screen is redrawn finer, down to single
elements, so one flipped bit among 16,384 columns can be seen where it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from pytestqt.qtbot import QtBot

from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.progress import run_to_end
from tests.hand_captures import T, write_capture
from viewer import comparison_view as cv
from viewer.settings import ViewerSettings
from viewer.tensor.tensor_loader import iter_prepare
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

ROWS, COLS = 96, 16384
FLIP = (40, 10_000)


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One 96 x 16384 float32 tensor per side; the native differs by one ULP at FLIP only."""
    root = tmp_path_factory.mktemp("wide")
    values = np.random.default_rng(3).standard_normal((ROWS, COLS), dtype=np.float32)
    flipped = values.copy()
    flipped.view(np.uint32)[FLIP] ^= 1
    return (
        write_capture(root / "wide.native.h5", "native", [T("layer_out", flipped, layer=0)]),
        write_capture(root / "wide.oracle.h5", "oracle", [T("layer_out", values, layer=0)]),
    )


@pytest.fixture
def shown(qtbot: QtBot, tmp_path: Path, wide_pair: tuple[Path, Path]) -> MainWindow:
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(1440, 900)
    window.show()
    window.open_pair(*wide_pair)
    qtbot.waitUntil(lambda: window.tensor_view.data is not None and not window.tasks.busy, timeout=60_000)
    yield window
    window.close()


def _zoom(qtbot: QtBot, window: MainWindow, cols: tuple[float, float], rows: tuple[float, float] = (0, ROWS)) -> None:
    with qtbot.waitSignal(window.tensor_view.detail_shown, timeout=10_000):
        window.tensor_view.plots["native"].setRange(xRange=cols, yRange=rows, padding=0)


def test_the_whole_slice_is_downsampled_and_zooming_in_draws_single_elements(qtbot: QtBot, shown: MainWindow, artifacts_dir: Path) -> None:
    view = shown.tensor_view
    assert view.data is not None and view.data.factors == (1, 22)
    _zoom(qtbot, shown, (9_900, 10_100), (20, 60))
    detail = view.detail
    assert detail is not None and detail.factors == (1, 1)
    (r0, r1), (c0, c1) = detail.rows, detail.cols
    assert r0 <= FLIP[0] < r1 and c0 <= FLIP[1] < c1
    ulp = detail.rgba["ULP"]
    background = ulp[0, 0]
    lit = np.argwhere(np.any(ulp != background, axis=-1))
    assert lit.tolist() == [[FLIP[0] - r0, FLIP[1] - c0]]
    view.grab().save(str(artifacts_dir / "viewer-zoom-detail.png"))


def _hover(qtbot: QtBot, window: MainWindow, row: int, col: int) -> tuple[int, ...]:
    """Move the mouse over element (row, col) of the native heatmap; the inspected coordinate."""
    view = window.tensor_view
    scene = view.plots["native"].vb.mapViewToScene(QPointF(col + 0.5, row + 0.5))
    qtbot.mouseMove(view.maps.viewport(), view.maps.mapFromScene(scene))
    qtbot.waitUntil(lambda: view.inspector.current is not None and not view.inspector.current.pinned)
    return view.inspector.current.coordinate


def test_hovering_the_zoomed_region_inspects_the_element_under_the_cursor(qtbot: QtBot, shown: MainWindow) -> None:
    view = shown.tensor_view
    view.pinned = None
    whole = view.data.factors
    assert _hover(qtbot, shown, FLIP[0], FLIP[1] + 3) == (FLIP[0], FLIP[1]), "a block of the whole image shows its worst element"
    _zoom(qtbot, shown, (9_950, 10_050), (30, 50))
    assert _hover(qtbot, shown, FLIP[0], FLIP[1] + 3) == (FLIP[0], FLIP[1] + 3), "at one pixel per element, the element itself"
    assert whole[1] > 3


def test_switching_colour_scale_keeps_the_zoom_and_recolours_the_detail(qtbot: QtBot, shown: MainWindow) -> None:
    view = shown.tensor_view
    _zoom(qtbot, shown, (9_900, 10_100), (20, 60))
    before = view.plots["native"].vb.viewRange()
    shown.model.set_scale("absolute")
    assert view.plots["native"].vb.viewRange() == before
    detail = view.detail
    assert detail is not None
    shown_image = view.detail_images["difference"].image
    assert shown_image is not None and np.array_equal(shown_image, detail.rgba["absolute"])


def test_zooming_back_out_drops_the_detail(qtbot: QtBot, shown: MainWindow) -> None:
    view = shown.tensor_view
    _zoom(qtbot, shown, (9_900, 10_100), (20, 60))
    view.plots["native"].setRange(xRange=(0, COLS), yRange=(0, ROWS), padding=0)
    qtbot.waitUntil(lambda: view.detail is None, timeout=5_000)
    assert view.detail_images["native"].image is None


def test_values_at_float32s_limits_and_nans_are_drawn_without_a_numeric_warning(tmp_path: Path) -> None:
    """pytest turns warnings into errors here, as the window's own run did into a 'could not be read' banner."""
    sane = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    wild = sane.copy()
    wild[0, :8] = [3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1e-45, -3.0e38, 3.0e38]
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", wild, layer=0), T("logits", wild, dtype="float32")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", sane, layer=0), T("logits", sane, dtype="float32")])
    with open_capture(native) as n, open_capture(oracle) as o:
        viewed = cv.ViewedComparison.of(run_to_end(iter_compare(n, o)), n, o)
        pair = next(p for p in cv.pairs(viewed) if p.key.op == "layer_out")
        request = cv.tensor_request(viewed, n, o, pair, None)
        assert not isinstance(request, str)
        shown = run_to_end(iter_prepare(request))
    assert shown.differing == 8 and shown.rgba["absolute"].shape[:2] == (64, 64)
