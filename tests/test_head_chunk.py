"""The head-chunk planner follows MTPLX `_verify_sdpa` exactly, and its executor is bit-neutral on CPU."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from backends.kernels.head_chunk import (
    HeadChunkMaskError,
    SdpaCall,
    head_chunked_sdpa,
    plan_calls,
    plan_head_chunks,
    switch_enabled,
)


@pytest.mark.parametrize(("rows", "expected"), [(3, (10, 4)), (4, (8, 4)), (6, (5, 6)), (8, (4, 6)), (32, (1, 24))])
def test_seed_plan_cases_for_gqa_12(rows: int, expected: tuple[int, int]) -> None:
    plan = plan_head_chunks(rows, 24, 2)
    assert plan is not None
    assert (plan.heads_per_chunk, plan.calls) == expected


@pytest.mark.parametrize("rows", [1, 2, 33])
def test_rows_1_2_and_33_are_not_chunked(rows: int) -> None:
    assert plan_head_chunks(rows, 24, 2) is None


def test_remainder_heads_form_a_last_smaller_chunk_per_group() -> None:
    plan = plan_head_chunks(3, 24, 2)
    assert plan is not None and plan.chunk_bounds() == [(0, 10), (10, 2)]
    assert plan_calls(plan, 3, 24, 40) == [
        SdpaCall(0, 0, 10, 3, 40),
        SdpaCall(0, 10, 2, 3, 40),
        SdpaCall(1, 12, 10, 3, 40),
        SdpaCall(1, 22, 2, 3, 40),
    ]


def test_gqa_that_does_not_divide_has_no_plan() -> None:
    assert plan_head_chunks(6, 14, 4) is None


def test_switch_and_chunk_limit() -> None:
    assert plan_head_chunks(6, 24, 2, enabled=False) is None
    assert [switch_enabled(v) for v in ("0", "off", "FALSE", " no ", "1", "on", None)] == [False] * 4 + [True] * 3
    plan = plan_head_chunks(6, 24, 2, chunk_limit=64)
    assert plan is not None and (plan.heads_per_chunk, plan.calls) == (10, 4)
    assert plan_head_chunks(40, 24, 2, chunk_limit=64) is not None


def test_unchunked_call_covers_every_kv_group() -> None:
    assert plan_calls(None, 2, 24, 9) == [SdpaCall(-1, 0, 24, 2, 9)]


def _qkv(rows: int, kv_len: int, q_heads: int, kv_heads: int, dtype: mx.Dtype, seed: int) -> tuple[mx.array, ...]:
    key = mx.random.key(seed)
    k1, k2, k3 = mx.random.split(key, 3)
    return (
        mx.random.normal((1, q_heads, rows, 64), key=k1).astype(dtype),
        mx.random.normal((1, kv_heads, kv_len, 64), key=k2).astype(dtype),
        mx.random.normal((1, kv_heads, kv_len, 64), key=k3).astype(dtype),
    )


def _bits(a: mx.array) -> np.ndarray:
    return np.array(a.view({2: mx.uint16, 4: mx.uint32}[a.dtype.size]))


def test_chunked_and_unchunked_sdpa_agree_bit_for_bit_on_cpu() -> None:
    """On the CPU build every call takes the fallback, so chunking cannot change bits."""
    cases = 0
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        for rows in (3, 4, 6, 8, 17, 32):
            for mask_kind in ("causal", "bool", "additive", "none"):
                q, k, v = _qkv(rows, rows + 5, 24, 2, dtype, seed=rows)
                keep = mx.arange(rows)[:, None] + 5 >= mx.arange(rows + 5)[None]
                mask = {"causal": "causal", "bool": keep, "none": None,
                        "additive": mx.where(keep, 0.0, -1e4).astype(dtype)[None, None]}[mask_kind]
                plain = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
                chunked = head_chunked_sdpa(q, k, v, scale=0.125, mask=mask)
                assert np.array_equal(_bits(plain), _bits(chunked)), (dtype, rows, mask_kind)
                cases += 1
    assert cases == 72


def test_a_mask_that_cannot_broadcast_to_a_chunk_is_rejected_with_the_shapes() -> None:
    q, k, v = _qkv(6, 10, 24, 2, mx.bfloat16, seed=1)
    full_head_mask = mx.zeros((1, 24, 6, 10), dtype=mx.bfloat16)
    with pytest.raises(HeadChunkMaskError, match=r"24 heads .* chunk of 5 query heads .*broadcast_shapes"):
        head_chunked_sdpa(q, k, v, scale=0.125, mask=full_head_mask)


def test_a_head_dimension_of_1_broadcasts_to_every_chunk() -> None:
    q, k, v = _qkv(6, 10, 24, 2, mx.bfloat16, seed=2)
    mask = mx.zeros((1, 1, 6, 10), dtype=mx.bfloat16)
    out = head_chunked_sdpa(q, k, v, scale=0.125, mask=mask)
    assert np.array_equal(_bits(out), _bits(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)))
