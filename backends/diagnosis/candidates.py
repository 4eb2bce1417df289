"""Candidate arithmetic contracts: what one looks like, what it reads, and how its bits are judged.

A local op computes differently from the oracle on the same inputs; the question is how. A
candidate is one concrete answer -- "ggml's RMSNorm: squares summed in double, 1/sqrtf" -- as a
small function that computes the op that way from captured inputs. Run on the native's own
inputs, a candidate that gives the native's bits exactly names the contract the native ran;
compared with the oracle's route on the same inputs, it names the oracle's. The registry
(`backends.diagnosis.registry`) is data: adding a contract is one entry there and one test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from backends.rerun import ops as rerun_ops
from backends.rerun.inputs import (
    OP_INPUTS,
    CapturedOps,
    RerunInputError,
    bits_to_mx,
    gather,
    mx_to_bits,
    splits_heads,
)
from backends.rerun.segment import RerunSession, bits_metrics
from backends.rerun.weights import StoredWeight
from sessions.capture import format as cf
from sessions.compare.key import OpKey
from sessions.compare.tensor_diff import SPECIAL_ELEMENTS, TensorMetrics
from sessions.machine import available_memory


@dataclass(frozen=True)
class ErrorFigure:
    """How far one tensor is from another, in the terms a bit-level investigation uses."""

    differing: int
    size: int
    max_ulp: int | None
    nmse: float
    signed_zero_only: bool
    """Every differing element is a +0/-0 swap."""
    nan_mismatch: int = 0
    """Differing elements NaN on one side only: they have no ULP distance and no error to sum, so
    `max_ulp` and `nmse` describe the others alone."""
    nan_payload: int = 0
    """Differing elements NaN on both sides, with other bits."""
    inf_mismatch: int = 0
    """Differing elements an infinity on one side or both: NMSE leaves them out, so a figure
    without them read "NMSE 0" of an infinity against a number."""

    @property
    def bit_exact(self) -> bool:
        return self.differing == 0

    @classmethod
    def of(cls, metrics: TensorMetrics) -> ErrorFigure:
        swaps = metrics.differing > 0 and metrics.signed_zero_only == metrics.differing
        return cls(metrics.differing, metrics.size, metrics.max_ulp, float(metrics.nmse), swaps, metrics.nan_mismatch, metrics.nan_payload, metrics.inf_mismatch)

    def text(self) -> str:
        return self._words(short=False)

    def short(self) -> str:
        """The same in a table cell's width."""
        return self._words(short=True)

    def _words(self, short: bool) -> str:
        """In `report`'s words for the same elements (a NaN against a number, an infinity against another value)."""
        if self.bit_exact:
            return "bit-exact"
        count = f"{self.differing:,}" if short else f"{self.differing:,} of {self.size:,}"
        if self.signed_zero_only:
            return f"{count} ±0 swaps" if short else f"{count} differ, all +0/-0 swaps"
        briefs = {"nan_mismatch": "NaN vs number", "nan_payload": "NaN payload", "inf_mismatch": "Inf"}
        specials = [(getattr(self, count), briefs[count], words, "" if count == "inf_mismatch" else " (no ULP distance)") for count, words in SPECIAL_ELEMENTS]
        for found, brief, words, distance in specials:
            if found == self.differing:
                return f"{count} {brief}" if short else f"{count} differ, each {words}{distance}"
        said = [f"{found:,} {brief if short else words}" for found, brief, words, _ in specials if found]
        special = "" if not said else (f" · {' · '.join(said)}" if short else f" ({', '.join(said)})")
        ulp = "" if self.max_ulp is None else f"{' ·' if short else ','} max {self.max_ulp:,} ULP"
        return f"{count} differ{special}{ulp}" + ("" if short else f", NMSE {self.nmse:.3g}")

    def closeness(self) -> tuple[int, int, int, float]:
        """Ranking key, smaller is closer: fewest differing elements, then fewest NaN or infinity
        against a number, then smallest max ULP, then NMSE."""
        return self.differing, self.nan_mismatch + self.inf_mismatch, self.max_ulp if self.max_ulp is not None else 1 << 62, self.nmse


