"""Run a Qt-free progress generator on a worker thread, with progress, cancel and newest-wins.

The domain layer expresses long work as a generator that yields `Progress` and returns its
result (docs/architecture.md). Here it is driven on a `QThread`; stopping iteration between
yields is cancellation, so the generator's own `finally` blocks release files. Results come
back through queued signals, so views only ever touch them on the UI thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy.ma  # noqa: F401  (see below)
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from sessions.capture.reader import CaptureError
from sessions.progress import Progress, ProgressGenerator

# numpy imports numpy.ma on first use (np.unique does). Imported on a worker thread while the
# window runs, it held the import lock for half a second (PySide's import hook reads the source
# of each module imported after it) and the window waited on it; here it is imported once, first.

PROGRESS_INTERVAL_S = 0.05
"""Progress reaches the UI at most this often: a fast generator must not flood the event loop."""


def describe_failure(exc: BaseException) -> str:
    """One readable line for the window: a CaptureError already names file, place and problem."""
    if isinstance(exc, CaptureError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _Runner(QObject):
    progressed = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, make_work: Callable[[], ProgressGenerator[Any]]) -> None:
        super().__init__()
        self._make_work = make_work
        self.stop = threading.Event()

    @Slot()
    def run(self) -> None:
        last = 0.0
        try:
            work = self._make_work()
            try:
                while True:
                    if self.stop.is_set():
                        self.cancelled.emit()
                        return
                    try:
                        step = next(work)
                    except StopIteration as done:
                        result = done.value
                        break
                    now = time.monotonic()
                    if isinstance(step, Progress) and now - last >= PROGRESS_INTERVAL_S:
                        last = now
                        self.progressed.emit(step)
            finally:
                work.close()
        except Exception as exc:  # every failure becomes a message in the window, never a crash
            self.failed.emit(describe_failure(exc))
            return
        if self.stop.is_set():
            self.cancelled.emit()
        else:
            self.succeeded.emit(result)


class Task(QObject):
    """One generator on its own thread. Emits exactly one of succeeded, failed or cancelled."""

    progressed = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    ended = Signal()

    def __init__(self, name: str, make_work: Callable[[], ProgressGenerator[Any]], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._thread = QThread()
        self._runner = _Runner(make_work)
        self._runner.moveToThread(self._thread)
        self._thread.started.connect(self._runner.run)
        self._runner.progressed.connect(self.progressed)
        for signal, relay in (
            (self._runner.succeeded, self.succeeded),
            (self._runner.failed, self.failed),
            (self._runner.cancelled, self.cancelled),
        ):
            signal.connect(relay)
            # Direct: the worker thread ends its own event loop. Queued, quit() would wait for the
            # UI thread, which may itself be waiting for this thread (a window closing mid-task
            # waited out the whole timeout, 30 s).
            signal.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)
        self._thread.finished.connect(self.ended)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._runner.stop.set()

    @property
    def is_cancelled(self) -> bool:
        return self._runner.stop.is_set()

    def wait(self, ms: int = 30_000) -> bool:
        return self._thread.wait(ms)


class TaskSlots(QObject):
    """Named lanes of background work where the newest request in a lane cancels the stale one.

    `active` tracks the single task whose progress the window shows; `busy_changed` lets
    the progress bar and Cancel button follow it.
    """

    busy_changed = Signal(bool)
    progressed = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lanes: dict[str, Task] = {}
        self._alive: set[Task] = set()
        """Every task whose thread has not ended, replaced ones included: none may be destroyed running."""
        self._wiring: dict[Task, list[tuple[Any, Callable[..., None]]]] = {}

    def submit(
        self,
        lane: str,
        make_work: Callable[[], ProgressGenerator[Any]],
        on_success: Callable[[Any], None],
        on_failure: Callable[[str], None],
        on_cancel: Callable[[], None] | None = None,
    ) -> Task:
        stale = self._lanes.get(lane)
        if stale is not None:
            stale.cancel()
        task = Task(lane, make_work, self)
        self._lanes[lane] = task
        self._alive.add(task)
        self._wiring[task] = [
            (task.progressed, lambda p, t=task: self._relay_progress(t, p)),
            (task.succeeded, lambda result, t=task: self._deliver(t, on_success, result, on_cancel)),
            (task.failed, lambda message, t=task: self._deliver(t, on_failure, message, on_cancel)),
            (task.cancelled, lambda t=task: self._deliver_cancel(t, on_cancel)),
            (task.ended, lambda t=task: self._finish(t)),
        ]
        for signal, slot in self._wiring[task]:
            signal.connect(slot)
        task.start()
        self.busy_changed.emit(True)
        return task

    def _relay_progress(self, task: Task, progress: Progress) -> None:
        if self._lanes.get(task.name) is task and not task.is_cancelled:
            self.progressed.emit(progress)

    def _deliver(self, task: Task, callback: Callable[[Any], None], value: Any, on_cancel: Callable[[], None] | None) -> None:
        """Only the newest task of a lane may touch the views: a stale answer is dropped. One the
        user cancelled as it ended is dropped too, and reported as cancelled: its view said
        "Loading ..." for good."""
        if self._lanes.get(task.name) is not task:
            return
        if not task.is_cancelled:
            callback(value)
        elif on_cancel is not None:
            on_cancel()

    def _deliver_cancel(self, task: Task, callback: Callable[[], None] | None) -> None:
        """A user's Cancel is reported; a task replaced by a newer one in its lane is not."""
        if callback is not None and self._lanes.get(task.name) is task:
            callback()

    def _finish(self, task: Task) -> None:
        task.wait()  # `finished` is emitted just before the thread stops; let it stop before deletion
        self._alive.discard(task)
        if self._lanes.get(task.name) is task:
            del self._lanes[task.name]
        # The callbacks capture this object; dropping them now breaks the cycle through Qt's
        # connections, which Python's collector cannot see (it would outlive the application).
        for signal, slot in self._wiring.pop(task, []):
            signal.disconnect(slot)
        task.deleteLater()
        self.busy_changed.emit(self.busy)

    @property
    def busy(self) -> bool:
        return bool(self._lanes)

    @property
    def idle(self) -> bool:
        """No thread running at all, replaced tasks included (safe to close what they read)."""
        return not self._alive

    def task(self, lane: str) -> Task | None:
        return self._lanes.get(lane)

    def cancel_lane(self, lane: str) -> None:
        task = self._lanes.get(lane)
        if task is not None:
            task.cancel()

    def drop_lane(self, lane: str) -> None:
        """Stop the lane's task and forget it, as a newer task in the lane would: none of its
        answers, its cancel included, reaches the views (its thread ends in its own time)."""
        task = self._lanes.pop(lane, None)
        if task is not None:
            task.cancel()
            self.busy_changed.emit(self.busy)

    def cancel_all(self) -> None:
        for task in list(self._lanes.values()):
            task.cancel()

    def shutdown(self, ms: int = 30_000) -> bool:
        """Cancel everything and wait for the threads, so none outlives the window; whether all ended."""
        tasks = list(self._alive)
        for task in tasks:
            task.cancel()
        return all([task.wait(ms) for task in tasks])
