"""The whole-run budget: how much of the final logits' error each local op explains.

A local op's own error is often tiny (an ULP here and there); what matters is what it does to
the tokens. For each local op this replays the rest of the run on the oracle's route from the
oracle's captured state, with only that op's result changed to what the native computes from
the oracle's inputs, and measures the final logits against the oracle's. The replay carries
the KV cache: an op in the visual prefill reaches the last decode step through every later
attention call. Tokens are the captured ones (teacher forcing), so a model-level op before the
last step reaches the final logits only through a token, and explains none of their error.

What is injected is the op's *local* error alone where that can be had: the native's own
record when its inputs equal the oracle's, else the reproducing candidate run on the oracle's
inputs. Where neither exists the native's record is injected and the row says it carries
upstream error too. Share = squared error of the replay's final logits / squared error of the
native's (NMSE numerators); shares of separate ops need not add up to 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from backends.diagnosis.candidates import ErrorFigure, compare_bits, output_bits
from backends.rerun.compute import Routes, compute_mlx
from backends.rerun.inputs import (
    LAYER_INPUT,
    OP_INPUTS,
    WEIGHT_NAMES,
    CapturedOps,
    RerunInputError,
    layer_input_key,
    op_params,
)
from backends.rerun.ops import RerunOpError
from backends.rerun.segment import (
    DECODER_LAYER,
    RerunOptions,
    RerunSession,
    resolve_routes,
)
from sessions.bits.dtypes import as_values
from sessions.compare.comparison import Comparison, PairResult
from sessions.compare.key import OpKey

CPU = mx.Device(mx.cpu)


class NotMeasurable(ValueError):
    """The capture does not hold what the replay needs, or the op cannot reach the final logits."""


@dataclass
class Injection:
    """What one local op's result is replaced by in the replay, and how that was obtained."""

    key: OpKey
    output: mx.array
    how: str


@dataclass
class BudgetRow:
    key: OpKey
    local: ErrorFigure | None
    injected: str = ""
    share: float | None = None
    final: ErrorFigure | None = None
    """The replay's final logits against the oracle's."""
    token_changes: bool | None = None
    """Whether the replay's greedy token at the final step differs from the oracle's."""
    not_measured: str | None = None


