"""What the window is looking at: the two open captures, their comparison and the selection.

Views take this model in `__init__` and subscribe to its signals (as napari's
qt_dims do); they never talk to each other directly, so a click in the overview, the tree or a
keyboard shortcut all end in `select` and every view follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from sessions.capture.reader import Capture
from sessions.gradual_release import iter_release

COLOUR_SCALES = ("absolute", "relative", "ULP")


class PairModel(QObject):
    captures_changed = Signal()
    comparison_changed = Signal()
    selection_changed = Signal(object)
    scale_changed = Signal(str)
    diagnosis_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.native: Capture | None = None
        self.oracle: Capture | None = None
        self.comparison: Any = None
        self.selected: Any = None
        self.scale = "ULP"
        self.locality: dict[Any, str] = {}
        """Op key -> local / inherited / undetermined, from the last diagnosis of this comparison."""
        self.not_compared: str | None = None
        """Why the open pair has no comparison and none is coming (it was cancelled, it failed);
        None while one may still come."""
        self._releases: list[Iterator[None]] = []
        self._reselect: Any = None
        """The key to select when the next comparison arrives (`swap`)."""
        self._release_step = QTimer(self)
        self._release_step.setInterval(0)
        self._release_step.timeout.connect(self._release_next)

    def set_captures(self, native: Capture | None, oracle: Capture | None) -> list[Capture]:
        """Replace the open pair; returns the captures no longer shown, for the caller to close."""
        old = [c for c in (self.native, self.oracle) if c is not None and c not in (native, oracle)]
        self.native, self.oracle = native, oracle
        self._reselect = None
        retired = [self.comparison]
        self.comparison = None
        self.not_compared = None
        self.selected = None
        self.locality = {}
        self.captures_changed.emit()
        self.comparison_changed.emit()
        self.diagnosis_changed.emit()  # the tree's cause column hides with the diagnosis it showed
        self.selection_changed.emit(None)
        self._release_later(retired)
        return old

    def swap(self) -> None:
        """The roles swapped; the op the user was on is selected again when the swapped pair's
        comparison holds its key (it went back to the first finding)."""
        key = None if self.selected is None else self.selected.key
        self.set_captures(self.oracle, self.native)
        self._reselect = key

    @property
    def has_pair(self) -> bool:
        return self.native is not None and self.oracle is not None

    def missing_side_text(self) -> str | None:
        """What an empty view says while one capture alone is open, else None: "Select an op in the
        alignment tree" over an empty tree, and "open a pair whose captures record attention calls"
        of a capture that records them, were wrong advice."""
        if (self.native is None) == (self.oracle is None):
            return None
        missing = "oracle" if self.oracle is None else "native"
        return f"Open the {missing} run's capture (drop it on the window): one capture alone has nothing to compare"

    def set_comparison(self, comparison: Any, not_compared: str | None = None) -> None:
        """`not_compared`, with no comparison: why none is coming (it was cancelled, it failed),
        so no view goes on saying one is running.

        The open pair compared again (a tolerance changed, a pairing broken or undone, the
        pairing mode switched) keeps the selected op while the new comparison holds its key, or
        pairs the same two records under another key (by position, a key carries positions), as
        that comparison's pair: every re-compare dropped it, and the window jumped to the first finding."""
        wanted = self.selected.key if self.selected is not None else self._reselect
        self._reselect = None
        kept = None if comparison is None or wanted is None else comparison.pair_of.get(wanted)
        if kept is None and comparison is not None and self.selected is not None:
            records = (self.selected.native_seq, self.selected.oracle_seq)
            kept = next((p for p in comparison.comparison.pairs if (p.native_seq, p.oracle_seq) == records), None)
        retired = [self.comparison]
        self.comparison = comparison
        self.not_compared = not_compared
        self.selected = kept
        self.locality = {}
        self.comparison_changed.emit()
        self.diagnosis_changed.emit()
        if kept is not None:
            self.selection_changed.emit(kept)
        self._release_later(retired)

    def _release_later(self, retired: list[Any]) -> None:
        """The comparison the views have just let go of (the only item of `retired`, which the
        caller keeps no other reference to) is freed in steps while the window is idle: freed at
        once, a real model's comparison held the window for 113 ms as a re-opened pair replaced
        it (`sessions.gradual_release`)."""
        if retired[0] is None:
            return
        self._releases.append(iter_release(retired))
        self._release_step.start()

    def _release_next(self) -> None:
        """One step of the oldest release: one batch per turn of the event loop, so input and
        paints come between them. A step that raised ends that release (its generator is done)."""
        if next(self._releases[0], False) is False:  # it yields None until it has freed everything
            self._releases.pop(0)
        if not self._releases:
            self._release_step.stop()

    def waiting(self) -> str:
        """What a view shows for the open pair while it has no comparison."""
        return "Comparing…" if self.not_compared is None else f"Not compared: {self.not_compared}"

    def set_locality(self, locality: dict[Any, str]) -> None:
        """A diagnosis finished: each diagnosed op's cause, for every view that shows one."""
        self.locality = dict(locality)
        self.diagnosis_changed.emit()

    def select(self, pair: Any) -> None:
        if pair is self.selected:
            return
        self.selected = pair
        self.selection_changed.emit(pair)

    def set_scale(self, scale: str) -> None:
        if scale not in COLOUR_SCALES:
            raise ValueError(f"colour scale must be one of {COLOUR_SCALES}, not {scale!r}")
        if scale != self.scale:
            self.scale = scale
            self.scale_changed.emit(scale)