def metrics_cell(metrics: TensorMetrics | None) -> str:
    """A rerun's three-way figure in a table cell, in the CLI's table and the window's alike
    (the window wrote "27961 differ" where every other surface writes "27,961")."""
    return "not captured" if metrics is None else ErrorFigure.of(metrics).short()


def compare_bits(measured: np.ndarray, reference: np.ndarray, logical: str) -> ErrorFigure:
    """`measured`'s error against `reference`, whose energy scales NMSE and relative errors. The
    native is always the measured side, as in `report`'s native vs oracle: a candidate's figure
    against the native once took the native as reference, so the candidate that is the oracle's
    route showed another NMSE than the op's own error, between the same two tensors."""
    return ErrorFigure.of(bits_metrics(measured, reference, logical))


@dataclass
class CandidateInputs:
    """What a candidate computes from: one side's captured inputs of one op, in canonical layout."""

    key: OpKey
    side: str
    """Whose captured inputs these are."""
    arrays: dict[str, mx.array]
    history: dict[str, mx.array]
    """SDPA's KV cache from earlier forward calls: "k" and "v", [kv_heads, rows, dim]."""
    weight: mx.array | None
    stored: StoredWeight | None
    """The weight as its GGUF file stores it (quantized blocks), where it comes from one."""
    params: dict[str, Any]
    dtype: str
    """The logical dtype of the op's captured output: a candidate's result is rounded to it."""
    kv_cells: int | None
    """KV cells the engine's attention call covered (its dispatch events): a padded cache."""
    route_output: np.ndarray | None
    """The op computed on the oracle's route from these inputs (bits, canonical layout)."""
    call_rows: int | None = None
    """Rows of the forward call the native computed this op in (whole, not the compared window):
    the batch shape its kernels were chosen by."""
    threads: int | None = None
    """CPU threads the engine computed with (provenance `threads`): ggml splits some calls'
    work across them in ways that change bits."""
    streams: int = 1
    """Requests the engine's call computed side by side (its capture's `batch_size`): llama.cpp
    gives each its own KV stream, and its flash attention chooses a kernel per stream."""
    kv_cells_problem: str | None = None
    """Why `kv_cells` cannot be replayed in memory (`kv_cells_problem`): the candidates that pad
    the cache to them do not run."""

    def values(self, name: str) -> np.ndarray:
        """One input as float32 numpy (exact for bf16, f16 and f32)."""
        return np.array(self.arrays[name].astype(mx.float32))

    def weight_values(self) -> np.ndarray:
        assert self.weight is not None
        return np.array(self.weight.astype(mx.float32))

    def first(self) -> str:
        return OP_INPUTS[self.key.op][0]

    def compute_dtype(self) -> mx.Dtype:
        return next(iter(self.arrays.values())).dtype


CandidateOutput = mx.array | np.ndarray
"""A candidate returns MLX or float numpy output in canonical layout; it is rounded to the captured dtype."""


def _always(_: CandidateInputs) -> str | None:
    return None


@dataclass(frozen=True)
class Candidate:
    id: str
    ops: frozenset[str]
    description: str
    """One line: the arithmetic, in order, with its rounding boundaries."""
    source: str
    """Which engine does this, and where in its code."""
    run: Callable[[CandidateInputs], CandidateOutput]
    unavailable: Callable[[CandidateInputs], str | None] = _always
    """Why this candidate cannot run on these inputs, or None when it can."""
    follows: tuple[str, ...] = ()
    """The call's shape its kernel path depends on: `CandidateInputs` fields among `CALL_SHAPE`."""
    of_route: bool = False
    """Computed from the oracle route's own output (a copy of it): judged against the native
    only. Against the route it is that route, bit-exact whenever the copy changes nothing, so it
    never names the oracle's contract nor the native's closest one."""
    head_split: bool | None = None
    """For an MLX attention route: whether it splits the query heads into several calls (the
    head-chunk route) or makes one call over all heads. On a CPU both give the same bits, so
    where both reproduce a record, the calls the record made (`recorded_head_split`) say which
    one ran."""


