"""Bookmarks pictured for the HTML report in a tensor view of the camera's own, never on screen.

The report shows each bookmark as the user marked it: its op, slice and colour scale. Shown in
the window one after another, the bookmarks changed what the user was looking at, and putting
the user's op back redrew it and repainted the whole window in one turn of the event loop
(164-192 ms on a 240,000-pair comparison, past the 100 ms a window may stall). A view of its
own changes nothing the user sees, so nothing has to be put back.
"""

from __future__ import annotations

from collections.abc import Callable

import shiboken6
from PySide6.QtCore import (
    QBuffer,
    QByteArray,
    QIODevice,
    QObject,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QWidget

from sessions.compare.key import OpKey
from sessions.investigation.model import Bookmark
from viewer import comparison_view as cv
from viewer.pair_model import COLOUR_SCALES, PairModel
from viewer.tensor.difference_maps import DifferenceMaps
from viewer.tensor.error_plots import ErrorPlots
from viewer.tensor.tensor_loader import iter_prepare
from viewer.tensor.tensor_view import TensorView
from viewer.window.session_sync import slice_spec_of
from viewer.workers import TaskSlots

LANE = "picture"
"""The task lane the camera reads its tensors in: the window's own "tensor" lane is the user's view."""
SETTLE_PAINTS = 5
"""At most this many paints before a picture is taken as it is (two or three settle a view)."""
LATER_MS = 1
"""A later step of an export waits this long, so the timers and input that are due run first: a
step queued at 0 ms ran before them, and two steps held the window as one (112 ms)."""
SMALLEST = QSize(1000, 640)
"""The smallest picture taken: a window made small, or a tensor view never laid out, still gives a legible page."""


class BookmarkCamera(QObject):
    """Shows a bookmark as it was marked in its own tensor view, then grabs it as PNG bytes."""

    shown = Signal()
    """What `show` asked for (or the sentence saying why it cannot be shown) is drawn and laid
    out: grab it. Given once for each `show` that returned True, in a later turn of the event
    loop, unless the camera is told it is `done` first."""

    def __init__(
        self,
        model: PairModel,
        tasks: TaskSlots,
        size: Callable[[], QSize],
        missing: Callable[[OpKey], None],
        parent: QWidget,
    ) -> None:
        """`model` is the window's (its pair and comparison are pictured, its selection and colour
        scale left alone); `size` is the size of the window's tensor view, which the pictures take;
        `missing` says that a bookmark's op is not in this comparison."""
        super().__init__(parent)
        self._window_model = model
        self._tasks = tasks
        self._size = size
        self._missing = missing
        self._host = parent
        self._scale = PairModel(self)
        """The camera's own colour scale (the only part of a model a tensor view reads)."""
        self._view: TensorView | None = None
        self._errors: ErrorPlots | None = None
        """The view's error plots, built by `prepare` in a turn of the event loop of their own."""
        self._maps: DifferenceMaps | None = None
        """Its heatmaps, built by `prepare` in a turn of their own."""
        self._picture: QImage | None = None
        """The settled paint, which `grab` gives."""

    def show(self, bookmark: Bookmark) -> bool:
        """Start drawing the bookmark's op, slice and colour scale; False when its op is not in this
        comparison. A view built for it (`_sized_view`) draws in a later turn of the event loop,
        after the timers and input that are due: its build and its tensor's read in one turn held
        the window 98 ms (`LATER_MS`)."""
        viewed = self._window_model.comparison
        native, oracle = self._window_model.native, self._window_model.oracle
        pair = cv.find_pair(viewed, bookmark.op)
        if pair is None or native is None or oracle is None:
            self._missing(bookmark.op)
            return False
        new = self._view is None
        view = self._sized_view()
        saved = bookmark.view
        scale = saved.colour_scale.mode if saved is not None and saved.colour_scale.mode in COLOUR_SCALES else self._window_model.scale
        spec = slice_spec_of(saved, len(pair.metrics.shape)) if saved is not None else None
        request = cv.tensor_request(viewed, native, oracle, pair, spec)

        def draw() -> None:
            if view is not self._view:
                return  # the camera let go of the view (`done`)
            self._scale.set_scale(scale)
            if isinstance(request, str):
                view.clear(request)
                return
            view.show_loading(request.label)
            self._tasks.submit(
                LANE,
                lambda: iter_prepare(request),
                on_success=view.show_slice,
                on_failure=lambda message: view.clear(f"Cannot show this pair: {message}"),
            )

        if new:
            QTimer.singleShot(LATER_MS, self, draw)
        else:
            draw()
        return True

    def _drawn(self) -> None:
        """The view drew what was asked for. A view never shown is laid out as it is painted (its
        axes take the width of the tick labels they painted), so it is painted in turns of the
        event loop of their own until two paints agree: grabbed at once, a new view's first
        picture had plots without axes, and the next one colour bars without their labels."""
        QTimer.singleShot(0, self, lambda view=self._view: self._settle(view, None, 1))

    def _settle(self, view: TensorView | None, last: QImage | None, paints: int) -> None:
        """Paint number `paints` of `view` (`last`: the one before), unless the camera has let go
        of the view since (`done`)."""
        if view is None or view is not self._view:
            return
        image = view.grab().toImage()
        if image == last or paints >= SETTLE_PAINTS:
            self._picture = image
            self.shown.emit()
        else:
            QTimer.singleShot(0, self, lambda: self._settle(view, image, paints + 1))

    def grab(self) -> bytes:
        """The view as its last paint drew it, once laid out, as PNG bytes."""
        assert self._picture is not None, "grab follows `shown`"
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        self._picture.save(buffer, "PNG")
        buffer.close()
        return bytes(data)

    def done(self) -> None:
        """The export has its pictures: the view goes, with the last tensor it drew. Cleared
        instead, its plots were laid out again while the page was rendered (140 ms of the
        window's time on a 240,000-pair comparison)."""
        self._tasks.drop_lane(LANE)
        for built in (self._view, self._errors, self._maps):
            if built is not None:
                shiboken6.delete(built)
        self._view, self._errors, self._maps = None, None, None
        self._picture = None

    def prepare(self) -> bool:
        """Build the next part of the camera's tensor view for an export: its error plots, then its
        heatmaps, one part a call, each in a turn of the event loop of its own; the rest as the
        first bookmark is shown. True once nothing is left to build beforehand. Built in one
        turn, the view held the window 98 ms (122 ms with the rest of that turn) on a 240,000-pair
        comparison; in two (error plots, then the rest), the export's longest gap was 74-83 ms,
        and in three 55-64 ms."""
        if self._view is not None:
            return True
        if self._errors is None:
            self._errors = ErrorPlots()
            return False
        if self._maps is None:
            self._maps = DifferenceMaps()
            return False
        return True

    def _sized_view(self) -> TensorView:
        """The camera's tensor view, sized as the window's: a window of the main window's (deleted
        with it) that is laid out and painted when grabbed but never shown."""
        size = self._size().expandedTo(SMALLEST)
        if self._view is None:
            view = TensorView(self._scale, errors=self._errors, maps=self._maps)
            self._errors, self._maps = None, None  # the view's now, deleted with it
            view.setParent(self._host, Qt.WindowType.Window)
            view.slice_shown.connect(self._drawn)
            self._view = view
        self._view.resize(size)
        return self._view
