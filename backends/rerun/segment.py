"""Live rerun: recompute a captured op or segment through MLX and judge it three ways.

A parity investigation ends in a hypothesis ("the oracle's tiled attention is the cause"),
and the quickest test is to recompute the place where the runs part from one side's own
inputs on a chosen route, then see whose bits come back. `iter_rerun` does that for one
aligned op or one segment (an attention block, a full decoder layer), compares the result
with native and oracle using the diff engine's metrics, and measures all three against a
float64 reference of the same math, so the table also says which side is closer to exact.

It reports what actually ran: the device, and per SDPA call the primitive MLX took there.
On a CPU stream MLX runs every SDPA call as its decomposed fallback, so head-chunked and
unchunked calls give the same bits here; the Metal primitive is shown as a prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from backends.engines.mlx_device import device_of
from backends.kernels import attention_contracts as contracts
from backends.kernels.head_chunk import DEFAULT_CHUNK_LIMIT
from backends.rerun import ops
from backends.rerun.compute import (
    Computed,
    Routes,
    compute_f64,
    compute_mlx,
    to_f64,
    weight_f64,
)
from backends.rerun.inputs import (
    LAYER_INPUT,
    NOT_RERUNNABLE,
    OP_INPUTS,
    WEIGHT_NAMES,
    CapturedOps,
    RerunInputError,
    gather,
    input_width,
    kv_history,
    layer_input_key,
    mx_to_bits,
    op_params,
    share_config,
    share_run_positions,
    splits_heads,
)
from backends.rerun.weights import WeightSource
from sessions.bits.dtypes import as_bit_pattern, as_values
from sessions.capture.format import RERUN_ROLE
from sessions.capture.reader import Capture
from sessions.compare.comparison import Comparison, not_aligned
from sessions.compare.key import OpKey
from sessions.compare.pair_tensors import aligned_records
from sessions.compare.tensor_diff import DiffAccumulator, TensorMetrics, Tolerance
from sessions.compare.verdict import Kind
from sessions.progress import Progress, ProgressGenerator

ATTENTION_BLOCK = ("attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "sdpa", "o_proj", "attn_residual")
DECODER_LAYER = (*ATTENTION_BLOCK, "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down", "layer_out")
SEGMENTS: dict[str, tuple[str, ...]] = {"attention_block": ATTENTION_BLOCK, "decoder_layer": DECODER_LAYER}
SIDES = ("native", "oracle")
CPU_NOTE = (
    "Ran on the CPU: MLX has no fused attention kernel there, so every SDPA call took the decomposed "
    "fallback, and head-chunked and unchunked calls give the same bits. The Metal primitive shown per "
    "call is the route table's prediction, not a measurement."
)


@dataclass(frozen=True)
class RerunOptions:
    source: str = "oracle"
    """Whose captured inputs the rerun reads."""
    route_from: str | None = None
    """Whose route (attention contract, SwiGLU order) to follow; None follows the source side."""
    head_chunk: bool | None = None
    """Whether SDPA is split by the MTPLX head-chunk rule; None follows the route side's recorded
    calls (one call per op: no; several: yes), as every other part of the route does."""
    chunk_limit: int = DEFAULT_CHUNK_LIMIT
    dtype: str | None = None
    """Compute dtype; None computes in the captured dtype (the only way to reproduce bits)."""
    device: str = "cpu"
    attention_route: str | None = None
    """Overrides the route side's attention reduction (rerun_ops.ATTENTION_ROUTES)."""
    swiglu_order: str | None = None
    weights_path: str | None = None

    def __post_init__(self) -> None:
        for name, value in (("source", self.source), ("route_from", self.route_from or self.source)):
            if value not in SIDES:
                raise ValueError(f"{name} must be native or oracle, not {value!r}")
        if self.dtype is not None and self.dtype not in ops.DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(ops.DTYPES)} (or as captured), not {self.dtype!r}")
        if self.chunk_limit < 1:
            raise ValueError(f"chunk limit must be at least 1, not {self.chunk_limit}")


@dataclass(frozen=True)
class ExactDistance:
    """How far one side's output is from the float64 reference."""

    rmse: float
    max_abs: float
    correctly_rounded: float
    """Fraction of elements whose bits equal the reference rounded once to the output dtype."""


