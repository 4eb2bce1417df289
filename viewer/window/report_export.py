"""File ▸ Export: the session's bookmarks and notes as Markdown, or the HTML report with a picture per bookmark.

The HTML report shows each bookmark as the user marked it, so every bookmark is shown in the
window in turn (its op, slice and colour scale), the tensor view is grabbed once it has drawn
it, and the selection the user had is put back at the end. The page is rendered and written off
the UI thread (0.3-0.45 s for 240,000 pairs). Writing is atomic: a failed export
leaves no half-written file and the session untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from sessions.atomic_write import atomic_write_bytes
from sessions.investigation.bookmarks_markdown import bookmarks_markdown
from sessions.investigation.model import Bookmark, Investigation
from sessions.investigation.store import describe_os_error
from sessions.report.html_page import iter_write_html
from viewer.pair_model import PairModel
from viewer.widgets.banner import BannerArea
from viewer.window.session_file import PathChooser, StatusMessage, ask_path
from viewer.workers import TaskSlots


def png_of(widget: QWidget) -> bytes:
    """The widget as it is drawn now, as PNG bytes."""
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    widget.grab().save(buffer, "PNG")
    buffer.close()
    return bytes(data)


@dataclass(frozen=True)
class BookmarkCamera:
    """How to picture a bookmark: show it as it was marked, know whether its view is still loading, grab it."""

    show: Callable[[Bookmark], bool]
    """Show the bookmark's op and view; False when its op is not in this comparison."""
    loading: Callable[[], bool]
    """The view is still reading what `show` asked for (then `view_shown` follows)."""
    grab: Callable[[], bytes]
    """The view as PNG bytes."""
    keep_view: Callable[[], Callable[[], None]]
    """What the window shows now (op, slice, colour scale, panel), as a call that puts it back."""


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
        self._put_back: Callable[[], None] | None = None
        """Puts back the view the export found: picturing the bookmarks changes it."""
        self._awaiting_shot = False

    def export_markdown(self, path: Path | None = None) -> bool:
        path = path or self.choose_path("export-md")
        if path is None:
            return False
        return self._write(path, bookmarks_markdown(self._session()).encode("utf-8"))

    def export_html(self, path: Path | None = None) -> bool:
        """Grab each bookmark's view (restored as it was marked), then write the report."""
        path = path or self.choose_path("export-html")
        if path is None:
            return False
        if self._model.comparison is None:
            self._banners.show_message("session", "error", "Open and compare a pair before exporting the HTML report.")
            return False
        self._path, self._screenshots = path, {}
        self._queue = list(self._session().bookmarks)
        self._put_back = self._camera.keep_view()
        self._next_bookmark()
        return True

    def view_shown(self) -> None:
        """The tensor view drew what it was asked for; if that was a bookmark's view, picture it."""
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
        while self._queue:
            self._awaiting_shot = True
            if not self._camera.show(self._queue[0]):
                self._awaiting_shot = False
                self._queue.pop(0)
                continue
            if self._awaiting_shot and not self._camera.loading():
                self._awaiting_shot = False
                self._shoot()
            return
        self._finish()

    def _shoot(self) -> None:
        bookmark = self._queue.pop(0)
        self._screenshots[bookmark.id] = self._camera.grab()
        QTimer.singleShot(0, self, self._next_bookmark)

    def _finish(self) -> None:
        path, self._path = self._path, None
        if self._put_back is not None:  # first: an export that ends without writing leaves the window as it found it too
            self._put_back()
            self._put_back = None
        viewed = self._model.comparison
        if path is None or viewed is None:
            return
        comparison, session, screenshots = viewed.comparison, self._session().snapshot(), self._screenshots
        self._tasks.submit(
            "export",
            lambda: iter_write_html(path, comparison, session, screenshots),
            on_success=lambda problem: self._written(path, problem),
            on_failure=lambda message: self._written(path, message),
        )
