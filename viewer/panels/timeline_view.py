"""The dispatch timeline: every SDPA call of both sides as a box, native lanes above oracle lanes.

All boxes are painted by one graphics item from the model's arrays (no item per box), with
level of detail: when more boxes are visible than pixels can show, they are merged per
pixel column, lane and colour, so 10,000+ calls pan and zoom as smoothly as 100.
"""

from __future__ import annotations

from html import escape

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QCursor, QPainter, QPen
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from backends.dispatch.timeline import (
    describe_event,
    first_slot_after_eos,
    hit,
    timeline_summary,
)
from sessions.compare.verdict import CONTRACT_MISMATCH
from sessions.report.word_colours import WORD_COLOURS
from viewer.panels.timeline_model import TimelineModel
from viewer.widgets.plain_text import plain_label, rich_label
from viewer.widgets.stale_while_hidden import StaleWhileHidden

PRIMITIVE_COLOURS: dict[str, str] = {
    "": "#6b7480",
    "unknown": "#8a8f98",
    "sdpa_vector": "#3b82f6",
    "sdpa_vector_2pass": "#06b6d4",
    "sdpa_full": "#2e9d57",
    "fallback": "#e0a526",
    "flash_attn_ext": "#7c3aed",
}
CONTRACT_COLOURS = ("#3b82f6", "#f97316", "#10b981", "#e11d48", "#eab308", "#06b6d4", "#84cc16", "#ec4899")
"""Colouring by contract: one colour per contract id, in the order the timeline met them."""
CONTRACT_DIFFERS_COLOUR = WORD_COLOURS[CONTRACT_MISMATCH]
DIFFERS_COLOUR = "#d64541"
MISMATCH_COLOUR = "#c04fd8"
EOS_COLOUR = "#7d8694"
"""The grey Token parity gives post-EOS steps."""
LOD_BOXES = 3000
"""Above this many visible boxes (or boxes under two pixels wide) they are merged per pixel column."""
SELECTED_MIN_PX = 5
"""The narrowest the selected call is outlined, in pixels, however far the axis is zoomed out."""
SELECTED_MARGIN_PX = 3
"""How far outside its box a selected call is outlined: its difference and contract outlines show inside."""


def palette(model: TimelineModel) -> list[str]:
    """The colour of each colour code of `model` (`TimelineModel.colour_codes`)."""
    names = model.colour_names()
    if model.colour_by != "contract":
        return [PRIMITIVE_COLOURS[name] for name in names]
    recorded = [name for name in names if name]
    return [CONTRACT_COLOURS[recorded.index(name) % len(CONTRACT_COLOURS)] if name else PRIMITIVE_COLOURS[""] for name in names]