@dataclass
class OpRerun:
    key: OpKey
    dtype: str
    shape: tuple[int, ...]
    bits: np.ndarray
    """The rerun's output bits, canonical layout, in the captured dtype."""
    route: str
    calls: tuple[ops.RoutedCall, ...]
    mask_kind: str
    heads: tuple[int, int, int] | None
    """For SDPA: (q heads, KV heads, head dim)."""
    three_way: dict[str, TensorMetrics | None]
    """'native vs oracle', 'rerun vs native', 'rerun vs oracle': None where a side has no record."""
    exact: dict[str, ExactDistance]
    closer: str
    """'native', 'oracle' or 'tie': which captured side is closer to the float64 reference."""
    inputs_agree: bool | None
    """Whether native and oracle fed this op (or segment) bit-identical inputs; None if unknown."""
    computed_dtype: str
    judged: str = ""
    """The comparison's verdict kind for this op's pair ("" when it has none): the rerun's own
    "native vs oracle" says bit-exact of a dispatch-only op, and "differ" of a signed-zero-only one."""


@dataclass
class RerunResult:
    target: OpKey
    options: RerunOptions
    device: str
    mlx_version: str
    routes: Routes
    route_sources: list[str]
    ops: list[OpRerun]
    notes: list[str] = field(default_factory=list)
    native_path: str = ""
    oracle_path: str = ""
    source_meta: dict[str, Any] = field(default_factory=dict)
    weights_from: list[str] = field(default_factory=list)
    """Where the weights this rerun took came from (a capture, a weights file's path); empty when it took none."""
    weights_named: bool = False
    """Whether it took a weight from a file named for it (`--weights`) rather than one a capture holds or references."""
    input_files: list[str] = field(default_factory=list)
    """Every file the rerun read or could read (both captures, each side's weights file): what a saved rerun may never replace."""

    def route_text(self) -> str:
        """The route's parts and where each came from, as the CLI and the panel say it."""
        return "; ".join(self.route_sources) or "each op as its row says"

    def reproduces(self, side: str) -> bool:
        """Every rerun op's bits equal `side`'s record."""
        label = f"rerun vs {side}"
        return all(op.three_way[label] is not None and op.three_way[label].bit_exact for op in self.ops)  # type: ignore[union-attr]

    def verdict(self) -> str:
        """What the rerun found, in the words the CLI and the panel both say: whose bits the route
        reproduced, and at the first op where the sides differ, which is the closer to exact.
        The CLI said it only through its exit status."""
        side = self.options.route_from or self.options.source
        reproduced = [s for s in SIDES if self.reproduces(s)]
        ran = {op.key.op for op in self.ops}
        chosen = [  # only the parts an op of the rerun takes, as `resolve_routes` shows them
            f"{part} {value}"
            for part, value, used_by in (("attention", self.options.attention_route, "sdpa"), ("swiglu", self.options.swiglu_order, "ffn_act"),
                                         ("head-chunk", None if self.options.head_chunk is None else "on" if self.options.head_chunk else "off", "sdpa"))
            if value is not None and used_by in ran
        ]
        route = f"the {side} route" + (f" with {' and '.join(chosen)} chosen" if chosen else "")
        lines = [f"The rerun on {route} reproduces the bits of: {', '.join(reproduced) or 'neither side'}."]
        first = next((op for op in self.ops if op.three_way["native vs oracle"] is not None and not op.three_way["native vs oracle"].bit_exact), None)
        if first is not None:
            closer = {"tie": "both sides are equally close to exact", "unknown": "which side is closer to exact is unknown"}.get(
                first.closer, f"the {first.closer} side is closer to exact"
            )
            judged = f" ({first.judged})" if first.judged else ""
            lines.append(f"First op where the bits differ: {first.key.op}{judged}; against the float64 reference, {closer}"
                         + (" (the sides' inputs already differ there)." if first.inputs_agree is False else "."))
        finding = next((op for op in self.ops if op.judged in AGREEING_FINDINGS), None)
        if first is None and finding is not None:
            lines.append(f"The bits agree at {finding.key.op}, which report calls {finding.judged}: {AGREEING_FINDINGS[finding.judged]}.")
        return " ".join(lines)


AGREEING_FINDINGS = {
    Kind.DISPATCH_ONLY: "the engines split its attention into different calls (the route's calls are listed below)",
    Kind.CONTRACT_MISMATCH: "the arithmetic contracts its two records declare differ",
}
"""Findings whose bits can agree, and what differs instead: a rerun said only "bit-exact" of one."""


