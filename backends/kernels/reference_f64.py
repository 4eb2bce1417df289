"""The rerun ops in float64 numpy: the exact math both engines approximate.

Native, oracle and rerun all round at some boundary; this does not (beyond float64), so the
distance of each side from it says which side is closer to exact -- the question a parity
investigation asks once it knows two sides differ. It is the math only: a head-chunked or
tiled attention call and an unchunked one are the same function here, because they are the
same function; only their roundings differ.

Layouts match `backends.rerun.ops`: q is [B, heads, rows, dim], k and v [B, kv_heads, kv_len,
dim], a causal mask is aligned bottom-right (query row i sits at position kv_len - rows + i).
"""

from __future__ import annotations

import numpy as np

Mask = np.ndarray | str | None


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(weight, dtype=np.float64)


def rope(x: np.ndarray, *, dims: int, base: float, offset: int, traditional: bool = False) -> np.ndarray:
    """Rotary embedding of [..., rows, dim]; NeoX halves unless `traditional` (interleaved pairs)."""
    x = np.asarray(x, dtype=np.float64)
    half = dims // 2
    rows = x.shape[-2]
    inv_freq = base ** (-np.arange(half, dtype=np.float64) / half)
    theta = np.arange(offset, offset + rows, dtype=np.float64)[:, None] * inv_freq
    cos, sin = np.cos(theta), np.sin(theta)
    out = x.copy()
    if traditional:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2] = x1 * cos - x2 * sin
        out[..., 1:dims:2] = x1 * sin + x2 * cos
    else:
        x1, x2 = x[..., :half], x[..., half:dims]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:dims] = x1 * sin + x2 * cos
    return out


def _mask_scores(scores: np.ndarray, mask: Mask, q_rows: int, kv_len: int) -> np.ndarray:
    """Masked scores; a masked-out position becomes -inf (bool, causal) or gets the addend."""
    if mask is None:
        return scores
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}; the string mask is 'causal'")
        keep = np.arange(kv_len - q_rows, kv_len)[:, None] >= np.arange(kv_len)[None]
        return np.where(keep, scores, -np.inf)
    if mask.dtype == np.bool_:
        return np.where(mask, scores, -np.inf)
    return scores + np.asarray(mask, dtype=np.float64)


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, mask: Mask = None) -> np.ndarray:
    """softmax(scale * q k^T + mask) v with grouped KV heads.

    A row whose every key is masked by a bool or causal mask averages V uniformly, as MLX
    does (it masks with the dtype's lowest finite value, not -inf); a fully -inf additive
    row is NaN, as in MLX.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch, heads, rows, dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    grouped = q.reshape(batch, kv_heads, group, rows, dim)
    scores = scale * grouped @ np.swapaxes(k, -1, -2)[:, :, None]
    bool_like = mask is not None and (isinstance(mask, str) or np.asarray(mask).dtype == np.bool_)
    masked = _mask_scores(scores, mask if isinstance(mask, str) or mask is None else _group_mask(mask, kv_heads, group), rows, kv_len)
    if bool_like:
        dead = np.all(np.isneginf(masked), axis=-1, keepdims=True)
        masked = np.where(dead, 0.0, masked)
    with np.errstate(invalid="ignore"):
        peak = np.max(masked, axis=-1, keepdims=True)
        weights = np.exp(masked - peak)
        weights = weights / np.sum(weights, axis=-1, keepdims=True)
    out = weights @ v[:, :, None]
    return out.reshape(batch, heads, rows, v.shape[-1])


def _group_mask(mask: np.ndarray, kv_heads: int, group: int) -> np.ndarray:
    """A [..., heads or 1, rows, kv] mask seen against scores of [B, kv_heads, group, rows, kv]."""
    mask = np.asarray(mask)
    if mask.ndim < 3:
        return mask
    lead, heads = mask.shape[:-3], mask.shape[-3]
    if heads == kv_heads * group and heads > 1:
        return mask.reshape(*lead, kv_heads, group, *mask.shape[-2:])
    return np.expand_dims(mask, -3)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    gate = np.asarray(gate, dtype=np.float64)
    with np.errstate(over="ignore"):
        return gate / (1.0 + np.exp(-gate)) * np.asarray(up, dtype=np.float64)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    out = np.asarray(x, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
    return out if bias is None else out + np.asarray(bias, dtype=np.float64)


def residual_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64) + np.asarray(b, dtype=np.float64)
