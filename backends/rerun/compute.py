"""One canonical op, computed twice: through MLX on the chosen route, and exactly in float64.

Both take the same canonical-layout inputs (docs/architecture.md) and return the output in
canonical layout, so a rerun can be compared with native and oracle records directly, and a
segment can feed each op's output to the next. The MLX side runs each op in the layout the
mlx-lm model runs it in (q/k norm on [1, rows, heads, dim], RoPE and attention on
[1, heads, rows, dim]) -- layouts do not change bits for these ops, but following the model
keeps that an observation rather than an assumption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np

from backends.kernels import reference_f64 as ref
from backends.kernels.head_chunk import DEFAULT_CHUNK_LIMIT
from backends.rerun import ops

NORMS = ("attn_norm", "ffn_norm", "final_norm")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "ffn_gate", "ffn_up", "ffn_down", "logits")
ADDS = {"attn_residual": ("layer_input", "o_proj"), "layer_out": ("attn_residual", "ffn_down")}
CACHES = ("k_cache", "v_cache")
CACHE_ROUTE = "stored as is, in the cache's dtype"
ArrayT = TypeVar("ArrayT", mx.array, np.ndarray)


@dataclass(frozen=True)
class Routes:
    """The route choices that change bits: attention reduction and SwiGLU evaluation order."""

    attention: str = ops.MLX_SDPA
    swiglu: str = ops.SILU_THEN_MUL
    head_chunk: bool = True
    chunk_limit: int = DEFAULT_CHUNK_LIMIT


@dataclass
class Computed:
    output: mx.array
    route: str
    """What ran, in words (e.g. 'mx.fast.rms_norm', 'attn.f32.tiled64x64, 4 head-chunked calls')."""
    sdpa: ops.SdpaRun | None = None


def _f64(array: mx.array) -> np.ndarray:
    return np.array(array.astype(mx.float32), dtype=np.float64)


def kv_with_history(arrays: dict[str, mx.array], history: dict[str, mx.array], kv_heads: int) -> tuple[mx.array, mx.array]:
    """This call's K [kv_heads, rows, dim] and V (from v_proj [rows, kv*dim]) after the cache history."""
    k = arrays["k_rope"]
    v = arrays["v_proj"]
    v = v.reshape(v.shape[0], kv_heads, -1).transpose(1, 0, 2)
    if history:
        k = mx.concatenate([history["k"].astype(k.dtype), k], axis=1)
        v = mx.concatenate([history["v"].astype(v.dtype), v], axis=1)
    return k, v


def compute_mlx(
    op: str,
    arrays: dict[str, mx.array],
    history: dict[str, mx.array],
    weight: mx.array | None,
    params: dict[str, Any],
    routes: Routes,
    device: mx.Device,
) -> Computed:
    """The op through MLX on `device`; inputs are already in the compute dtype."""
    if op in NORMS:
        assert weight is not None
        return Computed(ops.rms_norm(arrays[_first(arrays)], weight, params["eps"], device), "mx.fast.rms_norm")
    if op in LINEARS:
        assert weight is not None
        return Computed(ops.linear(arrays[_first(arrays)], weight, device=device), "x @ W.T (nn.Linear)")
    if op in ("q_norm", "k_norm"):
        assert weight is not None
        x = arrays["q_proj" if op == "q_norm" else "k_proj"]
        rows, heads = x.shape[0], params["heads"]
        normed = ops.rms_norm(x.reshape(1, rows, heads, -1), weight, params["eps"], device)
        return Computed(normed[0].transpose(1, 0, 2), "mx.fast.rms_norm per head")
    if op in ("q_rope", "k_rope"):
        x = arrays["q_norm" if op == "q_rope" else "k_norm"]
        out = ops.rope(x[None], dims=params["dims"], base=params["base"], offset=params["offset"], device=device)
        return Computed(out[0], f"mx.fast.rope (NeoX, offset {params['offset']})")
    if op == "sdpa":
        k, v = kv_with_history(arrays, history, params["kv_heads"])
        run = ops.sdpa(
            arrays["q_rope"][None],
            k[None],
            v[None],
            scale=params["scale"],
            mask=params["mask"],
            route=routes.attention,
            head_chunk=routes.head_chunk,
            chunk_limit=routes.chunk_limit,
            device=device,
        )
        rows = run.output.shape[2]
        out = run.output[0].transpose(1, 0, 2).reshape(rows, -1)
        split = f"{len(run.calls)} head-chunked calls" if run.chunked else "1 unchunked call"
        return Computed(out, f"{routes.attention}, {split}", run)
    if op in ADDS:
        a, b = ADDS[op]
        return Computed(ops.residual_add(arrays[a], arrays[b], device), "a + b")
    if op == "ffn_act":
        return Computed(ops.swiglu(arrays["ffn_gate"], arrays["ffn_up"], routes.swiglu, device), f"swiglu {routes.swiglu}")
    if op in CACHES:
        return Computed(cache_cells(op, arrays), CACHE_ROUTE)
    raise ops.RerunOpError(f"{op} has no rerun")


