"""Showing a saved session's pair only after its captures passed the identity gate.

A session points at captures by path; a moved one is located (by the user, or beside the
session file), a changed one is flagged and held back until the user accepts it, and the pair
is opened only through `iter_open_session_capture`, which checks identity on the very handle it
returns. Each question is a banner with its choices, so the other views stay usable meanwhile;
the file chooser is a replaceable callable, so tests answer it without a modal dialog.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from sessions.capture.reader import Capture
from sessions.investigation.capture_gate import (
    CaptureState,
    CaptureStatus,
    accept_changed_capture,
    check_captures_progress,
    iter_open_session_capture,
    locate_capture,
)
from sessions.investigation.model import Investigation
from sessions.progress import Progress, ProgressGenerator
from viewer.widgets.banner import BannerArea
from viewer.workers import TaskSlots

CaptureChooser = Callable[[CaptureStatus], "Path | None"]
PairOpener = Callable[[list[Capture]], None]
"""Show the session's (native, oracle) captures, which passed the gate, as the window's pair."""


def ask_capture(parent: QWidget, status: CaptureStatus) -> Path | None:
    start = str(status.candidate or status.path.parent)
    name, _ = QFileDialog.getOpenFileName(parent, f"Locate the {status.role} capture {status.path.name}", start, "Captures (*.h5 *.hdf5 *.capture);;All files (*)")
    return Path(name) if name else None


def iter_open_session_captures(session: Investigation) -> ProgressGenerator[list[Capture]]:
    """The session's native and oracle, each through the identity gate (closing it stops the open)."""
    refs = [session.captures_of("native")[0], session.captures_of("oracle")[0]]
    opened: list[Capture] = []
    try:
        for i, ref in enumerate(refs):
            yield Progress(i, len(refs), f"opening {ref.path.name}")
            opened.append((yield from iter_open_session_capture(ref)))
    except BaseException:
        for capture in opened:
            capture.close()
        raise
    return opened


def iter_call(label: str, work: Callable[[], Any]) -> ProgressGenerator[Any]:
    yield Progress(0, 1, label)
    return work()


class SessionCaptures(QObject):
    pair_opening = Signal(object)
    """The Investigation whose pair passed the gate and is being opened (its view is restored next)."""
    pair_refused = Signal()
    """The pair did not pass the gate when it was opened, or its opening was cancelled; nothing of it is shown."""

    def __init__(self, tasks: TaskSlots, banners: BannerArea, open_pair: PairOpener, parent: QWidget) -> None:
        super().__init__(parent)
        self._tasks = tasks
        self._banners = banners
        self._open_pair = open_pair
        self._session = Investigation()
        self._folder: Path | None = None
        self.choose_capture: CaptureChooser = lambda status: ask_capture(parent, status)

    def check(self, session: Investigation, folder: Path | None) -> None:
        """Check every capture the session names, then show its pair (or ask about the ones in the way)."""
        self._session, self._folder = session, folder
        if not (session.captures_of("native") and session.captures_of("oracle")):
            self._banners.show_message("session", "info", "This session names no native/oracle pair yet; open captures to start.")
            return
        self._recheck()

    def _recheck(self) -> None:
        session, folder = self._session, self._folder
        self._tasks.submit(
            "session",
            lambda: check_captures_progress(session, folder),
            on_success=self._checked,
            on_failure=lambda message: self._banners.show_message("session", "error", f"Could not check the session's captures: {message}"),
        )

    def _checked(self, statuses: list[CaptureStatus]) -> None:
        self._banners.clear("captures-check")
        blocking = [s for s in statuses if not s.usable and s.role in ("native", "oracle")]
        for status in statuses:
            if not status.usable:
                self._flag(status)
        if not blocking:
            self._open()

    def _flag(self, status: CaptureStatus) -> None:
        show = self._banners.show_message
        if status.state is CaptureState.MISSING:  # the message names where the same capture is, when it was found
            show("captures-check", "warning", f"The {status.role} capture {status.message}.", actions=[("Locate…", lambda: self.locate(status))])
        elif status.state is CaptureState.CHANGED:
            show("captures-check", "error", f"The {status.role} capture changed: {status.message}.",
                 actions=[("Accept this file", lambda: self.accept(status)), ("Locate the original…", lambda: self.locate(status))])
        else:
            show("captures-check", "error", f"The {status.role} capture cannot be read: {status.message}", actions=[("Locate…", lambda: self.locate(status))])

    def locate(self, status: CaptureStatus) -> None:
        path = self.choose_capture(status)
        if path is None:
            self._flag(status)
            return
        session = self._session
        self._tasks.submit("session", lambda: iter_call(f"checking {path.name}", lambda: locate_capture(session, status.capture_id, path)),
                           on_success=self._located, on_failure=lambda m: self._banners.show_message("captures-check", "error", m))

    def _located(self, status: CaptureStatus) -> None:
        if status.usable:
            self._recheck()
        else:
            self._flag(status)

    def accept(self, status: CaptureStatus) -> None:
        session = self._session
        self._tasks.submit("session", lambda: iter_call("accepting", lambda: accept_changed_capture(session, status.capture_id, status.path)),
                           on_success=lambda _s: self._recheck(), on_failure=lambda m: self._banners.show_message("captures-check", "error", m))

    def _open(self) -> None:
        session = self._session
        self.pair_opening.emit(session)
        self._tasks.submit("open", lambda: iter_open_session_captures(session), on_success=self._open_pair, on_failure=self._refused, on_cancel=self._cancelled)

    def _refused(self, message: str) -> None:
        self.pair_refused.emit()
        self._banners.show_message("captures-check", "error", f"Not shown: {message}")

    def _cancelled(self) -> None:
        self.pair_refused.emit()
        self._banners.show_message("captures-check", "info", "Opening the session's captures was cancelled.", actions=[("Open them again", self._recheck)])
