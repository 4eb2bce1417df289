"""Dispatch comparison: how each aligned op's attention work was split into primitive calls.

Two runs can produce identical bits on one device while dispatching differently (the
head-chunked SDPA port is bit-exact on CPU but picks a different Metal kernel), so a
dispatch difference is its own finding, never inferred from tensors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sessions.capture import format as cf
from sessions.compare.aligned_pairs import AlignedPair
from sessions.compare.key import OpKey

COMPARED_FIELDS = (
    "batch",
    "kv_group",
    "head_start",
    "head_count",
    "q_heads",
    "kv_heads",
    "q_rows",
    "kv_len",
    "head_dim",
    "v_head_dim",
    "mask_kind",
    "dtype",
    "primitive",
    "metal_primitive",
)
"""Every dispatch field except the timings, which always differ."""


@dataclass
class DispatchDifference:
    key: OpKey
    native_calls: int
    oracle_calls: int
    fields: list[str]
    """Fields that differ in at least one call (or 'calls' when the call counts differ)."""
    native_summary: str
    oracle_summary: str


def events_by_record(table: np.ndarray) -> dict[int, list[dict[str, object]]]:
    """Dispatch rows grouped by the record (index seq) that made them, in call order."""
    grouped: dict[int, list[dict[str, object]]] = defaultdict(list)
    for row in table:
        event: dict[str, object] = {"call": int(row["call"])}
        for name in COMPARED_FIELDS:
            value = row[name]
            event[name] = cf.decode_field(value) if isinstance(value, (bytes, np.bytes_)) else int(value)
        grouped[int(row["index_seq"])].append(event)
    for events in grouped.values():
        events.sort(key=lambda e: int(e["call"]))  # type: ignore[arg-type]
    return grouped


SUMMARIZED_FIELDS = frozenset({"kv_group", "head_count", "q_rows", "kv_len", "mask_kind", "primitive", "metal_primitive"})
"""The fields every summary line shows (`summarize`); another is shown where it differs."""


def summarize(events: list[dict[str, object]], differing: list[str] | tuple[str, ...] = ()) -> str:
    """One line a person can compare: calls, head split per KV group, primitives, and each of
    `differing` the line does not already show (two runs that differed in `batch` alone printed
    two identical lines under "differs in batch")."""
    if not events:
        return "no dispatch recorded"
    chunks = "+".join(str(e["head_count"]) for e in events if e["kv_group"] == events[0]["kv_group"])
    # kv_group -1: the call covered every KV group, as one unchunked call does ("12 per KV group" was false of it).
    split = f"heads per call {chunks}" + (" over all KV groups" if events[0]["kv_group"] == -1 else " per KV group")
    primitives = sorted({str(e["primitive"]) for e in events})
    metal = sorted({str(e["metal_primitive"]) for e in events if e["metal_primitive"]})

    def values(field: str) -> str:
        # The first call's alone: two runs whose second calls took 4 and 8 rows printed two identical lines.
        found = [str(e[field]) for e in events]
        return "+".join(found) if field in differing else "/".join(dict.fromkeys(found))

    text = (
        f"{len(events)} call(s), {split}, {values('q_rows')} rows, "
        f"kv {values('kv_len')}, mask {values('mask_kind')}, primitive {'/'.join(primitives)}"
    )
    text += f", Metal would pick {'/'.join(metal)}" if metal else ""
    for field in differing:
        if field in COMPARED_FIELDS and field not in SUMMARIZED_FIELDS:
            text += f", {field.replace('_', ' ')} {'/'.join(dict.fromkeys(str(e[field]) for e in events))}"
    return text


def _differs(field: str, native: dict[str, object], oracle: dict[str, object], batches: tuple[int, int]) -> bool:
    """A field that differs between two calls, except a batch size each capture declares as its
    run's batch (root attribute `batch_size`): comparing a request alone with its row of a batch
    is what the user asked for, and the bits say whether the batch mattered."""
    if field == "batch" and (native[field], oracle[field]) == batches:
        return False
    return native[field] != oracle[field]


def compare_dispatch(
    pairs: Sequence[AlignedPair], native_table: np.ndarray, oracle_table: np.ndarray, batches: tuple[int, int] = (1, 1)
) -> list[DispatchDifference]:
    """Pairs whose attention calls differ; `batches` are the runs' declared batch sizes (native, oracle)."""
    native_events = events_by_record(native_table)
    oracle_events = events_by_record(oracle_table)
    differences: list[DispatchDifference] = []
    for pair in pairs:
        n = native_events.get(pair.native.record.seq, [])
        o = oracle_events.get(pair.oracle.record.seq, [])
        if not n and not o:
            continue
        fields = ["calls"] if len(n) != len(o) else []
        fields += [f for f in COMPARED_FIELDS if any(_differs(f, a, b, batches) for a, b in zip(n, o))]
        if fields:
            differences.append(DispatchDifference(pair.key, len(n), len(o), fields, summarize(n, fields), summarize(o, fields)))
    return differences
