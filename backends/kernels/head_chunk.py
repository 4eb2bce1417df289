"""The MTPLX head-chunk rule for dense SDPA (docs/rerun.md, "Routes").

On Metal, MLX's vector attention kernel only takes calls with `q_len * GQA <= 32`. MTPLX's
`_verify_sdpa` therefore splits the query heads of each KV group into chunks small enough for
that kernel when a short multi-row call (`q_len <= 32`) would otherwise miss it. The plan and
the executor live here so the demo oracle, the demo native engine and the live rerun share
one exact implementation of the rule, and so the dispatch timeline can show each sub-call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx

DEFAULT_CHUNK_LIMIT = 32
OFF_VALUES = frozenset({"0", "off", "false", "no"})


def switch_enabled(value: str | bool | None) -> bool:
    """The on/off switch as MTPLX reads it: on unless explicitly 0/off/false/no."""
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    return value.strip().lower() not in OFF_VALUES


@dataclass(frozen=True)
class SdpaCall:
    """One attention primitive call: which query heads it covers, against which KV group.

    `kv_group` is -1 for a call that covers every KV group at once (no chunking).
    """

    kv_group: int
    head_start: int
    head_count: int
    q_rows: int
    kv_len: int


@dataclass(frozen=True)
class HeadChunkPlan:
    q_rows: int
    q_heads: int
    kv_heads: int
    heads_per_chunk: int

    @property
    def gqa(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def chunks_per_group(self) -> int:
        return -(-self.gqa // self.heads_per_chunk)

    @property
    def calls(self) -> int:
        return self.kv_heads * self.chunks_per_group

    def chunk_bounds(self) -> list[tuple[int, int]]:
        """(start, count) of each chunk within one KV group; the last may be a smaller remainder."""
        return [
            (start, min(self.heads_per_chunk, self.gqa - start))
            for start in range(0, self.gqa, self.heads_per_chunk)
        ]


def plan_head_chunks(
    q_rows: int,
    q_heads: int,
    kv_heads: int,
    *,
    enabled: bool = True,
    chunk_limit: int = DEFAULT_CHUNK_LIMIT,
) -> HeadChunkPlan | None:
    """The chunking MTPLX applies to one call, or None when the call runs unchunked."""
    if not enabled or q_rows < 1 or q_heads < 1 or kv_heads < 1 or chunk_limit < 1:
        return None
    if q_heads % kv_heads:
        return None
    gqa = q_heads // kv_heads
    if q_rows * gqa <= chunk_limit or q_rows > chunk_limit:
        return None
    heads = max(1, min(gqa, chunk_limit // q_rows))
    return HeadChunkPlan(q_rows, q_heads, kv_heads, heads)


def plan_calls(plan: HeadChunkPlan | None, q_rows: int, q_heads: int, kv_len: int) -> list[SdpaCall]:
    """The primitive calls a plan makes, in the order their outputs are concatenated."""
    if plan is None:
        return [SdpaCall(-1, 0, q_heads, q_rows, kv_len)]
    return [
        SdpaCall(group, group * plan.gqa + start, count, q_rows, kv_len)
        for group in range(plan.kv_heads)
        for start, count in plan.chunk_bounds()
    ]


Mask = mx.array | str | None
Kernel = Callable[[SdpaCall, mx.array, mx.array, mx.array, Mask], mx.array]


class HeadChunkMaskError(ValueError):
    """A mask whose head dimension cannot broadcast to a head chunk (MLX refuses the call)."""


def mlx_sdpa_kernel(scale: float) -> Kernel:
    """The plain MLX primitive as a kernel: what MTPLX calls for every chunk."""

    def kernel(call: SdpaCall, q: mx.array, k: mx.array, v: mx.array, mask: Mask) -> mx.array:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    return kernel


def _mask_head_dim(mask: Mask) -> int | None:
    if isinstance(mask, mx.array) and mask.ndim >= 3:
        return int(mask.shape[-3])
    return None


def run_calls(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    mask: Mask,
    calls: Sequence[SdpaCall],
    kernel: Kernel,
) -> mx.array:
    """Execute the calls of a plan on [B, heads, rows, dim] arrays, concatenating in head order.

    The mask goes to every sub-call unchanged, as in the pinned MTPLX source: a head-specific
    mask is not sliced, so MLX rejects one that cannot broadcast to a chunk, and the error
    says which call and which shapes.
    """
    if len(calls) == 1 and calls[0].kv_group == -1:
        return kernel(calls[0], q, k, v, mask)
    outputs = []
    for call in calls:
        group = call.kv_group
        q_part = q[:, call.head_start : call.head_start + call.head_count]
        try:
            outputs.append(kernel(call, q_part, k[:, group : group + 1], v[:, group : group + 1], mask))
        except ValueError as exc:
            mask_heads = _mask_head_dim(mask)
            if mask_heads is None or mask_heads in (1, call.head_count):
                raise
            raise HeadChunkMaskError(
                f"mask of shape {tuple(mask.shape)} has {mask_heads} heads and cannot broadcast to "
                f"the head chunk of {call.head_count} query heads (KV group {group}, heads "
                f"{call.head_start}..{call.head_start + call.head_count - 1}); the mask is passed "
                f"unchanged, so only a head dimension of 1 works. MLX said: {exc}"
            ) from exc
    return mx.concatenate(outputs, axis=1)


def head_chunked_sdpa(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    scale: float,
    mask: Mask = None,
    enabled: bool = True,
    chunk_limit: int = DEFAULT_CHUNK_LIMIT,
    kernel: Kernel | None = None,
) -> mx.array:
    """MTPLX `_verify_sdpa`: plan, then run each sub-call through `kernel` (MLX SDPA by default)."""
    _, q_heads, q_rows, _ = q.shape
    plan = plan_head_chunks(q_rows, q_heads, k.shape[1], enabled=enabled, chunk_limit=chunk_limit)
    calls = plan_calls(plan, q_rows, q_heads, k.shape[2])
    return run_calls(q, k, v, mask, calls, kernel or mlx_sdpa_kernel(scale))
