"""In-window messages: a bad file or a contract mismatch is read in the window, not in a dialog.

A modal dialog would block the other open views; a banner leaves them usable. A long message
(the contract card) may keep its details behind a toggle, so on a small screen it takes one
line of the window's height instead of five.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

LEVELS = ("error", "warning", "info")


MIN_AREA_HEIGHT = 48
"""The least height the banner area keeps while it shows a banner: one line and its buttons."""
AREA_SHARE = 0.3
"""The most of the window's height the banner area asks for; past it, its banners scroll."""

BannerAction = tuple[str, Callable[[], None]]
"""A button on a banner (a choice such as Restore or Locate…); clicking it also dismisses the banner."""


class Banner(QFrame):
    def __init__(
        self,
        level: str,
        text: str,
        closable: bool = True,
        parent: QWidget | None = None,
        actions: Sequence[BannerAction] = (),
        details: str = "",
        expanded: bool = True,
        rich: bool = False,
    ) -> None:
        """`details` (optional) sits below `text`, shown or hidden by a Details toggle; `expanded` is its first state.
        `rich`: `text` and `details` are markup whose interpolated data is escaped (the contract
        card); otherwise they show as they are, whatever a capture's names hold (viewer.widgets.plain_text)."""
        super().__init__(parent)
        if level not in LEVELS:
            raise ValueError(f"banner level must be one of {LEVELS}, not {level!r}")
        self.level = level
        self.dismissed = False
        self.setObjectName("banner")
        self.setProperty("level", level)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        text_format = Qt.TextFormat.RichText if rich else Qt.TextFormat.PlainText
        self.label = QLabel(text)
        self.label.setTextFormat(text_format)
        self.label.setObjectName("bannerText")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        texts = QVBoxLayout()
        texts.setContentsMargins(0, 0, 0, 0)
        texts.addWidget(self.label)
        # Children from the start: a parentless widget made visible is a window of its own, and
        # showing it took the keyboard focus from the main window (Ctrl+J then did nothing).
        self.details = QLabel(details, self)
        self.details.setTextFormat(text_format)
        self.details.setObjectName("bannerText")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setVisible(bool(details) and expanded)
        texts.addWidget(self.details)
        layout.addLayout(texts, 1)
        self.details_toggle = QToolButton(self)
        self.details_toggle.setText("Details")
        self.details_toggle.setCheckable(True)
        self.details_toggle.setChecked(expanded)
        self.details_toggle.setToolTip("Show or hide the details")
        self.details_toggle.setAutoRaise(True)
        self.details_toggle.setVisible(bool(details))
        self.details_toggle.toggled.connect(self.details.setVisible)
        self._chosen = False
        """Whether the user has shown or hidden the details: then the window's size no longer does."""
        self.details_toggle.clicked.connect(self._choose)
        layout.addWidget(self.details_toggle, 0, Qt.AlignmentFlag.AlignTop)
        self.buttons: dict[str, QPushButton] = {}
        for text_, callback in actions:
            button = QPushButton(text_)
            button.clicked.connect(lambda _=False, c=callback: self._act(c))
            layout.addWidget(button, 0, Qt.AlignmentFlag.AlignTop)
            self.buttons[text_] = button
        if closable:
            close = QToolButton()
            close.setText("✕")
            close.setToolTip("Dismiss")
            close.setAutoRaise(True)
            close.clicked.connect(self.deleteLater)
            layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)

    def _choose(self) -> None:
        self._chosen = True

    def fit_room(self, expanded: bool) -> None:
        """Show the details when the window has room for them (`expanded`), unless the user chose."""
        if not self._chosen:
            self.details_toggle.setChecked(expanded)

    def _act(self, callback: Callable[[], None]) -> None:
        self.dismissed = True
        self.hide()
        self.deleteLater()
        callback()

    @property
    def text(self) -> str:
        """The whole message, details included (shown or not)."""
        return f"{self.label.text()}\n{self.details.text()}" if self.details.text() else self.label.text()


class BannerArea(QScrollArea):
    """A stack of banners in named groups, so one source can replace its own messages.

    As tall as its banners up to AREA_SHARE of the window's height, then scrolled: at 1280x720 the
    contract card with its details shown pushed the tensor maps below to 1 px each."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        inner = QWidget()
        inner.installEventFilter(self)
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(6, 4, 6, 0)
        self._layout.setSpacing(4)
        self.setWidget(inner)
        self._groups: dict[str, list[Banner]] = {}
        self._newest: Banner | None = None
        self.verticalScrollBar().rangeChanged.connect(self._show_newest)
        self.setVisible(False)

    def _content_height(self) -> int:
        """The banners' own height at the area's width: their text wraps."""
        inner = self.widget()
        height = inner.heightForWidth(self.width()) if inner.hasHeightForWidth() else -1
        return inner.sizeHint().height() if height < 0 else height

    def sizeHint(self) -> QSize:
        """The banners' own height, but at most AREA_SHARE of the window's."""
        height = self._content_height()
        window = self.window()
        room = int(window.height() * AREA_SHARE) if window is not self else height
        return QSize(self.widget().sizeHint().width(), min(height, max(room, self.minimumSizeHint().height())))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()  # wrapped text is taller on a narrower area

    def minimumSizeHint(self) -> QSize:
        """A line of a banner and its buttons, however small the window."""
        return QSize(0, min(MIN_AREA_HEIGHT, self._content_height()))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """A banner shown, hidden or toggled to its details changes the height the area asks for."""
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()
        return super().eventFilter(watched, event)

    def show_message(
        self,
        group: str,
        level: str,
        text: str,
        closable: bool = True,
        actions: Sequence[BannerAction] = (),
        details: str = "",
        expanded: bool = True,
        rich: bool = False,
    ) -> Banner:
        banner = Banner(level, text, closable, self, actions, details, expanded, rich)
        banner.destroyed.connect(self._refresh)
        self._groups.setdefault(group, []).append(banner)
        self._layout.addWidget(banner)
        self.setVisible(True)
        self._newest = banner
        return banner

    def _show_newest(self) -> None:
        """The newest message in view once it is laid out: in a short window the area scrolls (the
        tensor maps keep their least height), and a "Could not open" under the contract card went
        unseen. Once only: a user who scrolls back to the card stays there."""
        newest, self._newest = self._newest, None
        if newest is not None and _exists(newest) and not newest.dismissed:
            self.ensureWidgetVisible(newest, 0, 0)

    def clear(self, group: str) -> None:
        for banner in self._groups.pop(group, []):
            banner.hide()
            banner.deleteLater()
        self._refresh()

    def banners(self, group: str) -> list[Banner]:
        """The group's banners still standing (not dismissed by one of their buttons or deleted)."""
        return [b for b in self._groups.get(group, []) if _exists(b) and not b.dismissed]

    def texts(self, group: str | None = None) -> list[str]:
        groups = [group] if group is not None else list(self._groups)
        return [b.text for g in groups for b in self._groups.get(g, []) if b.isVisibleTo(self) or not b.isHidden()]

    def _refresh(self, *_: object) -> None:
        # Not by visibility: a banner added to a shown area is hidden until Qt shows it in a later
        # turn, and one added just before another went (a save clearing its group) was dropped
        # here, left on screen where no clear() of its group could reach it.
        for group, banners in list(self._groups.items()):
            self._groups[group] = [b for b in banners if _exists(b) and not b.dismissed]
        self.setVisible(any(self._groups.values()))


def _exists(widget: QWidget) -> bool:
    try:
        widget.objectName()
    except RuntimeError:
        return False
    return True