def rerun_target(text: str) -> OpKey:
    """An op key (sessions.compare.key) that names something a rerun can recompute: an op with
    captured inputs, or a segment (attention_block, decoder_layer) at that layer."""
    key = OpKey.parse(text)
    if key.op in NOT_RERUNNABLE:
        raise ValueError(f"key {text!r}: {key.op} cannot be rerun: {NOT_RERUNNABLE[key.op]}")
    if key.op not in OP_INPUTS and key.op not in SEGMENTS:
        raise ValueError(f"key {text!r}: {key.op!r} is neither a rerunnable op ({', '.join(OP_INPUTS)}) nor a segment ({', '.join(SEGMENTS)})")
    return key


def rerunnable_keys(comparison: Comparison) -> list[OpKey]:
    """Every aligned op a rerun can recompute, then a segment key per (step, segment, layer), in execution order."""
    found = [p.key for p in comparison.pairs if p.key.op in OP_INPUTS]
    segments = dict.fromkeys(OpKey(k.step, k.segment, k.layer, name, 0, k.positions) for k in found if k.op == "sdpa" for name in SEGMENTS)
    return found + list(segments)


def resolve_routes(route_ops: CapturedOps, key: OpKey, options: RerunOptions) -> tuple[Routes, list[str]]:
    """The route the rerun follows, and where each choice came from (shown to the user): each part
    as the user chose it, else as the route side ran it. Only the parts an op of the rerun takes
    are shown: a q_proj rerun's header named an attention route and the kernel of a record it never read."""
    sources: list[str] = []
    rerun = SEGMENTS.get(key.op, (key.op,))

    def part(name: str, used_by: str, chosen: Any, recorded: Callable[[], tuple[Any, str]], shown: Callable[[Any], str] = str) -> Any:
        value, why = (chosen, "chosen") if chosen is not None else recorded()
        if used_by in rerun:
            sources.append(f"{name} {shown(value)} ({why})")
        elif chosen is not None:
            sources.append(f"{name} {shown(value)} (chosen; no op of this rerun takes it)")
        return value

    attention = part("attention", "sdpa", options.attention_route, lambda: _attention_route(route_ops, key))
    swiglu = part("swiglu", "ffn_act", options.swiglu_order, lambda: _declared_swiglu(route_ops))
    if attention not in ops.ATTENTION_ROUTES:
        raise ValueError(f"attention route must be one of {', '.join(ops.ATTENTION_ROUTES)}, not {attention!r}")
    head_chunk = part("head-chunk", "sdpa", options.head_chunk, lambda: _recorded_head_chunk(route_ops, key), lambda on: "on" if on else "off")
    return Routes(attention, swiglu, head_chunk, options.chunk_limit), sources


def _declared_swiglu(route_ops: CapturedOps) -> tuple[str, str]:
    """The SwiGLU order the route side's provenance declares, else mlx-lm's."""
    saved = _saved_route(route_ops, "swiglu")
    if saved in ops.SWIGLU_ORDERS:
        return saved, f"the order the {route_ops.side} capture, a saved rerun, took"
    provenance = route_ops.capture.meta.provenance
    declared = provenance.get("options", {}) if isinstance(provenance, dict) else {}
    order = declared.get("swiglu_order") if isinstance(declared, dict) else None
    if order in ops.SWIGLU_ORDERS:
        return order, f"the {route_ops.side} capture's provenance options"
    return ops.SILU_THEN_MUL, "mlx-lm's order; the capture declares none"


def _recorded_head_chunk(route_ops: CapturedOps, key: OpKey) -> tuple[bool, str]:
    """Whether the route side split its attention by heads, from the dispatch rows its sdpa record
    made: an engine without the head-chunk route makes one call per op. With none recorded, the
    MTPLX rule (the oracle engines' own) decides."""
    calls = route_ops.sdpa_calls(key)
    if not len(calls):
        return True, f"the MTPLX rule: the {route_ops.side} capture recorded no attention calls here"
    return splits_heads(calls), f"the {route_ops.side} record made {len(calls)} call(s)"


