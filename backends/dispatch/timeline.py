"""The dispatch timeline's data: every attention call of both captures, laid out and judged.

Which calls differ between the sides and which recorded primitive disagrees with the route
predictor are findings, not drawing, so they are settled here without Qt; the view only
paints boxes from these arrays. Events are placed on a shared axis: the n-th aligned
attention op (by canonical key) is slot n on both sides, so a native call and the oracle
call it should match sit one above the other. Arrays, not objects, because a long decode
holds tens of thousands of calls and the view filters and hit-tests them vectorised.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from backends.kernels import metal_routes
from sessions.capture import format as cf
from sessions.capture.reader import Capture
from sessions.compare.comparison import Comparison, unaligned_key
from sessions.compare.key import OpKey
from sessions.printable import printable

SIDES = ("native", "oracle")
PRIMITIVE_CODES: tuple[str, ...] = ("", metal_routes.UNKNOWN, *cf.PRIMITIVES)
"""Index = code stored per event; "" is "not recorded"."""
LANE_MODES = ("group", "call")
"""group: one lane per (layer, KV group); call: one lane per call number within its op."""
X_MODES = ("call", "time")


def _code(text: str) -> int:
    return PRIMITIVE_CODES.index(text) if text in PRIMITIVE_CODES else 1


def device_class(capture: Capture) -> metal_routes.DeviceClass:
    """What the route depends on about the capture's device, from its `device` attribute."""
    device = capture.meta.device.lower()
    if not device or device == "cpu" or device.startswith("cpu"):
        return metal_routes.CPU
    provenance = capture.meta.provenance if isinstance(capture.meta.provenance, dict) else {}
    architecture = str(provenance.get("gpu_architecture", ""))
    return metal_routes.DeviceClass.from_architecture(architecture) if architecture else metal_routes.GPU


@dataclass
class Timeline:
    """One row per dispatch event of either side; `keys[slot]` names each slot's op."""

    side: np.ndarray
    slot: np.ndarray
    call: np.ndarray
    layer: np.ndarray
    kv_group: np.ndarray
    head_start: np.ndarray
    head_count: np.ndarray
    q_heads: np.ndarray
    kv_heads: np.ndarray
    q_rows: np.ndarray
    kv_len: np.ndarray
    head_dim: np.ndarray
    primitive: np.ndarray
    metal: np.ndarray
    predicted: np.ndarray
    predicted_metal: np.ndarray
    t_start_ms: np.ndarray
    t_end_ms: np.ndarray
    differs: np.ndarray
    """The op this call belongs to dispatched differently on the two sides: one of the
    comparison's dispatch differences, nothing else, so the timeline counts what `report` does."""
    one_sided: np.ndarray
    """The call's record has no partner (unaligned, or after the shared EOS): nothing to compare it with."""
    route_mismatch: np.ndarray
    """The recorded primitive (or recorded Metal pick) disagrees with the route predictor."""
    contract: np.ndarray
    """Per event, the index in `contracts` of the effective contract its record declares: the
    arithmetic that ran, which one primitive can carry under several contracts (the
    attention-contract demo's visual prefill: the same calls, a bf16 single-range reduction
    against an f32 tiled one)."""
    contracts: list[str]
    """The effective contract ids of both captures' attention records; "" for none recorded."""
    contract_differs: np.ndarray
    """The op this call belongs to has a contract finding (the comparison's, as `report` counts them)."""
    mask_kind: list[str]
    keys: list[OpKey | None]
    difference_fields: dict[int, list[str]] = field(default_factory=dict)
    """slot -> the dispatch fields that differ there (dispatch_diff's words)."""
    versions: tuple[str, str] = ("", "")
    not_compared: str = ""
    """Why no call was compared across the sides ("" when they were): runs paired by position."""
    unpaired: dict[int, OpKey] = field(default_factory=dict)
    """slot -> the place of a call whose record the comparison left without a partner (`keys`
    holds None there: no pair to select), so its tooltip and axis name the op."""
    shared_eos: int | None = None
    """The step both runs stopped at: one-sided calls after it are by design, not gaps."""

    def place(self, slot: int) -> OpKey | None:
        """The op a slot stands for: its pair's key, else its unpaired record's place."""
        return self.keys[slot] or self.unpaired.get(slot)

    def post_eos(self, slot: int) -> bool:
        """Whether the slot's op comes after the shared EOS: one-sided by design, not a gap."""
        place = self.place(slot)
        return self.shared_eos is not None and place is not None and place.step > self.shared_eos

    def __len__(self) -> int:
        return int(self.side.size)

    def knows_metal_routes(self) -> bool:
        """Some call has a Metal primitive, recorded or predicted: not so for engines the route
        predictor does not cover (llama.cpp), whose boxes say only what ran."""
        unknown = PRIMITIVE_CODES.index(metal_routes.UNKNOWN)
        return bool((self.metal > unknown).any() or (self.predicted_metal > unknown).any())


