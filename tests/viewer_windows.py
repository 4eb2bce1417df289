"""A real main window on a pair, shown and compared: what viewer tests start from."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QTextDocument
from pytestqt.qtbot import QtBot

from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

COMPARED_WITHIN_MS = 120_000


def window_on(qtbot: QtBot, tmp_path: Path, native: Path, oracle: Path, size: tuple[int, int] = (1280, 720)) -> MainWindow:
    """A shown window of `size` with the pair's comparison arrived."""
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    window.open_pair(native, oracle)
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=COMPARED_WITHIN_MS)
    return window


def shown_tip(tip: str) -> str:
    """A tooltip's text as the user reads it: tooltips carrying a capture's names are escaped
    markup (viewer.widgets.plain_text.plain_tip)."""
    document = QTextDocument()
    document.setHtml(tip)
    return document.toPlainText()
