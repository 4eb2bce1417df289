"""The Help window explains the window from its own actions and colours, so it cannot go stale."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from sessions.compare.verdict import MEANING, Kind
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_f1_help_lists_every_shortcut_the_glossary_and_a_legend_of_every_kind(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1280, 720)
    win.show()
    dialog = win.show_help()
    qtbot.addWidget(dialog)
    shortcuts = dialog.page_text("Shortcuts")
    for keys, name in (("Ctrl+J", "Jump to first finding"), ("F8", "Next divergence"), ("Ctrl+1", "Tensor diff"), ("F1", "Parity X-ray help")):
        assert f"\n{keys}\n{name}\n" in shortcuts
    glossary = dialog.page_text("Glossary")
    for term in ("ULP error", "NMSE", "contract", "dispatch-only", "signed-zero-only", "post-EOS", "local / inherited"):
        assert term in glossary
    legend = dialog.page_text("Legend")
    for kind in Kind:
        assert str(kind) in legend and MEANING[kind] in legend, "every mark the tree may show, tokens included"
    assert "CONTRACT MISMATCH" in legend and "sdpa_vector" in legend
    assert "report-json.md" in dialog.page_text("Documents")
    dialog.tabs.setCurrentIndex(2)
    QApplication.processEvents()
    assert dialog.grab().save(str(artifacts_dir / "help-legend.png"))
    dialog.close()
    win.close()