def _keys_by_seq(comparison: Comparison) -> tuple[dict[int, OpKey], dict[int, OpKey]]:
    """Each side's record seq -> the key the comparison paired it under: the session's profiles
    and manual overrides apply here exactly as in the tree."""
    native = {p.native_seq: p.key for p in comparison.pairs}
    oracle = {p.oracle_seq: p.key for p in comparison.pairs}
    return native, oracle


def _unpaired_places(comparison: Comparison) -> dict[tuple[int, int], OpKey]:
    """(side, seq) -> the place of each record the comparison left without a partner, post-EOS ones included."""
    return {(SIDES.index(u.side), u.seq): unaligned_key(u) for u in (*comparison.unaligned, *comparison.post_eos_unaligned)}


def _predict(rows: np.ndarray, device: metal_routes.DeviceClass, version: str) -> tuple[list[int], list[int]]:
    """Per event: the predictor's primitive for the capture's device and MLX version, and for Metal."""
    here, metal = [], []
    for row in rows:
        call_kv = int(row["kv_heads"]) if int(row["kv_group"]) == -1 else 1
        shape = metal_routes.SdpaShape(
            int(row["q_rows"]), int(row["head_count"]), call_kv, int(row["head_dim"]), int(row["v_head_dim"]),
            int(row["kv_len"]), cf.decode_field(row["mask_kind"]), cf.decode_field(row["dtype"]),
        )
        here.append(_code(metal_routes.predict_route(shape, device, version).primitive))
        gpu = device if device.gpu else metal_routes.GPU
        metal.append(_code(metal_routes.predict_route(shape, gpu, version).primitive))
    return here, metal