def _saved_route(route_ops: CapturedOps, part: str) -> str | None:
    """The route part (`attention`, `swiglu`) a saved rerun on the route side took, from its
    provenance; None for other captures. A rerun's records declare no contract (capture_out),
    so its kernel id alone made a rerun of its single-range attention take MLX's SDPA."""
    if route_ops.capture.meta.role != RERUN_ROLE:
        return None
    provenance = route_ops.capture.meta.provenance
    routes = provenance.get("routes", {}) if isinstance(provenance, dict) else {}
    value = routes.get(part) if isinstance(routes, dict) else None
    return value if isinstance(value, str) else None


def _attention_route(route_ops: CapturedOps, key: OpKey) -> tuple[str, str]:
    """The reduction the route side's record says ran: its effective contract, unless MLX's SDPA ran it."""
    mapped = route_ops.find(key.step, key.segment, key.layer, "sdpa", key.positions)
    if mapped is None:
        return ops.MLX_SDPA, f"the {route_ops.side} capture has no sdpa record here; MLX's primitive"
    saved = _saved_route(route_ops, "attention")
    if saved in ops.ATTENTION_ROUTES:
        return saved, f"the route the {route_ops.side} capture, a saved rerun, took"
    record = mapped.record
    if record.kernel_id != "mlx.fast.scaled_dot_product_attention" and record.effective_contract_id in (contracts.SINGLE_RANGE, contracts.TILED_64):
        return record.effective_contract_id, f"the {route_ops.side} record's effective contract"
    return ops.MLX_SDPA, f"the {route_ops.side} record ran kernel {record.kernel_id or 'unnamed'}"


def _cast(arrays: dict[str, mx.array], dtype: mx.Dtype | None) -> dict[str, mx.array]:
    return arrays if dtype is None else {k: v.astype(dtype) for k, v in arrays.items()}


def bits_metrics(a: np.ndarray, b: np.ndarray, logical: str) -> TensorMetrics:
    """The diff engine's metrics of `a` measured against `b`, whose energy scales NMSE. The native
    is always the measured side, as in `report` and `diagnose`: a rerun that reproduced the
    oracle read another NMSE against the native than `report` gave the same two tensors."""
    acc = DiffAccumulator(logical, a.shape, Tolerance(), rows_axis=0 if a.ndim >= 2 else None)
    acc.add(a, b, 0)
    return acc.finish()


def _distance(bits: np.ndarray, logical: str, reference: np.ndarray) -> ExactDistance:
    values = as_values(bits, logical).astype(np.float64)
    diff = values - reference
    finite = np.isfinite(diff)
    if (~np.isfinite(values) & np.isfinite(reference)).any():
        # A NaN or an infinity where exact arithmetic gives a number is as far from exact as can
        # be: left out of the mean, a native that wrote NaN and +Inf read as the closer to exact.
        rmse = max_abs = float("inf")
    else:
        rmse = float(np.sqrt(np.mean(diff[finite] ** 2))) if finite.any() else float("nan")
        max_abs = float(np.max(np.abs(diff[finite]))) if finite.any() else float("nan")
    rounded = np.asarray(reference).astype(as_values(bits[:0], logical).dtype).view(bits.dtype)
    exact = float(np.mean(as_bit_pattern(bits, logical) == as_bit_pattern(rounded, logical))) if bits.size else 1.0
    return ExactDistance(rmse, max_abs, exact)


def closer_to_exact(native: ExactDistance, other: ExactDistance, name: str) -> str:
    """Which of the native and the other side (`name`) is nearer the float64 reference, "tie" or
    "unknown". A NaN distance (no finite element to measure) is no distance: compared, it made
    the other side the closer one."""
    if math.isnan(native.rmse) or math.isnan(other.rmse):
        return "unknown"
    if native.rmse == other.rmse:
        return "tie"
    return "native" if native.rmse < other.rmse else name


def _closer(exact: dict[str, ExactDistance]) -> str:
    if "native" not in exact or "oracle" not in exact:
        return "unknown"
    return closer_to_exact(exact["native"], exact["oracle"], "oracle")


def _same_inputs(a: dict[str, mx.array], b: dict[str, mx.array]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(mx_to_bits(a[k])[0], mx_to_bits(b[k])[0]) for k in a)


def _agreement(compare: Callable[[], bool]) -> bool | None:
    """Whether a part of the inputs agrees between the sides; None when the other side lacks it
    (each part on its own: a cache the other side lacks says nothing of its layer input)."""
    try:
        return compare()
    except RerunInputError:
        return None