@dataclass
class Budget:
    final_logits: OpKey | None
    total: ErrorFigure | None
    """The native's final logits against the oracle's."""
    baseline_exact: bool | None = None
    """The replay without any injection gives the oracle's final logits bit for bit, from every op a row starts at."""
    rows: list[BudgetRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def final_logits_pair(comparison: Comparison) -> PairResult | None:
    """The logits pair of the last forward call compared before any shared EOS."""
    logits = [p for p in comparison.pairs if p.key.op == "logits" and not p.post_eos]
    return logits[-1] if logits else None


class Replay:
    """The oracle's run recomputed through MLX on its own route from a given op on, one op replaced."""

    def __init__(self, session: RerunSession, final: OpKey) -> None:
        self.ops: CapturedOps = session.captured["oracle"]
        self.weights = session.weights("oracle")
        self.final = final
        self._weights: dict[tuple[str, int, Any], mx.array] = {}
        self._routes: dict[OpKey, Routes] = {}

    def _weight(self, op: str, layer: int, dtype: mx.Dtype) -> mx.array:
        found = self._weights.get((op, layer, dtype))
        if found is None:
            found = self.weights.get(op, layer).astype(dtype)
            self._weights[(op, layer, dtype)] = found
        return found

    def _route(self, key: OpKey) -> Routes:
        found = self._routes.get(key)
        if found is None:
            found = resolve_routes(self.ops, key, RerunOptions(source="oracle"))[0]
            self._routes[key] = found
        return found

    def _captured(self, step: int, segment: str, layer: int, op: str) -> mx.array:
        mapped = self.ops.find(step, segment, layer, op)
        if mapped is None:
            raise NotMeasurable(f"the replay needs the oracle's {op} of layer {layer} at step {step} {segment}; the capture has none")
        return self.ops.array(mapped)

    def _history(self, layer: int, position: int, cache: dict[tuple[int, int], tuple[mx.array, mx.array]]) -> dict[str, mx.array]:
        ks, vs = [], []
        for earlier in range(position):
            if (layer, earlier) in cache:
                k, v = cache[(layer, earlier)]
            else:
                step, segment = self.ops.positions[earlier]
                k = self._captured(step, segment, layer, "k_rope")
                v_flat = self._captured(step, segment, layer, "v_proj")
                v = v_flat.reshape(v_flat.shape[0], k.shape[0], -1).transpose(1, 0, 2)
            ks.append(k)
            vs.append(v)
        return {} if not ks else {"k": mx.concatenate(ks, axis=1), "v": mx.concatenate(vs, axis=1)}

    def _compute(self, key: OpKey, arrays: dict[str, mx.array], history: dict[str, mx.array]) -> mx.array:
        dtype = next(iter(arrays.values())).dtype
        weight = self._weight(key.op, key.layer, dtype) if key.op in WEIGHT_NAMES else None
        params = op_params(self.ops, key, arrays, weight)
        return compute_mlx(key.op, arrays, history if key.op == "sdpa" else {}, weight, params, self._route(key), CPU).output

    def _layer(self, position: int, layer: int, x: mx.array, injection: Injection | None, cache: dict[tuple[int, int], tuple[mx.array, mx.array]]) -> mx.array:
        step, segment = self.ops.positions[position]
        chain = {LAYER_INPUT: x}
        for op in DECODER_LAYER:
            key = OpKey(step, segment, layer, op)
            if injection is not None and key == injection.key:
                chain[op] = injection.output
                continue
            arrays = {name: chain[name] for name in OP_INPUTS[op]}
            chain[op] = self._compute(key, arrays, self._history(layer, position, cache) if op == "sdpa" else {})
        k, v = chain["k_rope"], chain["v_proj"]
        cache[(layer, position)] = (k, v.reshape(v.shape[0], k.shape[0], -1).transpose(1, 0, 2))
        mx.eval(chain["layer_out"], k, v)
        return chain["layer_out"]

    def run(self, start: OpKey, injection: Injection | None) -> mx.array:
        """The final logits with the run recomputed from `start` on (the oracle's state before it)."""
        if start.positions:
            raise NotMeasurable("the replay recomputes whole forward calls, and these runs were cut into different calls (aligned by position)")
        if injection is not None and injection.key.layer >= 0 and injection.key.op not in DECODER_LAYER:
            raise NotMeasurable(f"the replay computes a layer's {', '.join(DECODER_LAYER)} and keeps its KV cache as k_rope and v_proj; it has no {injection.key.op} to change")
        positions = self.ops.positions
        here, last = (start.step, start.segment), (self.final.step, self.final.segment)
        if here not in positions or last not in positions:
            raise NotMeasurable(f"the oracle capture has no forward call at step {start.step} {start.segment}")
        first, final = positions.index(here), positions.index(last)
        if first > final:
            raise NotMeasurable("it runs after the final logits")
        if start.layer < 0 and first < final:
            return self._captured(*last, -1, "logits")
        layers = self.ops.layers()
        cache: dict[tuple[int, int], tuple[mx.array, mx.array]] = {}
        x: mx.array | None = None
        for position in range(first, final + 1):
            step, segment = positions[position]
            if start.layer >= 0:
                input_layer, input_op = layer_input_key(self.ops, step, segment, start.layer)
                x = self._captured(step, segment, input_layer, input_op)
                for layer in layers[layers.index(start.layer):]:
                    x = self._layer(position, layer, x, injection, cache)
        step, segment = last
        if x is None:
            x = self._captured(step, segment, *layer_input_key(self.ops, step, segment, -1))
        norm_key, logits_key = OpKey(step, segment, -1, "final_norm"), OpKey(step, segment, -1, "logits")
        norm = injection.output if injection is not None and injection.key == norm_key else self._compute(norm_key, {LAYER_INPUT: x}, {})
        if injection is not None and injection.key == logits_key:
            return injection.output
        return self._compute(logits_key, {"final_norm": norm}, {})


def squared_error(bits: np.ndarray, reference: np.ndarray, logical: str) -> float:
    a, b = as_values(bits, logical).astype(np.float64), as_values(reference, logical).astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    return float(np.sum((a[finite] - b[finite]) ** 2))


def _greedy(bits: np.ndarray, logical: str) -> int:
    return int(np.argmax(as_values(bits, logical).astype(np.float64).reshape(-1, bits.shape[-1])[-1]))


def measure(replay: Replay, injection: Injection, local: ErrorFigure | None, reference: np.ndarray, total_error: float, logical: str) -> BudgetRow:
    """One local op's row: its injection replayed to the final logits, against the reference logits."""
    row = BudgetRow(injection.key, local, injection.how)
    try:
        bits = output_bits(replay.run(injection.key, injection), logical)
    except (NotMeasurable, RerunInputError, RerunOpError) as exc:
        row.not_measured = str(exc)
        return row
    row.final = compare_bits(bits, reference, logical)
    row.share = squared_error(bits, reference, logical) / total_error if total_error > 0 else None
    row.token_changes = _greedy(bits, logical) != _greedy(reference, logical)
    return row


def baseline(replay: Replay, start: OpKey, oracle_final: np.ndarray, logical: str) -> tuple[np.ndarray, bool]:
    """The replay from `start` with nothing injected, and whether it gives the oracle's final logits exactly."""
    bits = output_bits(replay.run(start, None), logical)
    return bits, bool(np.array_equal(bits, oracle_final))