def build_timeline(native: Capture, oracle: Capture, comparison: Comparison) -> Timeline:
    """All dispatch events of both captures on one call axis, with differences and route checks.

    Slots and differences come from `comparison` (its pairs and dispatch differences), never
    from a second alignment; a call of a record the comparison left unaligned gets a slot of its
    own. Where the comparison did not compare the calls (runs cut differently, where one record
    spans several pairs; a capture that records none), each side's records keep slots of their own."""
    captures = (native, oracle)
    keys = _keys_by_seq(comparison)
    apart = bool(comparison.dispatch_not_compared)
    together = _paired_whole(comparison) if apart else set()
    slots: dict[object, int] = {}
    slot_keys: list[OpKey | None] = []
    places = _unpaired_places(comparison)
    unpaired: dict[int, OpKey] = {}

    def ident(side: int, seq: int) -> object:
        return (side, seq) if apart and (side, seq) not in together else keys[side].get(seq) or (side, seq)

    for side, capture in enumerate(captures):
        for seq in dict.fromkeys(capture.dispatch["index_seq"].tolist()):
            if ident(side, seq) not in slots:
                slots[ident(side, seq)] = len(slot_keys)
                if seq not in keys[side] and (side, seq) in places:
                    unpaired[len(slot_keys)] = places[(side, seq)]
                slot_keys.append(keys[side].get(seq))
    columns: dict[str, list] = {name: [] for name in ("side", "slot", "layer", "contract", "predicted", "predicted_metal")}
    tables = []
    contracts: dict[str, int] = {}
    for side, capture in enumerate(captures):
        table = capture.dispatch
        tables.append(table)
        columns["side"] += [side] * len(table)
        columns["slot"] += [slots[ident(side, seq)] for seq in table["index_seq"].tolist()]
        columns["layer"] += capture.index["layer"][table["index_seq"]].tolist()
        names = [cf.decode_field(v) for v in capture.index["effective_contract_id"][table["index_seq"]].tolist()]
        columns["contract"] += [contracts.setdefault(name, len(contracts)) for name in names]
        here, metal = _predict(table, device_class(capture), capture.meta.mlx_version())
        columns["predicted"] += here
        columns["predicted_metal"] += metal
    both = np.concatenate(tables) if tables else np.zeros(0, dtype=cf.DISPATCH_DTYPE)
    primitive = np.array([_code(cf.decode_field(v)) for v in both["primitive"].tolist()], dtype=np.int8)
    metal = np.array([_code(cf.decode_field(v)) for v in both["metal_primitive"].tolist()], dtype=np.int8)
    predicted = np.array(columns["predicted"], dtype=np.int8)
    predicted_metal = np.array(columns["predicted_metal"], dtype=np.int8)
    unknown = PRIMITIVE_CODES.index(metal_routes.UNKNOWN)
    mismatch = ((predicted != unknown) & (primitive != predicted)) | (
        (metal > unknown) & (predicted_metal != unknown) & (metal != predicted_metal)
    )
    slot = np.array(columns["slot"], dtype=np.int64)
    side = np.array(columns["side"], dtype=np.int8)
    fields = {slots[d.key]: d.fields for d in comparison.dispatch_differences if d.key in slots}
    # By each side's record, not by slot: runs cut differently give each side's records slots of their own.
    found = comparison.contracts.by_key()
    marked = [p for p in comparison.pairs if p.key in found]
    contract_seqs = [[p.native_seq for p in marked], [p.oracle_seq for p in marked]]
    sides_per_slot = np.zeros((len(slot_keys), 2), dtype=bool)
    sides_per_slot[slot, side] = True
    alone = ~sides_per_slot.all(axis=1)
    start = [t["t_start_ns"].min() if len(t) else 0 for t in tables]
    origin = np.concatenate([np.full(len(t), start[i], dtype=np.int64) for i, t in enumerate(tables)]) if tables else np.zeros(0, np.int64)
    return Timeline(
        side=side,
        slot=slot,
        call=both["call"].astype(np.int32),
        layer=np.array(columns["layer"], dtype=np.int32),
        kv_group=both["kv_group"].astype(np.int32),
        head_start=both["head_start"].astype(np.int32),
        head_count=both["head_count"].astype(np.int32),
        q_heads=both["q_heads"].astype(np.int32),
        kv_heads=both["kv_heads"].astype(np.int32),
        q_rows=both["q_rows"].astype(np.int32),
        kv_len=both["kv_len"].astype(np.int32),
        head_dim=both["head_dim"].astype(np.int32),
        primitive=primitive,
        metal=metal,
        predicted=predicted,
        predicted_metal=predicted_metal,
        t_start_ms=(both["t_start_ns"] - origin) / 1e6,
        t_end_ms=(both["t_end_ns"] - origin) / 1e6,
        differs=np.isin(slot, sorted(fields)),
        one_sided=alone[slot] if not apart else np.zeros(slot.size, dtype=bool),
        route_mismatch=mismatch,
        contract=np.array(columns["contract"], dtype=np.int32),
        contracts=list(contracts),
        contract_differs=np.where(side == 0, np.isin(both["index_seq"], contract_seqs[0]), np.isin(both["index_seq"], contract_seqs[1])),
        mask_kind=[cf.decode_field(v) for v in both["mask_kind"].tolist()],
        keys=slot_keys,
        difference_fields=fields,
        versions=(native.meta.mlx_version(), oracle.meta.mlx_version()),
        not_compared=comparison.dispatch_not_compared,
        unpaired=unpaired,
        shared_eos=comparison.verdict.shared_eos,
    )