def _agree_both(first: bool | None, second: bool | None) -> bool | None:
    """Whether two parts of an op's inputs both agree between the sides: unknown only when no part is known to differ."""
    if first is False or second is False:
        return False
    return None if first is None or second is None else True


@dataclass
class _Sides:
    ops: dict[str, CapturedOps]
    weights: WeightSource
    source: CapturedOps
    route: CapturedOps
    """The side whose route the rerun follows; its attention mask is part of that route."""
    other_weights: WeightSource


def _judge(key: OpKey, sides: _Sides, computed: Computed, reference: np.ndarray, computed_dtype: str, inputs_agree: bool | None) -> OpRerun:
    """Three-way metrics and distances from exact for one op's rerun output."""
    out = computed.output
    captured = {name: c.find(key.step, key.segment, key.layer, key.op, key.positions) for name, c in sides.ops.items()}
    reference_record = next((m for m in captured.values() if m is not None), None)
    logical = reference_record.record.dtype if reference_record is not None else str(out.dtype).removeprefix("mlx.core.")
    if logical in ops.DTYPES and out.dtype != ops.DTYPES[logical]:
        out = out.astype(ops.DTYPES[logical])
    mx.eval(out)
    bits, logical = mx_to_bits(out)
    bits_by_side = {name: sides.ops[name].bits(m) for name, m in captured.items() if m is not None and m.shape == bits.shape}
    n, o = bits_by_side.get("native"), bits_by_side.get("oracle")
    three_way = {
        "native vs oracle": bits_metrics(n, o, logical) if n is not None and o is not None else None,
        "rerun vs native": bits_metrics(n, bits, logical) if n is not None else None,
        "rerun vs oracle": bits_metrics(bits, o, logical) if o is not None else None,
    }
    exact = {name: _distance(b, logical, reference) for name, b in (*bits_by_side.items(), ("rerun", bits))}
    sdpa = computed.sdpa
    return OpRerun(
        key=key,
        dtype=logical,
        shape=tuple(bits.shape),
        bits=bits,
        route=computed.route,
        calls=sdpa.calls if sdpa else (),
        mask_kind=sdpa.mask_kind if sdpa else "",
        heads=(sdpa.q_heads, sdpa.kv_heads, sdpa.head_dim) if sdpa else None,
        three_way=three_way,
        exact=exact,
        closer=_closer(exact),
        inputs_agree=inputs_agree,
        computed_dtype=computed_dtype,
    )


def _with_cache(arrays: dict[str, mx.array], history: dict[str, mx.array]) -> dict[str, mx.array]:
    """An op's inputs including the KV cache it attends over: inputs agree only if the cache does too."""
    return {**arrays, **{f"cached {name}": value for name, value in history.items()}}


def _other_inputs(sides: _Sides, key: OpKey) -> dict[str, mx.array] | None:
    other = next(c for name, c in sides.ops.items() if c is not sides.source)
    try:
        found = gather(other, key, sides.other_weights)
    except RerunInputError:
        return None
    return _with_cache(found.arrays, found.history)


def _segment_start(source: CapturedOps, key: OpKey) -> dict[str, mx.array]:
    layer, op = layer_input_key(source, key.step, key.segment, key.layer)
    mapped = source.find(key.step, key.segment, layer, op, key.positions)
    if mapped is None:
        raise RerunInputError(
            f"{'an' if key.op[0] in 'aeiou' else 'a'} {key.op.replace('_', ' ')} rerun of layer {key.layer} needs the layer's input ({op} of "
            f"{'layer ' + str(layer) if layer >= 0 else 'the model'}); the {source.side} capture has {source.lacks(key.step, key.segment, layer, op)} at step {key.step} {key.segment}"
        )
    return {LAYER_INPUT: source.array(mapped)}


