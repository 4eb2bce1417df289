"""The dispatch timeline and the live rerun, mounted beside the window's other panels.

Both follow the window's `PairModel`: the timeline arrives with the comparison (built off the
UI thread, `ViewedComparison.timeline`), and a selection made in the tree, the overview or the
timeline ends in `PairModel.select`, so every view (timeline highlight, rerun key, tensors)
follows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from backends.dispatch.timeline import Timeline
from sessions.capture.identity import CaptureIdentity, identity_of_file
from sessions.compare.key import OpKey
from sessions.compare.profiles import whole_op
from sessions.progress import Progress, ProgressGenerator
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.panels.rerun_panel import (
    RerunPanel,
    RerunPanelModel,
)
from viewer.panels.timeline_model import TimelineModel
from viewer.panels.timeline_view import NO_EVENTS, TimelineView
from viewer.widgets.banner import BannerArea
from viewer.workers import TaskSlots


def iter_identity(path: Path) -> ProgressGenerator[tuple[Path, CaptureIdentity]]:
    """A saved rerun's identity for the session (its structure check runs in a child process)."""
    yield Progress(0, 1, f"checking {path.name}")
    return path, identity_of_file(path)


class DispatchTabs(QObject):
    """Owns the timeline and rerun widgets and keeps them in step with the window's model."""

    rerun_saved = Signal(object, object, str)
    """(path, CaptureIdentity, op key text) of a rerun saved as a capture, for the session."""
    open_pair_requested = Signal(object, object)
    """(native path, oracle path): open this pair in a window of its own, beside this one."""

    def __init__(self, model: PairModel, tasks: TaskSlots, banners: BannerArea, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.model, self.tasks, self.banners = model, tasks, banners
        self.timeline_model = TimelineModel(None, self)
        self.timeline = TimelineView(self.timeline_model)
        self.rerun_model = RerunPanelModel(self)
        self.rerun = RerunPanel(self.rerun_model)
        self.timeline.op_selected.connect(self._timeline_selected)
        self.rerun.finished.connect(lambda _result: self.banners.clear("rerun"))
        self.rerun.saved.connect(self._rerun_saved)
        model.captures_changed.connect(self._captures_changed)
        model.comparison_changed.connect(self._comparison_changed)
        model.selection_changed.connect(self._selection_changed)

    # -- following the pair ------------------------------------------------------------------

    def _captures_changed(self) -> None:
        self.timeline.empty_text = self.model.missing_side_text() or NO_EVENTS
        self.timeline_model.set_timeline(None)
        self.rerun_model.set_pair(self.model.native, self.model.oracle, None)

    def _comparison_changed(self) -> None:
        viewed = self.model.comparison
        self.rerun_model.set_pair(self.model.native, self.model.oracle, viewed)
        if viewed is None or not self.model.has_pair:
            return
        if viewed.timeline is not None:
            self._timeline_ready(viewed.timeline)
        elif viewed.timeline_problem:
            self.banners.show_message("timeline", "warning", f"The dispatch timeline could not be built: {viewed.timeline_problem}")

    def _timeline_ready(self, timeline: Timeline) -> None:
        self.timeline_model.set_timeline(timeline)
        self._selection_changed(self.model.selected)

    # -- selection, both ways ---------------------------------------------------------------

    def _timeline_selected(self, key: OpKey | None) -> None:
        if key is None:
            return
        pair = cv.find_pair(self.model.comparison, key)
        if pair is not None:
            self.model.select(pair)

    def _selection_changed(self, pair: Any) -> None:
        if pair is None:
            return
        key = pair.key
        whole = whole_op(key)
        self.rerun.set_key(OpKey(whole.step, whole.segment, whole.layer, whole.op, 0, whole.positions).text())
        timeline, selected = self.timeline_model.timeline, self.timeline_model.selected
        if timeline is not None and selected is not None and timeline.keys[int(timeline.slot[selected])] == key:
            return  # the click that made this selection already chose the call to highlight
        self.timeline.show_key(key)

    # -- reruns beside the others ------------------------------------------------------------

    def _rerun_saved(self, saved: Path) -> None:
        """The rerun panel's own Save as capture button saves; here the saved capture joins the
        session and can be opened beside either side. A banner on every tab offered the same
        save after each rerun, beside the panel's button, and did more than it."""
        result = self.rerun_model.result
        assert result is not None
        key = result.target.text()
        self.tasks.submit(
            "rerun-identity",
            lambda: iter_identity(saved),
            on_success=lambda found: self._saved(found, key),
            on_failure=lambda message: self.banners.show_message("rerun", "error", f"The saved rerun cannot be read back: {message}"),
        )

    def _saved(self, found: tuple[Path, CaptureIdentity], key: str) -> None:
        path, identity = found
        self.rerun_saved.emit(path, identity, key)
        native, oracle = self.model.native, self.model.oracle
        actions = []
        if native is not None:
            actions.append(("Open native vs rerun", lambda: self.open_pair_requested.emit(native.path, path)))
        if oracle is not None:
            actions.append(("Open rerun vs oracle", lambda: self.open_pair_requested.emit(path, oracle.path)))
        self.banners.show_message("rerun", "info", f"Saved the rerun of {key} as {path.name}.", actions=actions)

    def shutdown(self) -> None:
        self.rerun.shutdown()
