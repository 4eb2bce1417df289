"""Each Metal routing rule of MLX 0.32.x at its boundary, and what runs on this CPU."""

from __future__ import annotations

import mlx.core as mx
import pytest

from backends.kernels.head_chunk import plan_calls, plan_head_chunks
from backends.kernels.metal_routes import (
    CPU,
    GPU,
    GPU_LARGE,
    RULES_SOURCE,
    DeviceClass,
    SdpaShape,
    executed_route,
    predict_route,
)

V = "0.32.4"


def shape(rows: int = 1, q_heads: int = 12, kv_heads: int = 2, dim: int = 64, v_dim: int | None = None,
          kv_len: int = 100, mask: str = "none", dtype: str = "bfloat16") -> SdpaShape:
    return SdpaShape(rows, q_heads, kv_heads, dim, dim if v_dim is None else v_dim, kv_len, mask, dtype)


def route(s: SdpaShape, device: DeviceClass = GPU, version: str = V) -> str:
    return predict_route(s, device, version).primitive


def test_eight_rows_take_the_vector_kernel_and_nine_the_full_one() -> None:
    assert route(shape(rows=8, q_heads=4, kv_heads=1)) == "sdpa_vector"
    assert route(shape(rows=9, q_heads=4, kv_heads=1)) == "sdpa_full"


def test_q_len_times_gqa_32_is_vector_and_33_falls_back() -> None:
    assert route(shape(rows=4, q_heads=16, kv_heads=2)) == "sdpa_vector"
    assert route(shape(rows=3, q_heads=11, kv_heads=1)) == "fallback"
    decision = predict_route(shape(rows=3, q_heads=11, kv_heads=1), GPU, V)
    assert decision.rule == "has_fused_kernel: vector q_len*GQA<=32" and decision.source == RULES_SOURCE


def test_head_chunking_moves_rows_3_to_8_of_gqa_12_onto_the_vector_kernel() -> None:
    for rows in range(3, 9):
        assert route(shape(rows=rows, q_heads=24, kv_heads=2)) == "fallback"
        plan = plan_head_chunks(rows, 24, 2)
        assert plan is not None
        for call in plan_calls(plan, rows, 24, 100):
            assert route(shape(rows=rows, q_heads=call.head_count, kv_heads=1)) == "sdpa_vector"
    chunk = plan_head_chunks(9, 24, 2)
    assert chunk is not None and route(shape(rows=9, q_heads=chunk.heads_per_chunk, kv_heads=1)) == "sdpa_full"


@pytest.mark.parametrize(("dim", "rows", "expected"), [
    (64, 9, "sdpa_full"), (72, 9, "sdpa_full"), (80, 9, "sdpa_full"), (96, 9, "sdpa_full"), (128, 9, "sdpa_full"),
    (192, 9, "fallback"), (256, 9, "fallback"), (48, 9, "fallback"),
    (64, 2, "sdpa_vector"), (96, 2, "sdpa_vector"), (128, 2, "sdpa_vector"), (256, 2, "sdpa_vector"),
    (72, 2, "fallback"), (80, 2, "fallback"), (192, 2, "fallback"),
])
def test_head_dim_rules(dim: int, rows: int, expected: str) -> None:
    assert route(shape(rows=rows, q_heads=2, kv_heads=1, dim=dim)) == expected


def test_query_192_with_value_128_takes_the_vector_kernel_only() -> None:
    assert route(shape(rows=2, q_heads=2, kv_heads=1, dim=192, v_dim=128)) == "sdpa_vector"
    assert route(shape(rows=9, q_heads=2, kv_heads=1, dim=192, v_dim=128)) == "fallback"


def test_query_rows_beyond_kv_len() -> None:
    assert route(shape(rows=4, q_heads=2, kv_heads=1, kv_len=3)) == "fallback"
    assert route(shape(rows=4, q_heads=2, kv_heads=1, kv_len=4)) == "sdpa_vector"
    assert route(shape(rows=20, q_heads=2, kv_heads=1, kv_len=19, mask="causal")) == "fallback"
    assert route(shape(rows=20, q_heads=2, kv_heads=1, kv_len=19, mask="bool")) == "sdpa_full"
    assert route(shape(rows=20, q_heads=2, kv_heads=1, kv_len=20, mask="causal")) == "sdpa_full"


def test_two_pass_thresholds() -> None:
    one_head = shape(rows=1, q_heads=1, kv_heads=1, kv_len=1023)
    assert route(one_head, GPU_LARGE) == "sdpa_vector"
    assert route(shape(rows=1, q_heads=1, kv_heads=1, kv_len=1024), GPU_LARGE) == "sdpa_vector_2pass"
    assert route(shape(rows=1, q_heads=1, kv_heads=1, kv_len=1024), GPU) == "sdpa_vector"
    assert route(shape(rows=1, q_heads=8, kv_heads=2, kv_len=4095), GPU) == "sdpa_vector"
    assert route(shape(rows=1, q_heads=8, kv_heads=2, kv_len=4096), GPU) == "sdpa_vector_2pass"
    assert route(shape(rows=1, q_heads=2, kv_heads=2, kv_len=8192), GPU) == "sdpa_vector"
    assert DeviceClass.from_architecture("applegpu_g15d").large
    assert not DeviceClass.from_architecture("applegpu_g15p").large


def test_head_dim_256_long_causal_prefill_uses_the_fused_kernel_only_with_nax() -> None:
    long_prefill = shape(rows=1024, q_heads=8, kv_heads=2, dim=256, kv_len=1024, mask="causal")
    assert route(long_prefill, GPU) == "fallback"
    assert route(long_prefill, DeviceClass(gpu=True, nax=True)) == "sdpa_full"
    assert route(shape(rows=1023, q_heads=8, kv_heads=2, dim=256, kv_len=1024, mask="causal"), DeviceClass(gpu=True, nax=True)) == "fallback"
    f32 = shape(rows=1024, q_heads=8, kv_heads=2, dim=256, kv_len=1024, mask="causal", dtype="float32")
    assert route(f32, DeviceClass(gpu=True, nax=True)) == "fallback"
    assert route(f32, DeviceClass(gpu=True, nax=True, tf32=True)) == "sdpa_full"


def test_cpu_has_no_fused_kernel() -> None:
    assert route(shape(rows=1), CPU) == "fallback"


@pytest.mark.parametrize("version", ["0.32.1", "0.31.0", "0.33.0", "1.0"])
def test_a_version_without_rules_is_unknown_not_guessed(version: str) -> None:
    decision = predict_route(shape(rows=1), GPU, version)
    assert decision.primitive == "unknown" and version in decision.reason


def test_this_cpu_build_executes_the_fallback() -> None:
    assert mx.default_device().type == mx.cpu
    assert executed_route(shape(rows=1)).primitive == "fallback"
