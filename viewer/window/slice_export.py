"""Writing the tensor slice on show to a file (the tensor view's Export menu), off the UI thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from sessions.capture.reader import Capture
from sessions.compare.slice_export import iter_export
from viewer.tensor.tensor_view import TensorView
from viewer.widgets.banner import BannerArea
from viewer.workers import TaskSlots


class SliceExport:
    def __init__(
        self,
        view: TensorView,
        native: Callable[[], Capture | None],
        tasks: TaskSlots,
        banners: BannerArea,
        status: Callable[[str, int], None],
        parent: QWidget,
    ) -> None:
        self._view, self._native, self._tasks, self._banners, self._status, self._parent = view, native, tasks, banners, status, parent

    def export(self, what: str, suffix: str, path: Path | None = None) -> None:
        """`path` None asks, starting in the native capture's folder."""
        data = self._view.data
        if data is None:
            self._status("Select an op whose tensors are shown first.", 5000)
            return
        if path is None:
            native = self._native()
            start = native.path.parent if native is not None else Path.cwd()
            suggested = start / f"{data.request.label.replace(':', '_')}-{what}{suffix}"
            name, _ = QFileDialog.getSaveFileName(self._parent, f"Export {what} values", str(suggested), f"*{suffix}")
            if not name:
                return
            path = Path(name)
        target = path
        self._tasks.submit(
            "export",
            lambda: iter_export(data.native_bits, data.oracle_bits, data.dtype, what, target),
            on_success=lambda written: self._status(f"Wrote {written}", 8000),
            on_failure=lambda message: self._banners.show_message("export", "error", f"Could not export to {target}: {message}"),
        )