class RerunSession:
    """Both captures' records by the comparison's keys, and their weights, found once for many reruns.

    A single rerun builds one and drops it; a diagnosis reruns hundreds of ops of the same pair,
    so it keeps one: the records are checked against the comparison once, and a weights file
    (a GGUF is parsed, its quantized blocks decoded) is read once."""

    def __init__(self, native: Capture, oracle: Capture, comparison: Comparison, weights_path: str | None = None) -> None:
        """`weights_path`: the weights file of every rerun that names none (`diagnose --weights`)."""
        native_records, oracle_records = aligned_records(native, oracle, comparison)
        self.weights_path = weights_path
        unpaired = [*comparison.unaligned, *comparison.post_eos_unaligned]
        self.native, self.oracle, self.comparison = native, oracle, comparison
        self.captured = {
            "native": CapturedOps.build(native, "native", native_records, unpaired),
            "oracle": CapturedOps.build(oracle, "oracle", oracle_records, unpaired),
        }
        share_config(self.captured["native"], self.captured["oracle"])
        share_run_positions(self.captured["native"], self.captured["oracle"])
        self._weights: dict[tuple[str, str | None], WeightSource] = {}

    def weights(self, side: str, path: str | None = None) -> WeightSource:
        """`side`'s weights (from its records, the file it references, or `path`, else the session's), read once."""
        path = self.weights_path if path is None else path
        found = self._weights.get((side, path))
        if found is None:
            found = WeightSource(self.captured[side], None if path is None else Path(path))
            self._weights[(side, path)] = found
        return found

    @cached_property
    def _aligned(self) -> set[OpKey]:
        return {pair.key for pair in self.comparison.pairs}

    def _check_aligned(self, target: OpKey, segment_ops: tuple[str, ...]) -> None:
        """RerunInputError unless the comparison paired `target` (a segment: one of its ops): a
        rerun reads the records it paired, so an op it did not pair (a typo, a step after EOS, a
        key made by position under calls) would be reported as inputs the capture lacks."""
        if target.op in SEGMENTS:
            place = (target.step, target.segment, target.layer, target.positions)
            if any((k.step, k.segment, k.layer, k.positions) == place and k.op in segment_ops for k in self._aligned):
                return
        elif target in self._aligned:
            return
        raise RerunInputError(f"{not_aligned(self.comparison, target)} (report lists the aligned ops; a rerun reads the records it paired)")

    def iter_rerun(self, target: OpKey, options: RerunOptions = RerunOptions()) -> ProgressGenerator[RerunResult]:
        """One rerun of `target` (see `iter_rerun`)."""
        device = device_of(options.device)
        segment_ops = SEGMENTS.get(target.op, (target.op,))
        self._check_aligned(target, segment_ops)
        route_side = options.route_from or options.source
        other_side = next(side for side in SIDES if side != options.source)
        source = self.captured[options.source]
        sides = _Sides(
            self.captured, self.weights(options.source, options.weights_path), source, self.captured[route_side],
            self.weights(other_side, options.weights_path),
        )
        routes, route_sources = resolve_routes(self.captured[route_side], target, options)
        compute_dtype = ops.DTYPES[options.dtype] if options.dtype else None
        weight_sources = (sides.weights, sides.other_weights)
        result = RerunResult(
            target, options, options.device, mx.__version__, routes, route_sources, [],
            # Absolute: a saved rerun's provenance names them, and is read from another folder.
            native_path=str(self.native.path.absolute()), oracle_path=str(self.oracle.path.absolute()), source_meta=source.capture.meta.as_dict(),
            input_files=[str(self.native.path), str(self.oracle.path), *(str(w.path) for w in weight_sources if w.path is not None)],
        )
        taken_before = [len(w.read_from) for w in weight_sources]  # a session's weight sources serve many reruns
        if target.op in SEGMENTS:
            yield from _run_segment(sides, target, segment_ops, routes, compute_dtype, device, result)
        else:
            yield from _run_op(sides, target, routes, compute_dtype, device, result)
        taken = [(w, w.read_from[before:]) for w, before in zip(weight_sources, taken_before)]
        result.weights_from = list(dict.fromkeys(where for _, read in taken for where in read))
        result.weights_named = any(w.named and read for w, read in taken)
        keys = {op.key for op in result.ops}
        judged = {pair.key: str(pair.verdict) for pair in self.comparison.pairs if pair.key in keys}
        for op in result.ops:
            op.judged = judged.get(op.key, "")
        if device.type == mx.cpu and any(op.key.op == "sdpa" for op in result.ops):
            result.notes.append(CPU_NOTE)
        if compute_dtype is not None and any(op.computed_dtype != op.dtype for op in result.ops):
            result.notes.append(f"Computed in {options.dtype}, then rounded to the captured dtype for the bit comparison.")
        if options.weights_path is not None and not any(op.key.op in WEIGHT_NAMES for op in result.ops):
            result.notes.append(f"The weights file {options.weights_path} was not read: no op of this rerun takes a weight.")
        return result


