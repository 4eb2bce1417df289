"""What the dispatch timeline shows: the built timeline, its lane and axis modes, the selection.

The timeline itself (which calls differ, which disagree with the route predictor, where
each box goes) is computed in `backends.dispatch.timeline`; this holds the user's choices
and tells the view when to repaint. Views take this model in `__init__`.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QObject, Signal

from backends.dispatch.timeline import (
    LANE_MODES,
    PRIMITIVE_CODES,
    X_MODES,
    Boxes,
    Timeline,
    layout,
)

COLOUR_BY = ("metal", "executed", "contract")
"""metal: the Metal primitive (recorded, else predicted); executed: the primitive that ran;
contract: the effective contract the call's record declares (the arithmetic that ran, which
one primitive can carry under several)."""


class TimelineModel(QObject):
    changed = Signal()
    """Data, lanes, axis or colouring changed: the boxes must be rebuilt and repainted."""
    selection_changed = Signal(object)
    """The selected event index, or None."""

    def __init__(self, timeline: Timeline | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.timeline = timeline
        self.lane_mode = "group"
        self.x_mode = "call"
        self.preferred_colour = "metal"
        """What the user chose; a timeline without any Metal route is coloured by what ran instead."""
        self.colour_by = self._colour_for(timeline)
        self.selected: int | None = None
        self.boxes: Boxes | None = None
        self._relayout()

    def _relayout(self) -> None:
        self.boxes = layout(self.timeline, self.lane_mode, self.x_mode) if self.timeline is not None else None

    def _colour_for(self, timeline: Timeline | None) -> str:
        """The user's choice, except that a timeline without any Metal route is coloured by the
        primitive that ran rather than by Metal: it would be all grey."""
        if self.preferred_colour == "metal" and timeline is not None and not timeline.knows_metal_routes():
            return "executed"
        return self.preferred_colour

    def set_timeline(self, timeline: Timeline | None) -> None:
        self.timeline = timeline
        self.colour_by = self._colour_for(timeline)
        self.selected = None
        self._relayout()
        self.changed.emit()
        self.selection_changed.emit(None)

    def set_lane_mode(self, mode: str) -> None:
        if mode not in LANE_MODES:
            raise ValueError(f"lane mode must be one of {LANE_MODES}, not {mode!r}")
        if mode != self.lane_mode:
            self.lane_mode = mode
            self._relayout()
            self.changed.emit()

    def set_x_mode(self, mode: str) -> None:
        if mode not in X_MODES:
            raise ValueError(f"x mode must be one of {X_MODES}, not {mode!r}")
        if mode != self.x_mode:
            self.x_mode = mode
            self._relayout()
            self.changed.emit()

    def set_colour_by(self, colour_by: str) -> None:
        if colour_by not in COLOUR_BY:
            raise ValueError(f"colour must be one of {COLOUR_BY}, not {colour_by!r}")
        self.preferred_colour = colour_by
        if colour_by != self.colour_by:
            self.colour_by = colour_by
            self.changed.emit()

    def select(self, event: int | None) -> None:
        if event != self.selected:
            self.selected = event
            self.selection_changed.emit(event)

    def colour_codes(self) -> np.ndarray:
        """Per event, the code its box is coloured by: an index into `colour_names()`."""
        assert self.timeline is not None
        t = self.timeline
        if self.colour_by == "contract":
            return t.contract
        if self.colour_by == "executed":
            return t.primitive
        return np.where(t.metal > 1, t.metal, t.predicted_metal)

    def contract_marked(self) -> np.ndarray:
        """Per event, whether it is marked as a call of an op with a contract finding, whatever the
        boxes are coloured by: marked only when coloured by contract, a CONTRACT MISMATCH's calls
        looked like any others under the default colouring."""
        assert self.timeline is not None
        return self.timeline.contract_differs

    def colour_names(self) -> list[str]:
        """What each colour code stands for: a primitive, or a contract id ("" for none recorded)."""
        if self.colour_by == "contract":
            return self.timeline.contracts if self.timeline is not None else []
        return list(PRIMITIVE_CODES)
