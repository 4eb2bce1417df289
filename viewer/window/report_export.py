"""File ▸ Export: the session's bookmarks and notes as Markdown, or the HTML report with a picture per bookmark.

The HTML report shows each bookmark as the user marked it, so every bookmark is drawn in turn
(its op, slice and colour scale) in the camera's own tensor view (`BookmarkCamera`), which is
grabbed once it has drawn it; the window the user is looking at never changes. The page is
rendered and written off the UI thread (0.3-0.45 s for 240,000 pairs). Writing is atomic: a failed export
leaves no half-written file and the session untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from sessions.atomic_write import atomic_write_bytes
from sessions.capture.opening import unfinished
from sessions.investigation.bookmarks_markdown import bookmarks_markdown
from sessions.investigation.model import Bookmark, Investigation
from sessions.investigation.store import describe_os_error
from sessions.report.html_page import iter_write_html
from viewer.pair_model import PairModel
from viewer.widgets.banner import BannerArea
from viewer.window.bookmark_camera import LATER_MS, BookmarkCamera
from viewer.window.session_file import PathChooser, StatusMessage, ask_path
from viewer.workers import TaskSlots

EXPORT_LANE = "export"
"""The task lane the page is rendered and written in."""


class ReportExporter(QObject):
    exported = Signal(object)
    """Path of a finished export."""

    def __init__(
        self,
        session: Callable[[], Investigation],
        model: PairModel,
        camera: BookmarkCamera,
        banners: BannerArea,
        status: StatusMessage,
        tasks: TaskSlots,
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        self._tasks = tasks
        self._session = session
        self._model = model
        self._camera = camera
        self._banners = banners
        self._status = status
        self.choose_path: PathChooser = lambda purpose: ask_path(parent, purpose)
        self._screenshots: dict[str, bytes] = {}
        self._queue: list[Bookmark] = []
        self._path: Path | None = None
        self._awaiting_shot = False
        self._run = object()
        """This export's token: a step scheduled by an export that was stopped finds another one here and does nothing."""
        camera.shown.connect(self._view_shown)
        model.comparison_changed.connect(lambda: self.abort("the comparison it pictured was replaced"))

    def export_markdown(self, path: Path | None = None) -> bool:
        path = path or self.choose_path("export-md")
        if path is None:
            return False
        return self._write(path, bookmarks_markdown(self._session()).encode("utf-8"))

    def export_html(self, path: Path | None = None) -> bool:
        """Picture each bookmark as it was marked (`BookmarkCamera`), then write the report. False
        when none starts: no path chosen, no comparison, or an export still running."""
        path = path or self.choose_path("export-html")
        if path is None:
            return False
        if self._model.comparison is None:
            self._banners.show_message("session", "error", "Open and compare a pair before exporting the HTML report.")
            return False
        refusal = unfinished(self._model.native, self._model.oracle)
        if refusal is not None:  # its page said PARITY where report exits 2
            self._banners.show_message("session", "error", f"No HTML report of this pair: {refusal}, and report gives no verdict on it.")
            return False
        if self.exporting:
            self._status("An HTML report is being exported; export again when it is written.", 5000)
            return False
        self._path, self._screenshots, self._run = path, {}, object()
        self._queue = list(self._session().bookmarks)
        self._next_later()
        return True

    def _next_later(self) -> None:
        """The next step (a part of the camera's view, a bookmark, or the page), in a turn of the
        event loop of its own, after the timers and input that are due (`LATER_MS`)."""
        run = self._run

        def step() -> None:
            if run is self._run:
                self._next_bookmark()

        QTimer.singleShot(LATER_MS, self, step)

    @property
    def exporting(self) -> bool:
        """An export is picturing its bookmarks or writing its page."""
        return self._path is not None or self._tasks.task(EXPORT_LANE) is not None

    def abort(self, why: str | None = None) -> None:
        """Stop an export that is still picturing its bookmarks, writing nothing; `why` is said
        to the user (None: the window is closing). Its pictures are of one comparison: another
        one, or the user's Cancel, leaves nothing the page could honestly hold."""
        if self._path is None:
            return
        path, self._path, self._queue, self._screenshots, self._awaiting_shot = self._path, None, [], {}, False
        self._run = object()
        self._camera.done()
        if why is not None:
            self._status(f"HTML report not exported to {path}: {why}.", 8000)

    def _view_shown(self) -> None:
        """The camera drew what it was asked for: picture it."""
        if self._awaiting_shot:
            self._awaiting_shot = False
            self._shoot()

    def _write(self, path: Path, data: bytes) -> bool:
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            return self._written(path, describe_os_error(exc))
        return self._written(path, None)

    def _written(self, path: Path, problem: str | None) -> bool:
        """Say how an export ended: `problem` is why it was not written, or None."""
        if problem is not None:
            self._banners.show_message("session", "error", f"Could not write {path}: {problem}. The session is unchanged.")
            return False
        self._status(f"Exported {path}", 5000)
        self.exported.emit(path)
        return True

    def _next_bookmark(self) -> None:
        if self._queue and not self._camera.prepare():
            self._next_later()  # the camera's view is built a part per turn
            return
        while self._queue:
            self._awaiting_shot = True
            if self._camera.show(self._queue[0]):
                return  # the camera's `shown` follows
            self._awaiting_shot = False
            self._queue.pop(0)
        self._finish()

    def _shoot(self) -> None:
        bookmark = self._queue.pop(0)
        self._screenshots[bookmark.id] = self._camera.grab()
        self._next_later()

    def _finish(self) -> None:
        path, self._path = self._path, None
        self._camera.done()
        viewed = self._model.comparison
        if path is None or viewed is None:
            return
        comparison, session, screenshots = viewed.comparison, self._session().snapshot(), self._screenshots
        self._tasks.submit(
            EXPORT_LANE,
            lambda: iter_write_html(path, comparison, session, screenshots),
            on_success=lambda problem: self._written(path, problem),
            on_failure=lambda message: self._written(path, message),
            on_cancel=lambda: self._status(f"HTML report not exported to {path}: cancelled.", 8000),
        )
