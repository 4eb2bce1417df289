"""An axis that names stretches of the x axis (the prompt's segments, the decode steps), each
name over the middle of what is seen of its stretch.

A name is left out where it would overlap the one before it or spill past its stretch: a real
model's prompt is a few hundred of 240,000 ops, and its segments' names piled up on one another
at the left edge until the user zooms in, when they spread out again.
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics

SPILL_PX = 6
"""How far past its stretch a name may reach, so a short name over a narrow stretch still shows."""


class PartNamesAxis(pg.AxisItem):
    def __init__(self) -> None:
        super().__init__("top")
        self.setStyle(tickLength=0, tickTextOffset=4)
        self.setHeight(QFontMetrics(self.font()).height() + 8)  # sized to its ticks' text, the names' lower edges were cut off
        self._parts: list[tuple[float, float, str]] = []
        self._names: dict[float, str] = {}
        """The name over each middle `tickValues` gave."""
        self._room: dict[str, float] = {}
        """Pixels across each named stretch as seen (its narrowest, when a name repeats)."""

    def set_parts(self, parts: list[tuple[float, float, str]]) -> None:
        """(first, stop, name) of each stretch, in order; none hides the axis's names."""
        self._parts = parts
        self.picture = None
        self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        if not self._parts or maxVal <= minVal:
            return []
        per_unit = size / (maxVal - minVal)
        middles: list[float] = []
        self._names, self._room = {}, {}
        for first, stop, name in self._parts:
            low, high = max(first, minVal), min(stop, maxVal)
            if high <= low:
                continue
            middle = (low + high) / 2
            middles.append(middle)
            self._names[middle] = name
            self._room[name] = min(self._room.get(name, float("inf")), (high - low) * per_unit)
        return [(1.0, middles)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [self._names.get(value, "") for value in values]

    def generateDrawSpecs(self, p: Any) -> Any:
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs
        kept: list[Any] = []
        for rect, flags, text in texts:
            fits = rect.width() <= self._room.get(text, 0.0) + SPILL_PX
            if fits and (not kept or not rect.intersects(kept[-1][0])):
                kept.append((rect, flags, text))
        return axis, ticks, kept
