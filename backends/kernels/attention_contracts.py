"""Two attention reduction contracts and the composite that picks between them at Q=64.

The seed's llama.cpp investigation found that attention bits depend on which reduction the
query length selects: one pass over the whole key range for short queries, a 64x64 tiled
FP32 online softmax from Q=64 on. Both are written here with ordinary MLX ops so the demo
produces that difference from real arithmetic, and so a rerun can reproduce either side.

Arrays are [B, heads, rows, dim] (q) and [B, kv_heads, kv_len, dim] (k, v). The causal mask
is aligned bottom-right: query row i sits at position kv_len - q_rows + i.
"""

from __future__ import annotations

import mlx.core as mx

SINGLE_RANGE = "attn.bf16.single_range"
"""Scale q (rounded to the input dtype), scores in the input dtype over the whole key range,
masked with finfo.min, precise softmax, then P.V: the MLX CPU fallback's arithmetic."""
TILED_64 = "attn.f32.tiled64x64"
"""64-row query tiles over 64-column key tiles, FP32 scores and online softmax, one final
division and one rounding to the input dtype."""
AUTO_QTILE64 = "attn.auto_qtile64"
"""Composite: SINGLE_RANGE below 64 query rows, TILED_64 from 64 on."""
TILE = 64


def _causal_keep(q_rows: int, kv_len: int, q_from: int = 0, k_from: int = 0, k_to: int | None = None) -> mx.array:
    offset = kv_len - q_rows
    q_idx = mx.arange(offset + q_from, offset + q_rows)[:, None]
    k_idx = mx.arange(k_from, kv_len if k_to is None else k_to)[None]
    return q_idx >= k_idx


def single_range_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, causal: bool) -> mx.array:
    """One reduction over the whole key range in the input dtype."""
    batch, q_heads, q_rows, dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scaled = mx.array(scale, dtype=q.dtype) * q
    scaled = scaled.reshape(batch, kv_heads, group, q_rows, dim)
    scores = scaled @ mx.expand_dims(k, 2).swapaxes(-1, -2)
    if causal:
        floor = mx.array(mx.finfo(scores.dtype).min, dtype=scores.dtype)
        scores = mx.where(_causal_keep(q_rows, kv_len), scores, floor)
    weights = mx.softmax(scores, axis=-1, precise=True)
    out = weights @ mx.expand_dims(v, 2)
    return out.reshape(batch, q_heads, q_rows, v.shape[-1])


def tiled_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, causal: bool) -> mx.array:
    """Flash-attention style: running max and sum per query row, updated tile by tile in FP32."""
    batch, q_heads, q_rows, dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    q32 = (q.astype(mx.float32) * scale).reshape(batch, kv_heads, group, q_rows, dim)
    k32 = mx.expand_dims(k.astype(mx.float32), 2)
    v32 = mx.expand_dims(v.astype(mx.float32), 2)
    offset = kv_len - q_rows
    neg_inf = mx.array(-mx.inf, dtype=mx.float32)
    tiles = []
    for q0 in range(0, q_rows, TILE):
        q1 = min(q0 + TILE, q_rows)
        q_tile = q32[..., q0:q1, :]
        run_max = mx.full((*q_tile.shape[:-1], 1), -mx.inf, dtype=mx.float32)
        run_sum = mx.zeros_like(run_max)
        acc = mx.zeros((*q_tile.shape[:-1], v.shape[-1]), dtype=mx.float32)
        last_key = offset + q1 if causal else kv_len
        for k0 in range(0, last_key, TILE):
            k1 = min(k0 + TILE, kv_len)
            scores = q_tile @ k32[..., k0:k1, :].swapaxes(-1, -2)
            if causal:
                keep = _causal_keep(q_rows, kv_len, q0, k0, k1)[: q1 - q0]
                scores = mx.where(keep, scores, neg_inf)
            new_max = mx.maximum(run_max, scores.max(axis=-1, keepdims=True))
            safe_max = mx.where(new_max == neg_inf, 0.0, new_max)
            probs = mx.exp(scores - safe_max)
            rescale = mx.exp(run_max - safe_max)
            run_sum = run_sum * rescale + probs.sum(axis=-1, keepdims=True)
            acc = acc * rescale + probs @ v32[..., k0:k1, :]
            run_max = new_max
        tiles.append(acc / run_sum)
    out = mx.concatenate(tiles, axis=-2).astype(q.dtype)
    return out.reshape(batch, q_heads, q_rows, v.shape[-1])


def auto_qtile64_contract(q_rows: int) -> str:
    """The effective contract the composite selects for a call with `q_rows` query rows."""
    return TILED_64 if q_rows >= TILE else SINGLE_RANGE


def contract_attention(
    contract: str, q: mx.array, k: mx.array, v: mx.array, *, scale: float, causal: bool
) -> mx.array:
    """Run an effective contract by id."""
    if contract == SINGLE_RANGE:
        return single_range_attention(q, k, v, scale=scale, causal=causal)
    if contract == TILED_64:
        return tiled_attention(q, k, v, scale=scale, causal=causal)
    raise ValueError(f"unknown attention contract {contract!r}; known: {SINGLE_RANGE}, {TILED_64}")