@dataclass
class CandidateResult:
    id: str
    description: str
    source: str
    vs_native: ErrorFigure | None = None
    """The native's captured output against this candidate's (`compare_bits`); None when the candidate did not run."""
    vs_oracle_route: ErrorFigure | None = None
    """Against the oracle's route on the same inputs."""
    skipped: str | None = None
    seconds: float = 0.0
    bits: np.ndarray | None = field(default=None, repr=False)


def output_bits(output: CandidateOutput, logical: str) -> np.ndarray:
    """A candidate's output rounded once to the captured dtype, as stored bits."""
    array = output if isinstance(output, mx.array) else mx.array(np.asarray(output, dtype=np.float32))
    if logical in rerun_ops.DTYPES:
        array = array.astype(rerun_ops.DTYPES[logical])
    mx.eval(array)
    return mx_to_bits(array)[0]


def run_candidate(candidate: Candidate, inputs: CandidateInputs, native_bits: np.ndarray | None) -> CandidateResult:
    """Run one candidate and judge its bits against the native's and the oracle route's."""
    result = CandidateResult(candidate.id, candidate.description, candidate.source)
    why_not = candidate.unavailable(inputs)
    if why_not is not None:
        result.skipped = why_not
        return result
    start = time.perf_counter()
    try:
        bits = output_bits(candidate.run(inputs), inputs.dtype)
    except (RerunInputError, rerun_ops.RerunOpError, ValueError) as exc:
        result.skipped = str(exc)
        return result
    result.seconds = time.perf_counter() - start
    result.bits = bits
    if native_bits is not None and native_bits.shape == bits.shape:
        result.vs_native = compare_bits(native_bits, bits, inputs.dtype)
    if not candidate.of_route and inputs.route_output is not None and inputs.route_output.shape == bits.shape:
        result.vs_oracle_route = compare_bits(bits, inputs.route_output, inputs.dtype)
    return result


REPLAY_MEMORY_SHARE = 2
"""A replayed attention call's padded cache may take at most 1/this of the memory available."""


def _widest_call(ops: CapturedOps, key: OpKey) -> int | None:
    """Which row of the dispatch table is the attention call at `key` over the most cache cells, or None."""
    mapped = ops.find(key.step, key.segment, key.layer, "sdpa", key.positions)
    table = ops.capture.dispatch
    if mapped is None or not len(table):
        return None
    rows = np.flatnonzero(table["index_seq"] == mapped.record.seq)
    return int(rows[np.argmax(table["kv_len"][rows])]) if len(rows) else None


def _kv_cells(ops: CapturedOps, key: OpKey) -> int | None:
    row = _widest_call(ops, key)
    return int(ops.capture.dispatch["kv_len"][row]) if row is not None else None


def kv_cells_problem(ops: CapturedOps, key: OpKey) -> str | None:
    """Why the cache cells of `key`'s attention call (`_kv_cells`, which a ggml candidate pads
    its keys and values to) cannot be replayed in this machine's memory, or None: a capture's
    kv_len of 2**31 made numpy ask for 1 TiB."""
    row = _widest_call(ops, key)
    if row is None:
        return None
    cells, kv_heads, head_dim, q_rows = (int(ops.capture.dispatch[name][row]) for name in ("kv_len", "kv_heads", "head_dim", "q_rows"))
    needed = cells * (2 * kv_heads * head_dim + 2 * q_rows) * 4  # padded keys and values, one head's scores and mask, float32
    room = available_memory() // REPLAY_MEMORY_SHARE
    if needed <= room:
        return None
    return (
        f"{ops.capture.path}: {cf.DISPATCH_PATH} row {row}: kv_len {cells:,} cache cells "
        f"({kv_heads} kv heads of {head_dim}) would take {needed / 2**30:,.1f} GiB to replay, more than the {room / 2**30:,.1f} GiB this machine has for it"
    )