def _paired_whole(comparison: Comparison) -> set[tuple[int, int]]:
    """(side, seq) of the records paired whole with one record of the other side, as a decode
    step's are when the prompts were cut differently: their calls were compared
    (`comparison.CUT_APART`), so they share a slot and show what differs."""
    pairs = comparison.pairs
    native, oracle = Counter(p.native_seq for p in pairs), Counter(p.oracle_seq for p in pairs)
    whole = [p for p in pairs if native[p.native_seq] == 1 and oracle[p.oracle_seq] == 1]
    return {(0, p.native_seq) for p in whole} | {(1, p.oracle_seq) for p in whole}


@dataclass(frozen=True)
class Boxes:
    """Rectangles to paint, one or more per event: x0, x1, y0, y1 in view units, and which event."""

    event: np.ndarray
    x0: np.ndarray
    x1: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    lane_labels: list[str]
    native_lanes: int


def layout(timeline: Timeline, lane_mode: str = "group", x_mode: str = "call") -> Boxes:
    """Lanes top to bottom (native first, then oracle); a box's height is its head range in the lane.

    In group mode an unchunked call (KV group -1) covers every KV group of its layer, so it
    gets one box in each group's lane; in call mode lane k holds every op's k-th call.
    """
    if lane_mode not in LANE_MODES or x_mode not in X_MODES:
        raise ValueError(f"lane mode must be one of {LANE_MODES} and x mode one of {X_MODES}")
    n = len(timeline)
    events = np.arange(n)
    if lane_mode == "group":
        groups = np.maximum(timeline.kv_heads, 1)
        repeat = np.where(timeline.kv_group == -1, groups, 1)
        event = np.repeat(events, repeat)
        offsets = np.arange(event.size) - np.repeat(np.cumsum(repeat) - repeat, repeat)
        group = np.where(timeline.kv_group[event] == -1, offsets, timeline.kv_group[event])
        gqa = np.maximum(timeline.q_heads[event] // groups[event], 1)
        lo = np.clip(timeline.head_start[event] - group * gqa, 0, gqa)
        hi = np.clip(timeline.head_start[event] + timeline.head_count[event] - group * gqa, 0, gqa)
        frac0, frac1 = lo / gqa, hi / gqa
        lane_id = np.stack([timeline.side[event], timeline.layer[event], group], axis=1)
        label = lambda s, a, b: f"{SIDES[s]} L{a} g{b}" if a >= 0 else f"{SIDES[s]} g{b}"  # noqa: E731
    else:
        event = events
        heads = np.maximum(timeline.q_heads, 1)
        frac0 = timeline.head_start / heads
        frac1 = (timeline.head_start + timeline.head_count) / heads
        lane_id = np.stack([timeline.side, timeline.call, np.zeros(n, dtype=np.int32)], axis=1)
        label = lambda s, a, _b: f"{SIDES[s]} call {a}"  # noqa: E731
    unique, lane = np.unique(lane_id, axis=0, return_inverse=True) if event.size else (np.zeros((0, 3), int), np.zeros(0, int))
    lane = lane.reshape(-1)
    pad = 0.1
    y0 = lane + pad + frac0 * (1 - 2 * pad)
    y1 = lane + pad + frac1 * (1 - 2 * pad)
    if x_mode == "call":
        x0 = timeline.slot[event] + 0.08
        x1 = timeline.slot[event] + 0.92
    else:
        x0 = timeline.t_start_ms[event]
        x1 = np.maximum(timeline.t_end_ms[event], x0 + 1e-3)
    labels = [label(int(s), int(a), int(b)) for s, a, b in unique.tolist()]
    return Boxes(event, x0.astype(np.float64), x1.astype(np.float64), y0, y1, labels, int(np.sum(unique[:, 0] == 0)) if len(unique) else 0)


def describe_event(timeline: Timeline, index: int) -> str:
    """The tooltip: what the call was, its plan, the route it took and what the predictor says."""
    t = timeline
    slot = int(t.slot[index])
    place = t.place(slot)
    where = "a record of no known op" if place is None else place.label() if t.keys[slot] is not None else f"{place.label()}, without a partner"
    group = "all KV groups (unchunked)" if t.kv_group[index] == -1 else f"KV group {t.kv_group[index]}"
    last = t.head_start[index] + t.head_count[index] - 1
    lines = [
        f"{SIDES[int(t.side[index])]} — {where}, call {t.call[index]}",
        f"q [{t.q_heads[index]} heads x {t.q_rows[index]} rows x {t.head_dim[index]}], kv [{t.kv_heads[index]} heads x {t.kv_len[index]}], mask {t.mask_kind[index]}",
        f"plan: {group}, heads {t.head_start[index]}..{last} ({t.head_count[index]} of {t.q_heads[index]})",
        f"route: {PRIMITIVE_CODES[t.primitive[index]] or 'not recorded'} (predicted here: {PRIMITIVE_CODES[t.predicted[index]] or '-'})",
        f"Metal: {PRIMITIVE_CODES[t.metal[index]] or 'not recorded'} (predicted: {PRIMITIVE_CODES[t.predicted_metal[index]] or '-'})",
        f"contract: {printable(t.contracts[int(t.contract[index])]) or 'not recorded'}",
        f"time {t.t_end_ms[index] - t.t_start_ms[index]:.3f} ms",
    ]
    if t.differs[index]:
        lines.append("differs between sides: " + ", ".join(t.difference_fields.get(int(t.slot[index]), ["dispatch"])))
    if t.one_sided[index]:
        lines.append(
            f"no call on the other side to compare: after the shared EOS (step {t.shared_eos}), where one run stopped"
            if t.post_eos(slot) else "no call on the other side to compare: its record has no partner (Unaligned lists why)"
        )
    if t.route_mismatch[index]:
        lines.append("recorded primitive disagrees with the route predictor")
    if t.contract_differs[index]:
        lines.append("its op's contract differs between the sides (a contract finding)")
    return "\n".join(lines)


def first_slot_after_eos(timeline: Timeline) -> int | None:
    """The first attention op (slot) after the shared EOS, where the timeline stops being a comparison; None without one."""
    return next((slot for slot in range(len(timeline.keys)) if timeline.post_eos(slot)), None)


def timeline_summary(timeline: Timeline) -> str:
    """The line above the timeline: how many ops dispatch differently, as `report`'s Dispatch
    section counts them (calls of records without a partner are not differences), or why none
    was compared."""
    differing = len({int(s) for s in timeline.slot[timeline.differs].tolist()})
    alone = {int(s) for s in timeline.slot[timeline.one_sided].tolist()}
    after_eos = sum(1 for s in alone if timeline.post_eos(s))
    mismatches = int(timeline.route_mismatch.sum())
    compared = f"{differing} op(s) dispatch differently"
    if timeline.not_compared:
        # Compared in part (runs cut differently): what differs among the calls compared, then why the rest were not.
        compared = f"{compared}; dispatch {timeline.not_compared}" if differing else f"dispatch {timeline.not_compared}"
    contracts = len({int(s) for s in timeline.slot[timeline.contract_differs].tolist()})
    compared += f"; {contracts} op(s) whose contract differs (outlined)" if contracts else ""
    unpaired = f"; {len(alone) - after_eos} op(s) of records without a partner" if len(alone) > after_eos else ""
    if after_eos:
        unpaired += f"; {after_eos} op(s) after the shared EOS (step {timeline.shared_eos}), one-sided by design"
    return (
        f"{len(timeline)} calls in {len(timeline.keys)} attention ops; {compared}{unpaired}; "
        f"{mismatches} call(s) whose recorded primitive disagrees with the route predictor"
    )


def hit(boxes: Boxes, x: float, y: float) -> int | None:
    """The event whose box contains (x, y), or None."""
    inside = np.flatnonzero((boxes.x0 <= x) & (x <= boxes.x1) & (boxes.y0 <= y) & (y <= boxes.y1))
    return int(boxes.event[inside[0]]) if inside.size else None
