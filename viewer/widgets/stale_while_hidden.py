"""A panel that brings itself up to date when it is seen, not while it is hidden.

A real model's comparison arrives with every panel to redraw; a hidden tab's rebuild (the
Overview's 220,000-op lines, the token table's hundreds of rows, the Worst ops' thousand) added
tens of milliseconds each to the arrival's one event-loop turn. A panel marked stale rebuilds
when it is shown, when the tabs paint it offscreen (`bring_hidden_pages_up_to_date`, one page
per turn), or when someone reads it; a visible panel rebuilds at once.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QWidget


class StaleWhileHidden(QObject):
    """Owned by the panel it refreshes (a child, so the tabs find it with findChildren)."""

    def __init__(self, panel: QWidget, refresh: Callable[[], None]) -> None:
        super().__init__(panel)
        self._panel = panel
        self._refresh = refresh
        self.stale = False
        panel.installEventFilter(self)

    def request(self) -> None:
        """The panel's data changed: refresh now if it is seen, else when it next is."""
        self.stale = True
        if self._panel.isVisible():
            self.bring_up_to_date()

    def bring_up_to_date(self) -> bool:
        """Refresh if stale; whether it did."""
        if not self.stale:
            return False
        self.stale = False
        self._refresh()
        return True

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._panel and event.type() == QEvent.Type.Show:
            self.bring_up_to_date()
        return False


def bring_hidden_pages_up_to_date(page: QWidget) -> bool:
    """Refresh every stale panel on a page about to be painted offscreen; whether any was."""
    return any([refresher.bring_up_to_date() for refresher in page.findChildren(StaleWhileHidden)])
