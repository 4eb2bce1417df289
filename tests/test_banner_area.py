"""The window's banner area: groups a source replaces or clears as a whole."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from viewer.widgets.banner import BannerArea

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_a_banner_added_as_another_goes_stays_in_its_group_and_is_cleared_with_it(qtbot: QtBot) -> None:
    """Not yet shown by Qt when the other was deleted, it was dropped from its group: left on
    screen, beyond any clear() of its group (a session's save cleared its own banners so)."""
    area = BannerArea()
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    old = area.show_message("old", "info", "going")
    qtbot.waitUntil(lambda: area.texts("old") == ["going"])
    gone: list[bool] = []
    old.destroyed.connect(lambda: gone.append(True))
    area.show_message("new", "warning", "just added")
    area.clear("old")
    qtbot.waitUntil(lambda: gone == [True])
    assert [b.text for b in area.banners("new")] == ["just added"]
    area.clear("new")
    qtbot.waitUntil(lambda: not area.isVisible())