def iter_rerun(
    native: Capture, oracle: Capture, comparison: Comparison, target: OpKey, options: RerunOptions = RerunOptions()
) -> ProgressGenerator[RerunResult]:
    """Rerun the op or segment at `target`; yields Progress per op, returns the RerunResult.

    Records are found by the keys `comparison` paired them under, so the rerun reads exactly
    the tensors the tree shows, with the session's profiles and manual overrides.

    Raises RerunInputError (what is missing, which side), ValueError (a bad option) or
    CaptureError (an unreadable tensor) -- each a message for the user, never a crash.
    """
    yield Progress(0, len(SEGMENTS.get(target.op, (target.op,))) + 1, "finding records by canonical key")
    session = RerunSession(native, oracle, comparison)
    return (yield from session.iter_rerun(target, options))


def _run_op(sides: _Sides, key: OpKey, routes: Routes, dtype: mx.Dtype | None, device: mx.Device, result: RerunResult) -> ProgressGenerator[None]:
    inputs = gather(sides.source, key, sides.weights, mask_side=sides.route)
    other = _other_inputs(sides, key)
    agree = None if other is None else _same_inputs(_with_cache(inputs.arrays, inputs.history), other)
    arrays, history = _cast(inputs.arrays, dtype), _cast(inputs.history, dtype)
    weight = None if inputs.weight is None else (inputs.weight.astype(dtype) if dtype is not None else inputs.weight.astype(next(iter(arrays.values())).dtype))
    yield Progress(1, 2, f"rerunning {key.label()}")
    computed = compute_mlx(key.op, arrays, history, weight, inputs.params, routes, device)
    reference = compute_f64(key.op, to_f64(inputs.arrays), to_f64(inputs.history), weight_f64(inputs.weight), inputs.params)
    result.ops.append(_judge(key, sides, computed, reference, str(computed.output.dtype).removeprefix("mlx.core."), agree))
    yield Progress(2, 2, f"rerun of {key.label()} done")


def _run_segment(
    sides: _Sides, target: OpKey, segment_ops: tuple[str, ...], routes: Routes, dtype: mx.Dtype | None, device: mx.Device, result: RerunResult
) -> ProgressGenerator[None]:
    """Each op of the segment from the previous op's rerun output, starting at the layer's captured input."""
    source = sides.source
    chain = _segment_start(source, target)
    other_ops = next(c for c in sides.ops.values() if c is not source)
    history_key = OpKey(target.step, target.segment, target.layer, "sdpa", 0, target.positions)
    history = kv_history(source, history_key)
    start_agrees = _agreement(lambda: _same_inputs(chain, _segment_start(other_ops, target)))
    cache_agrees = _agreement(lambda: _same_inputs(history, kv_history(other_ops, history_key)))
    exact = to_f64(chain)
    captured_dtype = chain[LAYER_INPUT].dtype
    chain = _cast(chain, dtype)
    history_f64 = to_f64(history)
    history = _cast(history, dtype)
    total = len(segment_ops) + 1
    agree = start_agrees
    for number, op in enumerate(segment_ops):
        if op == "sdpa":  # it and every op after it read the cache: before it, a cache that differs changes nothing
            agree = _agree_both(start_agrees, cache_agrees)
        key = OpKey(target.step, target.segment, target.layer, op, 0, target.positions)
        yield Progress(number + 1, total, f"rerunning {key.label()}")
        arrays = {name: chain[name] for name in OP_INPUTS[op]}
        weight = sides.weights.get(op, target.layer, input_width(op, arrays)) if op in WEIGHT_NAMES else None
        params = op_params(source, key, arrays, weight, sides.route)
        compute_weight = None if weight is None else weight.astype(dtype if dtype is not None else captured_dtype)
        computed = compute_mlx(op, arrays, history if op == "sdpa" else {}, compute_weight, params, routes, device)
        reference = compute_f64(op, {n: exact[n] for n in OP_INPUTS[op]}, history_f64 if op == "sdpa" else {}, weight_f64(weight), params)
        mx.eval(computed.output)
        chain[op] = computed.output
        exact[op] = reference
        result.ops.append(_judge(key, sides, computed, reference, str(computed.output.dtype).removeprefix("mlx.core."), agree))
    yield Progress(total, total, f"rerun of {target.label()} done")
