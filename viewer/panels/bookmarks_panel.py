"""Bookmarks: an op plus a note, the findings a user hands over with the session.

The list shows the session's bookmarks; edits go straight to the `Investigation` through its
methods (so the autosaver writes them at once). A note is committed when the user leaves the
editor or presses Apply, never per keystroke: each commit is one autosave.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFocusEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from sessions.investigation.model import Bookmark, ChangeKind, Investigation
from viewer.widgets.plain_text import plain_label, plain_tip


class NoteEdit(QPlainTextEdit):
    """A multi-line note that reports when the user is done with it (focus leaves)."""

    editing_finished = Signal()

    def focusOutEvent(self, event: QFocusEvent) -> None:
        super().focusOutEvent(event)
        self.editing_finished.emit()


def bookmark_title(bookmark: Bookmark) -> str:
    first = bookmark.note.strip().splitlines()[0] if bookmark.note.strip() else "(no note)"
    return f"{bookmark.op.label()}\n    {first}"


LIST_MIN_HEIGHT = 48
NOTE_MIN_HEIGHT = 48
"""The list and the note keep two lines each at least: the dock shares the window's height
with the alignment tree, which a 720-pixel screen left a dozen rows when the dock took 270 px."""
NOTE_MAX_HEIGHT = 72
"""A note is a line or three; the rest of the dock goes to the list of bookmarks (a taller note
left the list two lines at 1440x900)."""


class BookmarksPanel(QWidget):
    add_requested = Signal()
    """Bookmark the op (and view) shown now."""
    jump_requested = Signal(object)
    """Show this Bookmark: its op, with the view it was marked in."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session: Investigation | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.list = QListWidget()
        self.list.setWordWrap(True)
        self.list.setAlternatingRowColors(True)
        self.list.setMinimumHeight(LIST_MIN_HEIGHT)
        self.note = NoteEdit()
        self.note.setPlaceholderText("Note for the selected bookmark, e.g. “Q=1008 visual prefill: tiled reduction”")
        self.note.setMaximumHeight(NOTE_MAX_HEIGHT)
        self.note.setMinimumHeight(NOTE_MIN_HEIGHT)
        self.note.setEnabled(False)
        self.add_button = QPushButton("Bookmark this op")
        self.add_button.setToolTip("Bookmark the selected op and its current view (Ctrl+B)")
        self.apply_button = QPushButton("Apply note")
        self.jump_button = QPushButton("Show")
        self.jump_button.setToolTip("Select the bookmarked op and restore its view (double-click does the same)")
        self.remove_button = QPushButton("Remove")
        self.hint = plain_label("Select an op, then bookmark it to keep a note with it.")
        self.hint.setWordWrap(True)
        buttons = QHBoxLayout()
        for button in (self.add_button, self.jump_button, self.remove_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(buttons)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.hint)
        note_row = QHBoxLayout()
        note_row.addWidget(self.note, 1)
        note_row.addWidget(self.apply_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout.addLayout(note_row)
        self.add_button.clicked.connect(self.add_requested)
        self.jump_button.clicked.connect(self._jump)
        self.remove_button.clicked.connect(self.remove_selected)
        self.apply_button.clicked.connect(self.commit_note)
        self.note.editing_finished.connect(self.commit_note)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemDoubleClicked.connect(lambda _item: self._jump())
        self._update_buttons()

    def set_session(self, session: Investigation) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.session = session
        self._unsubscribe = session.subscribe(self._session_changed)
        self._reload()

    def _session_changed(self, kind: ChangeKind) -> None:
        if kind in (ChangeKind.BOOKMARK, ChangeKind.NOTE):
            self._reload()

    def _reload(self) -> None:
        current = self.current_id()
        self.list.blockSignals(True)
        self.list.clear()
        for bookmark in self.session.bookmarks if self.session is not None else ():
            item = QListWidgetItem(bookmark_title(bookmark))
            item.setData(Qt.ItemDataRole.UserRole, bookmark.id)
            item.setToolTip(plain_tip(bookmark.note or "(no note)"))
            self.list.addItem(item)
            if bookmark.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._current_changed()

    def current_id(self) -> str | None:
        item = self.list.currentItem()
        return None if item is None else str(item.data(Qt.ItemDataRole.UserRole))

    def select_bookmark(self, bookmark_id: str) -> None:
        for row in range(self.list.count()):
            if self.list.item(row).data(Qt.ItemDataRole.UserRole) == bookmark_id:
                self.list.setCurrentRow(row)
                return

    def _current(self) -> Bookmark | None:
        bookmark_id = self.current_id()
        if bookmark_id is None or self.session is None:
            return None
        try:
            return self.session.bookmark(bookmark_id)
        except KeyError:
            return None

    def _current_changed(self, *_: object) -> None:
        bookmark = self._current()
        self.note.blockSignals(True)
        self.note.setPlainText("" if bookmark is None else bookmark.note)
        self.note.blockSignals(False)
        self.note.setEnabled(bookmark is not None)
        self._update_buttons()

    def _update_buttons(self) -> None:
        has = self._current() is not None
        for button in (self.jump_button, self.remove_button, self.apply_button):
            button.setEnabled(has)
        count = len(self.session.bookmarks) if self.session is not None else 0
        self.hint.setVisible(count == 0)

    def commit_note(self) -> None:
        """Store the edited note, once, if it changed."""
        bookmark = self._current()
        if bookmark is None or self.session is None:
            return
        text = self.note.toPlainText()
        if text != bookmark.note:
            self.session.set_note(bookmark.id, text)

    def remove_selected(self) -> None:
        bookmark = self._current()
        if bookmark is not None and self.session is not None:
            self.session.remove_bookmark(bookmark.id)

    def _jump(self) -> None:
        bookmark = self._current()
        if bookmark is not None:
            self.jump_requested.emit(bookmark)
