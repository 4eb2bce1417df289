"""A real main window on a pair, shown and compared: what viewer tests start from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QTextDocument
from pytestqt.qtbot import QtBot

from tests.hand_captures import T, bf16_bits, write_capture
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

COMPARED_WITHIN_MS = 120_000




def wait_idle(qtbot: QtBot, win: MainWindow) -> None:
    qtbot.waitUntil(lambda: not win.tasks.busy, timeout=COMPARED_WITHIN_MS)


def wait_compared(qtbot: QtBot, win: MainWindow) -> None:
    qtbot.waitUntil(lambda: win.model.comparison is not None and win.tensor_view.data is not None and not win.tasks.busy, timeout=COMPARED_WITHIN_MS)


def small_pair(tmp_path: Path) -> tuple[Path, Path]:
    """attn_norm 4x8 bf16: native has a 1-ULP flip at (1, 2), -0 for +0 at (2, 3), another NaN payload at (3, 4)."""
    oracle = np.linspace(-2.0, 2.0, 32, dtype=np.float32).reshape(4, 8)
    oracle[2, 3] = 0.0
    o_bits = bf16_bits(oracle)
    o_bits[3, 4] = 0x7FC1
    n_bits = o_bits.copy()
    n_bits[1, 2] += 1
    n_bits[2, 3] = 0x8000
    n_bits[3, 4] = 0x7FC3
    rest = bf16_bits(np.ones((4, 8), dtype=np.float32))
    native = write_capture(tmp_path / "small.native.h5", "native", [T("attn_norm", n_bits, layer=0, dtype="bfloat16"), T("layer_out", rest, layer=0, dtype="bfloat16")], [(0, 5, False)])
    oracle_path = write_capture(tmp_path / "small.oracle.h5", "oracle", [T("attn_norm", o_bits, layer=0, dtype="bfloat16"), T("layer_out", rest, layer=0, dtype="bfloat16")], [(0, 5, False)])
    return native, oracle_path


def click_element(qtbot: QtBot, win: MainWindow, plot_name: str, row: int, col: int) -> None:
    view = win.tensor_view
    plot = view.plots[plot_name]
    scene_point = plot.vb.mapViewToScene(QPointF(col + 0.5, row + 0.5))
    widget_point = view.maps.mapFromScene(scene_point)
    qtbot.mouseClick(view.maps.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(widget_point.x(), widget_point.y()))


def shown_window(qtbot: QtBot, tmp_path: Path, size: tuple[int, int] = (1440, 900)) -> MainWindow:
    """A shown window of `size` with no pair, for a test that opens one itself."""
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    return window


def window_on(qtbot: QtBot, tmp_path: Path, native: Path, oracle: Path, size: tuple[int, int] = (1280, 720)) -> MainWindow:
    """A shown window of `size` with the pair's comparison arrived."""
    window = shown_window(qtbot, tmp_path, size)
    window.open_pair(native, oracle)
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=COMPARED_WITHIN_MS)
    return window


def shown_tip(tip: str) -> str:
    """A tooltip's text as the user reads it: tooltips carrying a capture's names are escaped
    markup (viewer.widgets.plain_text.plain_tip)."""
    document = QTextDocument()
    document.setHtml(tip)
    return document.toPlainText()