CALL_SHAPE = ("call_rows", "kv_cells", "threads", "streams")
"""What about an engine's call chooses a kernel's path (`call_shape`)."""


def call_shape(ops: CapturedOps, key: OpKey) -> dict[str, Any]:
    """The rows, cache cells, threads and requests of the call `ops`' engine computed `key` in."""
    return {"call_rows": call_rows(ops, key), "kv_cells": _kv_cells(ops, key), "threads": _threads(ops), "streams": max(ops.capture.meta.batch_size, 1)}


def candidate_inputs(
    session: RerunSession, side: str, key: OpKey, route_output: np.ndarray | None, engine: str = "native"
) -> CandidateInputs:
    """`side`'s captured inputs of the op at `key`, as `engine`'s engine would run them.

    Weights come from `engine`'s side first (a GGUF keeps the quantized blocks a ggml candidate
    needs), then the other's; the call's rows, cache cells and threads, which choose a kernel's
    path, are `engine`'s; the attention mask is the oracle's, the one kind a capture can name
    completely (causal or none). RerunInputError says what is missing."""
    ops = session.captured[side]
    oracle = session.captured["oracle"]
    failures: list[str] = []
    for weights_side in (engine, next(name for name in session.captured if name != engine)):
        weights = session.weights(weights_side)
        try:
            gathered = gather(ops, key, weights, mask_side=oracle)
        except RerunInputError as exc:
            failures.append(str(exc))
            continue
        stored = weights.stored(key.op, key.layer) if gathered.weight is not None else None
        native_record = session.captured["native"].find(key.step, key.segment, key.layer, key.op, key.positions)
        dtype = native_record.record.dtype if native_record is not None else gathered.dtype
        shape = call_shape(session.captured[engine], key)
        return CandidateInputs(
            key, side, gathered.arrays, gathered.history, gathered.weight, stored, gathered.params, dtype,
            shape["kv_cells"], route_output, shape["call_rows"], shape["threads"], shape["streams"], kv_cells_problem(session.captured[engine], key),
        )
    raise RerunInputError(failures[-1])


def _threads(ops: CapturedOps) -> int | None:
    provenance = ops.capture.meta.provenance if isinstance(ops.capture.meta.provenance, dict) else {}
    threads = provenance.get("threads")
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None


def declared_contract(session: RerunSession, side: str, key: OpKey) -> str:
    """The contract `side`'s record says it ran (its `effective_contract_id`), or ''."""
    mapped = session.captured[side].find(key.step, key.segment, key.layer, key.op, key.positions)
    return "" if mapped is None else mapped.record.effective_contract_id or ""


def recorded_head_split(ops: CapturedOps, key: OpKey) -> bool | None:
    """Whether `ops`' engine split this attention by heads, from the calls its sdpa record made
    (several, or one per KV group); None when it recorded none."""
    calls = ops.sdpa_calls(key)
    return splits_heads(calls) if len(calls) else None


def call_rows(ops: CapturedOps, key: OpKey) -> int | None:
    """Rows of the forward call that computed `ops`' record of `key` (None without one)."""
    mapped = ops.find(key.step, key.segment, key.layer, key.op, key.positions)
    return None if mapped is None else mapped.call_rows()


def record_bits(ops: CapturedOps, key: OpKey) -> np.ndarray | None:
    mapped = ops.find(key.step, key.segment, key.layer, key.op, key.positions)
    return None if mapped is None else ops.bits(mapped)


def bits_array(bits: np.ndarray, logical: str) -> mx.array:
    """Stored bits back as an MLX array (the oracle route's output, to take a copy of it)."""
    return bits_to_mx(bits, logical)
