"""The open investigation as a file: open, save, save as, autosave, crash recovery, the unsaved-work question.

This part knows nothing of the window's panels. It holds the `SessionDocument` and its
`Autosaver`, and says what happened through signals: `replaced` when a different
investigation is open (the bookmarks list and the rest follow it), `captures_wanted` when an
opened or recovered session's pair should be checked and shown, `about_to_save` so the view
can be recorded first. Questions to the user go through replaceable callables, so tests answer
them without a modal dialog.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from sessions.investigation.model import Investigation
from sessions.investigation.recovery import (
    Autosaver,
    RecoveryOffer,
    claim_recovery_offers,
)
from sessions.investigation.store import (
    SessionChangedError,
    SessionDocument,
    SessionOpenError,
    SessionSaveError,
    work_in,
)
from viewer.settings import ViewerSettings
from viewer.widgets.banner import BannerArea

AUTOSAVE_TICK_MS = 1000
PathChooser = Callable[[str], "Path | None"]
"""Given 'open', 'save' or 'export-md'/'export-html', a path or None (cancelled)."""
CloseQuestion = Callable[[], str]
"""'save', 'discard' or 'cancel' for a session with unsaved work."""
StatusMessage = Callable[[str, int], None]
"""Show a short message in the status bar for so many milliseconds."""

FILTERS = {
    "open": "Parity X-ray sessions (*.xray)",
    "save": "Parity X-ray sessions (*.xray)",
    "export-md": "Markdown (*.md)",
    "export-html": "HTML report (*.html)",
}


def ask_path(parent: QWidget, purpose: str) -> Path | None:
    if purpose == "open":
        name, _ = QFileDialog.getOpenFileName(parent, "Open session", "", FILTERS[purpose])
    else:
        name, _ = QFileDialog.getSaveFileName(parent, "Save session as" if purpose == "save" else "Export", "", FILTERS[purpose])
    return Path(name) if name else None


def ask_close(parent: QWidget) -> str:
    answer = QMessageBox.question(
        parent, "Unsaved session", "The session has unsaved bookmarks or changes. Save it before closing?",
        QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
    )
    return {QMessageBox.StandardButton.Save: "save", QMessageBox.StandardButton.Discard: "discard"}.get(answer, "cancel")


class SessionFile(QObject):
    document_changed = Signal()
    """A different session is open, or its saved/dirty state changed (title bar)."""
    replaced = Signal(object)
    """The Investigation now open, after a different one took the old one's place."""
    captures_wanted = Signal()
    """An opened or recovered session's captures should be checked and its pair shown."""
    about_to_save = Signal()
    """Record what the session keeps of the view now: it is about to be written."""
    recent_changed = Signal()
    """The recent-sessions list in the settings changed."""

    def __init__(self, settings: ViewerSettings, banners: BannerArea, status: StatusMessage, parent: QWidget) -> None:
        super().__init__(parent)
        self._settings = settings
        self._banners = banners
        self._status = status
        self.recovery_dir = settings.recovery_dir()
        self.choose_path: PathChooser = lambda purpose: ask_path(parent, purpose)
        self.ask_close: CloseQuestion = lambda: ask_close(parent)
        self.document = SessionDocument(Investigation())
        self.autosaver = Autosaver(self.document, self.recovery_dir)
        self._pending_offers: list[RecoveryOffer] = []
        """Recovery offers shown and not answered yet (`close` releases them)."""
        self._shown_dirty = False
        """The dirty state the last `document_changed` told of (the title bar's `*`)."""
        self.timer = QTimer(self)
        self.timer.setInterval(AUTOSAVE_TICK_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    @property
    def session(self) -> Investigation:
        return self.document.session

    @property
    def folder(self) -> Path | None:
        """Where the session file lies: captures named relative to it are looked for there."""
        return self.document.path.parent if self.document.path else None

    def _install(self, document: SessionDocument) -> None:
        self.autosaver.close()
        self.document = document
        self.autosaver = Autosaver(document, self.recovery_dir)
        self.replaced.emit(document.session)
        self._tell_changed()

    def _tell_changed(self) -> None:
        self._shown_dirty = self.document.dirty
        self.document_changed.emit()

    def _tick(self) -> None:
        """Autosave, and tell of an edit since the last tick: the session is dirty from the edit
        on, so comparing before and after the autosave never saw it (no `*` after an edit of a
        saved session)."""
        self.autosaver.tick()
        if self.autosaver.last_error:
            self._status(self.autosaver.last_error, 5000)
        if self._shown_dirty != self.document.dirty:
            self._tell_changed()

    # -- unsaved work ------------------------------------------------------------------------

    def worth_keeping(self) -> bool:
        """Unsaved work a user would miss (`SessionDocument.unsaved_work`): a new session's
        decisions alone were dropped on close without a word."""
        return bool(self.document.unsaved_work())

    def settle_unsaved(self) -> bool:
        """Before the session is replaced or the window closes: False when the user cancelled."""
        if not self.worth_keeping():
            return True
        answer = self.ask_close()
        if answer == "save":
            return self.save()
        return answer == "discard"

    def start_new(self) -> None:
        """A new, empty investigation (another pair was opened); the caller settled the old one's work."""
        self._install(SessionDocument(Investigation()))

    def close(self) -> bool:
        if not self.settle_unsaved():
            return False
        self.timer.stop()
        self.autosaver.close()
        for offer in self._pending_offers:
            offer.release()
        self._pending_offers.clear()
        return True

    # -- save --------------------------------------------------------------------------------

    def save(self) -> bool:
        if self.document.path is None or self.document.read_only:
            return self.save_as()
        return self._write(None)

    def save_as(self) -> bool:
        path = self.choose_path("save")
        if path is None:
            return False
        if path.suffix != ".xray":
            path = path.with_name(path.name + ".xray")
        return self._write(path)

    def _write(self, path: Path | None, replace_changed: bool = False) -> bool:
        self.about_to_save.emit()
        try:
            self.document.save(replace_changed) if path is None else self.document.save_as(path)
        except SessionChangedError as exc:
            self._banners.clear("session")
            self._banners.show_message(
                "session", "warning", str(exc), actions=[("Save anyway", lambda: self._write(None, replace_changed=True)), ("Save As…", self.save_as)]
            )
            return False
        except SessionSaveError as exc:
            self._banners.show_message("session", "error", str(exc))
            return False
        assert self.document.path is not None
        self._banners.clear("session")
        self._remember(self.document.path)
        self.autosaver.tick()
        self._status(f"Session saved to {self.document.path}", 5000)
        self._tell_changed()
        return True

    def _remember(self, path: Path) -> None:
        self._settings.add_recent_session(path)
        self.recent_changed.emit()

    # -- open --------------------------------------------------------------------------------

    def open_dialog(self) -> None:
        path = self.choose_path("open")
        if path is not None:
            self.open_session(path)

    def open_session(self, path: str | Path) -> bool:
        if not self.settle_unsaved():
            return False
        self._banners.clear("session")
        try:
            document = SessionDocument.open(path)
        except SessionOpenError as exc:
            self._banners.show_message("session", "error", str(exc))
            return False
        self._install(document)
        for notice in document.notices:
            self._banners.show_message("session", "warning", notice)
        self._remember(Path(path))
        self.captures_wanted.emit()
        return True

    # -- recovery ----------------------------------------------------------------------------

    def offer_recovery(self) -> list[RecoveryOffer]:
        """Sessions left by a crashed or killed Parity X-ray, each offered once, in a banner; those
        still unanswered when the window closes are offered again at the next start."""
        scan = claim_recovery_offers(self.recovery_dir)
        for notice in scan.notices:
            self._banners.show_message("recovery", "warning", notice)
        for offer in scan.offers:
            name = offer.session_path.name if offer.session_path else "an unsaved session"
            what = ", ".join(work_in(offer.session, offer.session_path)) + (f", “{offer.session.title}”" if offer.session.title else "")
            self._show_offer(offer, f"Parity X-ray stopped unexpectedly while {name} had unsaved work ({what}). Restore it?")
        self._pending_offers += scan.offers
        return scan.offers

    def restore(self, offer: RecoveryOffer) -> None:
        """Install the recovered session, once the window's own unsaved work is settled (Restore
        replaced it without a word, and deleted its recovery file)."""
        if not self.settle_unsaved():
            self._show_offer(offer, "The unsaved session was not restored; Restore it again once this window's work is saved or discarded.")
            return
        document = offer.restore()
        self._install(document)
        self.autosaver.flush()
        self._discard_offer(offer)
        self._status("Recovered the unsaved session; save it to keep it.", 8000)
        self.captures_wanted.emit()

    def _show_offer(self, offer: RecoveryOffer, text: str) -> None:
        self._banners.show_message(
            "recovery", "warning", text, closable=False, actions=[("Restore", lambda: self.restore(offer)), ("Discard", lambda: self._discard_offer(offer))]
        )

    def _discard_offer(self, offer: RecoveryOffer) -> None:
        offer.discard()
        self._pending_offers = [pending for pending in self._pending_offers if pending is not offer]