def compute_f64(op: str, arrays: dict[str, np.ndarray], history: dict[str, np.ndarray], weight: np.ndarray | None, params: dict[str, Any]) -> np.ndarray:
    """The same op in float64 numpy (the exact math, no route)."""
    if op in NORMS:
        return ref.rms_norm(arrays[_first(arrays)], weight, params["eps"])
    if op in LINEARS:
        return ref.linear(arrays[_first(arrays)], weight)
    if op in ("q_norm", "k_norm"):
        x = arrays["q_proj" if op == "q_norm" else "k_proj"]
        rows, heads = x.shape[0], params["heads"]
        return ref.rms_norm(x.reshape(rows, heads, -1), weight, params["eps"]).transpose(1, 0, 2)
    if op in ("q_rope", "k_rope"):
        x = arrays["q_norm" if op == "q_rope" else "k_norm"]
        return ref.rope(x, dims=params["dims"], base=params["base"], offset=params["offset"])
    if op == "sdpa":
        kv_heads = params["kv_heads"]
        v = arrays["v_proj"]
        v = v.reshape(v.shape[0], kv_heads, -1).transpose(1, 0, 2)
        k = arrays["k_rope"]
        if history:
            k = np.concatenate([history["k"], k], axis=1)
            v = np.concatenate([history["v"], v], axis=1)
        out = ref.sdpa(arrays["q_rope"][None], k[None], v[None], scale=params["scale"], mask=params["mask"])
        return out[0].transpose(1, 0, 2).reshape(out.shape[2], -1)
    if op in ADDS:
        a, b = ADDS[op]
        return ref.residual_add(arrays[a], arrays[b])
    if op == "ffn_act":
        return ref.swiglu(arrays["ffn_gate"], arrays["ffn_up"])
    if op in CACHES:
        return cache_cells(op, arrays)
    raise ops.RerunOpError(f"{op} has no float64 reference")


def cache_cells(op: str, arrays: dict[str, ArrayT]) -> ArrayT:
    """What a KV-cache write stores: the step's post-RoPE keys [heads, rows, dim] or projected
    values [rows, heads*dim], as one row of cells per token. Moving bits computes nothing; the
    only arithmetic a store can do is round to the cache's dtype, which the comparison with the
    captured record applies."""
    if op == "v_cache":
        return arrays["v_proj"]
    keys = arrays["k_rope"]
    return keys.transpose(1, 0, 2).reshape(keys.shape[1], -1)


def to_f64(arrays: dict[str, mx.array]) -> dict[str, np.ndarray]:
    return {name: _f64(a) for name, a in arrays.items()}


def weight_f64(weight: mx.array | None) -> np.ndarray | None:
    return None if weight is None else _f64(weight)


def _first(arrays: dict[str, Any]) -> str:
    return next(iter(arrays))
