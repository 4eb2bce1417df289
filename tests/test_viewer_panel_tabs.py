"""The panel tabs paint hidden pages offscreen only while the window has no work in flight."""

from __future__ import annotations

import time

import pytest
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from viewer.window.panel_tabs import PRERENDER_QUIET_MS, PanelTabs

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


class _CountedPage(QLabel):
    def __init__(self) -> None:
        super().__init__("page")
        self.paints = 0

    def paintEvent(self, event: object) -> None:  # type: ignore[override]
        self.paints += 1
        super().paintEvent(event)  # type: ignore[arg-type]


def test_hidden_pages_wait_for_work_in_flight_and_a_quiet_spell_before_they_are_painted(qtbot: QtBot) -> None:
    tabs = PanelTabs()
    qtbot.addWidget(tabs)
    shown, hidden = _CountedPage(), _CountedPage()
    tabs.addTab(shown, "shown")
    tabs.addTab(hidden, "hidden")
    tabs.resize(400, 300)
    tabs.show()
    qtbot.waitExposed(tabs)
    qtbot.waitUntil(lambda: not tabs.prerendering, timeout=5_000)
    painted = hidden.paints
    tabs.work_changed(True)
    tabs.prerender_hidden()
    qtbot.wait(3 * PRERENDER_QUIET_MS)
    assert hidden.paints == painted and tabs.prerendering, "no offscreen paint while a result is on its way"
    tabs.work_changed(False)
    ended = time.monotonic()
    qtbot.waitUntil(lambda: hidden.paints > painted, timeout=5_000)
    assert time.monotonic() - ended >= PRERENDER_QUIET_MS / 1000, "the result's own paints come first"
    qtbot.waitUntil(lambda: not tabs.prerendering, timeout=5_000)
