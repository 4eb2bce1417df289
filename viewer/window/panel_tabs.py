"""The main window's panel tabs, kept laid out and painted while hidden.

A QTabWidget gives only its current page the new size when it is resized; every hidden page
keeps the size it last had and learns its real one the moment it is shown. For a pyqtgraph
panel that is a resize, an auto-range, new axis labels and two or three full repaints in the
very event-loop turn of the click (about 90 ms for the Overview). Here every page follows the
current page's geometry, and after new data (`prerender_hidden`) or a resize each hidden page
is painted offscreen once, one page per event-loop turn, so switching to it costs one ordinary
paint.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import (
    QStackedWidget,
    QStyle,
    QStyleOptionTabWidgetFrame,
    QTabWidget,
    QWidget,
)

from viewer.widgets.stale_while_hidden import bring_hidden_pages_up_to_date

RESIZE_SETTLE_MS = 300
"""A resize is followed by more while the user drags: prerender once the size has settled."""
PRERENDER_GAP_MS = 50
"""Time between two offscreen paints: the window first shows what just arrived, and stays free
to answer between pages (zero-interval timers ran back to back with the arrival's repaints)."""
PRERENDER_QUIET_MS = 250
"""After the window's work in flight ends, offscreen paints wait this long: the result's own
paints (the tensors' seven plots, 60-100 ms over several turns) come first."""
PRERENDER_PASSES = 2
"""Offscreen paints per hidden page: the first applies its pending resize and range changes,
which pyqtgraph turns into label and axis updates that the second paint settles."""


class PanelTabs(QTabWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._working = False
        self._worked_at = 0.0
        """When the window's work in flight last started or ended (time.monotonic)."""
        self._queue: list[QWidget] = []
        self._painting = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(PRERENDER_GAP_MS)
        self._timer.timeout.connect(self._prerender_next)
        self._settled = QTimer(self)
        self._settled.setSingleShot(True)
        self._settled.setInterval(RESIZE_SETTLE_MS)
        self._settled.timeout.connect(self.prerender_hidden)

    def tabInserted(self, index: int) -> None:
        super().tabInserted(index)
        self.widget(index).installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # Painting a hidden page offscreen sends it a resize (to its unchanged size): that is no
        # new size to prerender for, or the tabs would prerender forever behind the drop hint.
        if event.type() == QEvent.Type.Resize and watched is self.currentWidget() and not self._painting:
            self._sync_hidden_pages()
            self._settled.start()
        return False

    def follow_while_hidden(self, area: QWidget) -> None:
        """While the tabs wait hidden in `area` (behind the drop hint), give them its size, so
        every page, the current one too, is painted offscreen at the size it will be shown at:
        the first paint after a pair opened (the tensor view's seven plots) cost ~100 ms."""
        if not self.isVisible() and self.geometry() != area.rect():
            self.setGeometry(area.rect())
            self._lay_out_pages_while_hidden()
            self._settled.start()

    def _lay_out_pages_while_hidden(self) -> None:
        """Give the pages the rectangle below the tab bar, as Qt does only once the tabs are shown
        (hidden, QTabWidget defers its layout): otherwise showing them resized every plot again."""
        option = QStyleOptionTabWidgetFrame()
        self.initStyleOption(option)
        contents = self.style().subElementRect(QStyle.SubElement.SE_TabWidgetTabContents, option, self)
        pages = self.findChild(QStackedWidget)
        if pages is not None and contents.isValid():
            pages.setGeometry(contents)

    def _sync_hidden_pages(self) -> None:
        """Give every hidden page the current page's geometry (Qt sends it the resize on show)."""
        current = self.currentWidget()
        for index in range(self.count()):
            page = self.widget(index)
            if page is not current and page.geometry() != current.geometry():
                page.setGeometry(current.geometry())

    def work_changed(self, working: bool) -> None:
        """The window's background work whose result it will show started or ended: offscreen
        paints wait until it has been idle PRERENDER_QUIET_MS. Interleaved with a tensor's
        arrival they doubled its stall (a hidden page's paint took 30-36 ms on a 240k-record pair)."""
        self._working = working
        self._worked_at = time.monotonic()

    def prerender_hidden(self) -> None:
        """Paint each hidden page offscreen, PRERENDER_PASSES times, one page per turn (a stale
        page is first brought up to date in a turn of its own)."""
        current = self.currentWidget() if self.isVisible() else None
        hidden = [self.widget(i) for i in range(self.count()) if self.widget(i) is not current]
        self._queue = [page for _ in range(PRERENDER_PASSES) for page in hidden]
        self._timer.start()

    @property
    def prerendering(self) -> bool:
        """Pages are waiting to be painted offscreen, or will be once a resize settles."""
        return bool(self._queue) or self._settled.isActive()

    def _prerender_next(self) -> None:
        if not self._queue:
            return
        if self._working or time.monotonic() - self._worked_at < PRERENDER_QUIET_MS / 1000:
            self._timer.start()
            return
        page = self._queue.pop(0)
        if page is not self.currentWidget() or not self.isVisible():
            if bring_hidden_pages_up_to_date(page):
                # Rebuilt this turn, painted the next: the two together stalled the window ~100 ms.
                self._queue.insert(0, page)
            else:
                self._painting = True
                try:
                    page.grab()
                finally:
                    self._painting = False
        if self._queue:
            self._timer.start()