NO_EVENTS = "No dispatch events: open a pair whose captures record attention calls."
class BoxesItem(pg.GraphicsObject):
    """Paints every box of the model in one pass; outlines mark differences, mismatches, selection."""

    def __init__(self, model: TimelineModel) -> None:
        super().__init__()
        self.model = model
        self._bounds = QRectF()
        self.painted_rects = 0
        """How many rectangles the last paint drew (after level of detail)."""
        self.selection_outlined = 0
        """How many boxes of the selected call the last zoomed-out paint outlined."""
        self.refresh()

    def refresh(self) -> None:
        self.prepareGeometryChange()
        boxes = self.model.boxes
        if boxes is None or boxes.event.size == 0:
            self._bounds = QRectF()
        else:
            x0, x1 = float(boxes.x0.min()), float(boxes.x1.max())
            self._bounds = QRectF(x0, 0.0, max(x1 - x0, 1e-9), float(np.ceil(boxes.y1.max())))
        self.update()

    def boundingRect(self) -> QRectF:
        return self._bounds

    def _visible(self) -> np.ndarray:
        boxes = self.model.boxes
        assert boxes is not None
        view = self.getViewBox()
        if view is None:
            return np.arange(boxes.event.size)
        rect = view.viewRect()
        top, bottom = sorted((rect.top(), rect.bottom()))
        return np.flatnonzero((boxes.x1 >= rect.left()) & (boxes.x0 <= rect.right()) & (boxes.y1 >= top) & (boxes.y0 <= bottom))

    def paint(self, painter: QPainter, option: object, widget: object = None) -> None:
        boxes = self.model.boxes
        if boxes is None or boxes.event.size == 0:
            return
        index = self._visible()
        codes = self.model.colour_codes()[boxes.event[index]]
        colours = palette(self.model)
        px = self.pixelWidth() or 1.0
        widths = boxes.x1[index] - boxes.x0[index]
        painter.setPen(Qt.PenStyle.NoPen)
        self.painted_rects = 0
        if index.size > LOD_BOXES or (index.size and float(np.median(widths)) < 2 * px):
            self._paint_merged(painter, index, codes, colours, px)
            self._mark_merged(painter, index, px)
            self._mark_selected(painter, index, px)
        else:
            for code in np.unique(codes).tolist():
                chosen = index[codes == code]
                painter.setBrush(QColor(colours[code]))
                painter.drawRects(self._rects(chosen))
                self.painted_rects += chosen.size
            self._outline(painter, index)
            self._mark_selected(painter, index, px)

    def _paint_merged(self, painter: QPainter, index: np.ndarray, codes: np.ndarray, colours: list[str], px: float) -> None:
        """One rectangle per (pixel column, lane, colour): bounded by pixels, not by events."""
        boxes = self.model.boxes
        assert boxes is not None
        column = np.floor(boxes.x0[index] / px).astype(np.int64)
        lane = np.floor(boxes.y0[index]).astype(np.int64)
        merged = np.unique(np.stack([codes.astype(np.int64), lane, column], axis=1), axis=0)
        for code in np.unique(merged[:, 0]).tolist():
            rows = merged[merged[:, 0] == code]
            painter.setBrush(QColor(colours[code]))
            painter.drawRects([QRectF(c * px, la + 0.1, px, 0.8) for la, c in rows[:, 1:].tolist()])
            self.painted_rects += len(rows)

    def _mark_merged(self, painter: QPainter, index: np.ndarray, px: float) -> None:
        """Zoomed out, highlights become a band along the lane's bottom edge, one per pixel column."""
        boxes, timeline = self.model.boxes, self.model.timeline
        assert boxes is not None and timeline is not None
        events = boxes.event[index]
        marks = (
            (timeline.differs[events], DIFFERS_COLOUR, 0.9),
            (timeline.route_mismatch[events], MISMATCH_COLOUR, 0.0),
            (self.model.contract_marked()[events], CONTRACT_DIFFERS_COLOUR, 0.45),
        )
        for mask, colour, offset in marks:
            chosen = index[mask]
            if not chosen.size:
                continue
            cells = np.unique(np.stack([np.floor(boxes.y0[chosen]), np.floor(boxes.x0[chosen] / px)], axis=1), axis=0)
            painter.setBrush(QColor(colour))
            painter.drawRects([QRectF(c * px, la + offset, px, 0.1) for la, c in cells.tolist()])

    def _mark_selected(self, painter: QPainter, index: np.ndarray, px: float) -> None:
        """The selected op's calls, on both sides (one slot: the same op), each outlined over its
        lane's height a few pixels outside its box: drawn on the box, the selection's outline hid
        its red "differs" or purple contract outline, and the oracle's calls of the op had none.
        Zoomed out (the time axis of any real run), at least a few pixels wide: a box under a
        pixel showed no selection at all."""
        boxes, timeline, selected = self.model.boxes, self.model.timeline, self.model.selected
        assert boxes is not None and timeline is not None
        chosen = index[timeline.slot[boxes.event[index]] == timeline.slot[selected]] if selected is not None else index[:0]
        self.selection_outlined = int(chosen.size)
        if not chosen.size:
            return
        pen = QPen(pg.mkColor(pg.getConfigOption("foreground")), 3.0)  # mkColor: the default foreground is "d", no colour to QColor
        pen.setCosmetic(True)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        # Its lane's whole height: a call of 2 of 24 heads is a sliver of it.
        for x0, x1, lane in zip(boxes.x0[chosen].tolist(), boxes.x1[chosen].tolist(), np.floor(boxes.y0[chosen]).tolist()):
            width = max(x1 - x0, SELECTED_MIN_PX * px) + 2 * SELECTED_MARGIN_PX * px
            painter.drawRect(QRectF((x0 + x1 - width) / 2, lane + 0.02, width, 0.96))

    def _rects(self, index: np.ndarray) -> list[QRectF]:
        b = self.model.boxes
        assert b is not None
        return [
            QRectF(x0, y0, x1 - x0, y1 - y0)
            for x0, x1, y0, y1 in zip(b.x0[index].tolist(), b.x1[index].tolist(), b.y0[index].tolist(), b.y1[index].tolist())
        ]

    def _outline(self, painter: QPainter, index: np.ndarray) -> None:
        boxes, timeline = self.model.boxes, self.model.timeline
        assert boxes is not None and timeline is not None
        painter.setBrush(Qt.BrushStyle.NoBrush)
        events = boxes.event[index]
        for mask, colour, width, style in (
            (self.model.contract_marked()[events], CONTRACT_DIFFERS_COLOUR, 3.0, Qt.PenStyle.SolidLine),
            (timeline.differs[events], DIFFERS_COLOUR, 2.0, Qt.PenStyle.SolidLine),
            (timeline.route_mismatch[events], MISMATCH_COLOUR, 2.0, Qt.PenStyle.DashLine),
        ):
            chosen = index[mask]
            if chosen.size:
                pen = QPen(pg.mkColor(colour), width, style)
                pen.setCosmetic(True)
                painter.setPen(pen)
                painter.drawRects(self._rects(chosen[:LOD_BOXES]))


class TimelineView(QWidget):
    """The timeline with its lane, axis and colour switches and a legend."""

    op_selected = Signal(object)
    """The OpKey of the op whose call was clicked (None for an unaligned op)."""
    call_selected = Signal(int)
    hovered = Signal(int)

    def __init__(self, model: TimelineModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.empty_text = NO_EVENTS
        """What the summary says with no timeline (one capture alone open says which to open)."""
        self.hover_text = ""
        self.lanes = self._combo({"group": "Lanes: layer × KV group", "call": "Lanes: call number"}, model.set_lane_mode)
        self.x_axis = self._combo({"call": "Axis: call order", "time": "Axis: time (ms)"}, model.set_x_mode)
        self.colours = self._combo(
            {"metal": "Colour: Metal primitive", "executed": "Colour: executed primitive", "contract": "Colour: contract"}, model.set_colour_by
        )
        self.summary = plain_label()
        self.summary.setWordWrap(True)
        bar = QHBoxLayout()
        for widget in (self.lanes, self.x_axis, self.colours):
            bar.addWidget(widget)
        bar.addStretch(1)
        self.legend = rich_label()
        self.legend.setWordWrap(True)
        self.plot = pg.PlotWidget(enableMenu=False)
        self.plot.getViewBox().invertY(True)
        self.plot.getViewBox().setMouseEnabled(x=True, y=False)
        self.plot.showGrid(x=False, y=False)
        self.plot.getAxis("left").setWidth(118)
        self.items = BoxesItem(model)
        self.plot.addItem(self.items)
        self.divider = pg.InfiniteLine(angle=0, pen=pg.mkPen("#8a8f98", width=1, style=Qt.PenStyle.DashLine))
        self.plot.addItem(self.divider)
        # Where the shared EOS ends the request: the calls after it looked like compared ones.
        self.eos_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen(EOS_COLOUR, width=2, style=Qt.PenStyle.DotLine), label="after the shared EOS →",
            labelOpts={"position": 0.9, "color": EOS_COLOUR, "anchors": [(0, 0.5), (0, 0.5)]},
        )
        self.eos_line.setVisible(False)
        self.plot.addItem(self.eos_line)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(self.legend)
        layout.addWidget(self.summary)
        layout.addWidget(self.plot, 1)
        self.plot.scene().sigMouseMoved.connect(self._moved)
        self.plot.scene().sigMouseClicked.connect(self._clicked)
        # Rebuilt when seen, like the other panels: a pair's opening and its comparison's arrival
        # each reset the model, most often while this tab is hidden.
        self._refresh = StaleWhileHidden(self, self._rebuild)
        model.changed.connect(self._refresh.request)
        # A hidden scene with an item to repaint has the whole window painted at once (Qt
        # dispatches a scene's updates immediately), outside the paint that would have drawn
        # everything once: each selection made while another tab was shown did.
        self._selection = StaleWhileHidden(self, self.items.update)
        model.selection_changed.connect(lambda _event: self._selection.request())
        self._rebuild()

    def _combo(self, choices: dict[str, str], setter: object) -> QComboBox:
        combo = QComboBox()
        for value, text in choices.items():
            combo.addItem(text, value)
        combo.currentIndexChanged.connect(lambda _i, c=combo, s=setter: s(c.currentData()))  # type: ignore[operator]
        return combo

    def _legend_text(self) -> str:
        """The swatches of what the boxes are coloured by now, and the marks. Contract ids come
        from someone else's capture: escaped."""
        if self.model.colour_by == "contract":
            shown = [(name or "no contract recorded", colour) for name, colour in zip(self.model.colour_names(), palette(self.model))]
        else:
            shown = [(name, colour) for name, colour in PRIMITIVE_COLOURS.items() if name not in ("", "unknown")]
        marked = self.model.timeline is not None and bool(self.model.contract_marked().any())
        extra = f"  <span style='color:{CONTRACT_DIFFERS_COLOUR}'>□</span> contract differs between sides" if marked else ""
        swatches = " ".join(f"<span style='color:{colour}'>■</span> {escape(name)}" for name, colour in shown)
        marks = f"<span style='color:{DIFFERS_COLOUR}'>□</span> differs between sides  <span style='color:{MISMATCH_COLOUR}'>┅</span> route ≠ prediction"
        return f"{swatches}   {marks}{extra}"

    def _rebuild(self) -> None:
        self.items.refresh()
        self.colours.blockSignals(True)
        self.colours.setCurrentIndex(self.colours.findData(self.model.colour_by))
        self.colours.blockSignals(False)
        self.legend.setText(self._legend_text())
        boxes, timeline = self.model.boxes, self.model.timeline
        left, bottom = self.plot.getAxis("left"), self.plot.getAxis("bottom")
        if boxes is None or timeline is None:
            left.setTicks([[]])
            bottom.setTicks([[]])  # no calls: the axis numbered nothing (-0.4 ... 0.4)
            bottom.setLabel("")
            self.summary.setText(self.empty_text)
            return
        left.setTicks([[(i + 0.5, text) for i, text in enumerate(boxes.lane_labels)]])
        self.divider.setPos(boxes.native_lanes)
        if self.model.x_mode == "call":
            bottom.setTicks([self._segment_ticks()])
            bottom.setLabel("attention op (aligned across sides)")
        else:
            bottom.setTicks(None)
            bottom.setLabel("time since the capture's first call (ms)")
        self.summary.setText(timeline_summary(timeline))
        eos_slot = first_slot_after_eos(timeline)
        self.eos_line.setVisible(self.model.x_mode == "call" and eos_slot is not None)  # by time, each side ends at its own moment
        if eos_slot is not None:
            self.eos_line.setPos(eos_slot)
        self.plot.getViewBox().setLimits(yMin=-0.2, yMax=len(boxes.lane_labels) + 0.2)
        self.plot.setYRange(0, len(boxes.lane_labels), padding=0.02)
        if boxes.event.size:
            # By call, the first slot's label is centred on it: half a slot more on the left keeps
            # it inside the axis, where pyqtgraph would otherwise drop it.
            room = 0.5 if self.model.x_mode == "call" else 0.0
            self.plot.setXRange(float(boxes.x0.min()) - room, float(boxes.x1.max()), padding=0.01)

    def _segment_ticks(self) -> list[tuple[float, str]]:
        assert self.model.timeline is not None
        ticks, seen = [], set()
        for slot in range(len(self.model.timeline.keys)):
            key = self.model.timeline.place(slot)
            if key is None or (key.step, key.segment) in seen:
                continue
            seen.add((key.step, key.segment))
            ticks.append((slot + 0.5, f"{key.step}:{key.segment}"))
        stride = max(1, -(-len(ticks) // 14))
        return ticks[::stride]

    def event_at(self, scene_pos: QPointF) -> int | None:
        if self.model.boxes is None:
            return None
        point = self.plot.getViewBox().mapSceneToView(scene_pos)
        return hit(self.model.boxes, point.x(), point.y())

    def scene_pos_of(self, event: int) -> QPointF:
        """The scene position of the centre of an event's first box (for tests and keyboard)."""
        boxes = self.model.boxes
        assert boxes is not None
        i = int(np.flatnonzero(boxes.event == event)[0])
        centre = QPointF((boxes.x0[i] + boxes.x1[i]) / 2, (boxes.y0[i] + boxes.y1[i]) / 2)
        return self.plot.getViewBox().mapViewToScene(centre)

    def _moved(self, scene_pos: QPointF) -> None:
        event = self.event_at(scene_pos)
        if event is None:
            self.hover_text = ""
            QToolTip.hideText()
            return
        assert self.model.timeline is not None
        self.hover_text = describe_event(self.model.timeline, event)
        QToolTip.showText(QCursor.pos(), self.hover_text, self.plot)
        self.hovered.emit(event)

    def _clicked(self, mouse_event: object) -> None:
        event = self.event_at(mouse_event.scenePos())  # type: ignore[attr-defined]
        if event is None:
            return
        self.select_event(event)

    def select_event(self, event: int) -> None:
        assert self.model.timeline is not None
        self.model.select(event)
        self.call_selected.emit(event)
        self.op_selected.emit(self.model.timeline.keys[int(self.model.timeline.slot[event])])

    def show_key(self, key: object) -> None:
        """Follow a selection made elsewhere: select the first call of that op, if it has any."""
        timeline = self.model.timeline
        if timeline is None or key not in timeline.keys:
            self.model.select(None)
            return
        events = np.flatnonzero(timeline.slot == timeline.keys.index(key))
        self.model.select(int(events[0]) if events.size else None)
