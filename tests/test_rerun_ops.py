"""The rerun's MLX ops against the float64 reference, and the SDPA route facts they report.

Everything here runs real MLX on the CPU stream: small arrays, exact expectations where MLX
is deterministic (bits), float32-sized tolerances where the float64 reference is the judge.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from backends.engines.mlx_device import DeviceError, device_of, gpu_available
from backends.kernels import attention_contracts as contracts
from backends.kernels import reference_f64 as ref
from backends.kernels.head_chunk import HeadChunkMaskError
from backends.rerun import ops

CPU = mx.Device(mx.cpu)


def _rand(rng: np.random.Generator, *shape: int) -> mx.array:
    return mx.array(rng.normal(0.0, 1.0, shape).astype(np.float32))


def _f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def _masks(rows: int, kv: int, heads: int) -> dict[str, object]:
    rng = np.random.default_rng(3)
    keep = rng.random((rows, kv)) > 0.3
    keep[:, -1] = True
    additive = np.where(keep, 0.0, -1e4).astype(np.float32)
    return {
        "none": None,
        "causal": "causal",
        "bool": mx.array(keep),
        "additive": mx.array(additive),
        "bool per head 1": mx.array(keep[None]),
    }


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive", "bool per head 1"])
def test_sdpa_matches_the_float64_reference_for_every_mask_kind(kind: str) -> None:
    rng = np.random.default_rng(0)
    q, k, v = _rand(rng, 1, 12, 6, 32), _rand(rng, 1, 2, 9, 32), _rand(rng, 1, 2, 9, 32)
    mask = _masks(6, 9, 12)[kind]
    run = ops.sdpa(q, k, v, scale=32**-0.5, mask=mask, device=CPU)
    np_mask = mask if mask is None or isinstance(mask, str) else np.array(mask)
    exact = ref.sdpa(_f64(q), _f64(k), _f64(v), scale=32**-0.5, mask=np_mask)
    np.testing.assert_allclose(_f64(run.output), exact, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive"])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_head_chunked_and_unchunked_sdpa_agree_bit_for_bit_on_cpu(kind: str, dtype: mx.Dtype) -> None:
    rng = np.random.default_rng(1)
    q, k, v = (_rand(rng, 1, h, n, 64).astype(dtype) for h, n in ((12, 6), (2, 11), (2, 11)))
    mask = _masks(6, 11, 12)[kind]
    if isinstance(mask, mx.array) and mask.dtype != mx.bool_:
        mask = mask.astype(dtype)
    chunked = ops.sdpa(q, k, v, scale=0.125, mask=mask, head_chunk=True, device=CPU)
    plain = ops.sdpa(q, k, v, scale=0.125, mask=mask, head_chunk=False, device=CPU)
    assert chunked.chunked and not plain.chunked
    assert len(chunked.calls) == 4 and len(plain.calls) == 1
    assert np.array_equal(np.array(chunked.output.view(mx.uint8)), np.array(plain.output.view(mx.uint8)))


def test_sdpa_reports_the_plan_the_primitive_taken_here_and_the_metal_prediction() -> None:
    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 1, 12, 6, 64), _rand(rng, 1, 2, 11, 64), _rand(rng, 1, 2, 11, 64)
    run = ops.sdpa(q, k, v, scale=0.125, mask="causal", device=CPU)
    assert [(c.call.kv_group, c.call.head_start, c.call.head_count) for c in run.calls] == [
        (0, 0, 5), (0, 5, 1), (1, 6, 5), (1, 11, 1)]
    assert {c.primitive for c in run.calls} == {"fallback"}
    assert {c.metal_primitive for c in run.calls} == {"sdpa_vector"}
    unchunked = ops.sdpa(q, k, v, scale=0.125, mask="causal", head_chunk=False, device=CPU)
    assert unchunked.calls[0].metal_primitive == "fallback"
    limited = ops.sdpa(q, k, v, scale=0.125, mask="causal", chunk_limit=12, device=CPU)
    assert [c.call.head_count for c in limited.calls] == [2, 2, 2, 2, 2, 2]


def test_a_mask_whose_heads_cannot_broadcast_to_a_chunk_is_refused_with_the_shapes() -> None:
    rng = np.random.default_rng(4)
    q, k, v = _rand(rng, 1, 12, 6, 32), _rand(rng, 1, 2, 9, 32), _rand(rng, 1, 2, 9, 32)
    mask = mx.ones((12, 6, 9), dtype=mx.bool_)
    with pytest.raises(HeadChunkMaskError, match="12 heads and cannot broadcast to the head chunk of 5"):
        ops.sdpa(q, k, v, scale=0.1, mask=mask, device=CPU)
    assert ops.sdpa(q, k, v, scale=0.1, mask=mask, head_chunk=False, device=CPU).output.shape == (1, 12, 6, 32)


def test_explicit_contracts_take_causal_or_no_mask_only() -> None:
    rng = np.random.default_rng(5)
    q, k, v = _rand(rng, 1, 4, 3, 16), _rand(rng, 1, 2, 5, 16), _rand(rng, 1, 2, 5, 16)
    with pytest.raises(ops.RerunOpError, match="takes a causal mask or none; this call has a bool mask"):
        ops.sdpa(q, k, v, scale=0.25, mask=mx.ones((3, 5), dtype=mx.bool_), route=contracts.TILED_64)
    with pytest.raises(ops.RerunOpError, match="attention route must be one of"):
        ops.sdpa(q, k, v, scale=0.25, route="flash")


def test_fully_masked_rows_follow_mlx_uniform_average_for_bool_and_nan_for_additive() -> None:
    rng = np.random.default_rng(6)
    q, k, v = _rand(rng, 1, 2, 2, 8), _rand(rng, 1, 2, 4, 8), _rand(rng, 1, 2, 4, 8)
    keep = np.ones((2, 4), dtype=bool)
    keep[0] = False
    out = ops.sdpa(q, k, v, scale=0.3, mask=mx.array(keep), head_chunk=False, device=CPU).output
    exact = ref.sdpa(_f64(q), _f64(k), _f64(v), scale=0.3, mask=keep)
    np.testing.assert_allclose(exact[:, :, 0], _f64(v).mean(axis=2), atol=1e-12)
    np.testing.assert_allclose(_f64(out), exact, atol=2e-6)
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    nan_out = ops.sdpa(q, k, v, scale=0.3, mask=mx.array(additive), head_chunk=False, device=CPU).output
    assert np.isnan(_f64(nan_out)[:, :, 0]).all()
    assert np.isnan(ref.sdpa(_f64(q), _f64(k), _f64(v), scale=0.3, mask=additive)[:, :, 0]).all()


def test_rms_norm_rope_swiglu_linear_and_add_match_the_float64_reference() -> None:
    rng = np.random.default_rng(7)
    x, w = _rand(rng, 5, 64), _rand(rng, 64)
    np.testing.assert_allclose(_f64(ops.rms_norm(x, w, 1e-6, CPU)), ref.rms_norm(_f64(x), _f64(w), 1e-6), rtol=1e-5, atol=1e-6)
    h = _rand(rng, 1, 3, 7, 64)
    got = ops.rope(h, dims=64, base=10000.0, offset=9, device=CPU)
    np.testing.assert_allclose(_f64(got), ref.rope(_f64(h), dims=64, base=10000.0, offset=9), atol=5e-5)
    trad = ops.rope(h, dims=64, base=10000.0, offset=9, traditional=True, device=CPU)
    np.testing.assert_allclose(_f64(trad), ref.rope(_f64(h), dims=64, base=10000.0, offset=9, traditional=True), atol=5e-5)
    gate, up = _rand(rng, 4, 32), _rand(rng, 4, 32)
    np.testing.assert_allclose(_f64(ops.swiglu(gate, up, device=CPU)), ref.swiglu(_f64(gate), _f64(up)), rtol=1e-5, atol=1e-6)
    weight, bias = _rand(rng, 16, 64), _rand(rng, 16)
    np.testing.assert_allclose(_f64(ops.linear(x, weight, device=CPU)), ref.linear(_f64(x), _f64(weight)), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_f64(ops.linear(x, weight, bias, CPU)), ref.linear(_f64(x), _f64(weight), _f64(bias)), rtol=1e-5, atol=1e-4)
    exact_sum = ref.residual_add(_f64(gate), _f64(up)).astype(np.float32)
    np.testing.assert_array_equal(np.array(ops.residual_add(gate, up, CPU)), exact_sum)


def test_the_two_swiglu_orders_round_differently_in_bfloat16() -> None:
    rng = np.random.default_rng(8)
    gate, up = (_rand(rng, 64, 256).astype(mx.bfloat16) for _ in range(2))
    a = np.array(ops.swiglu(gate, up, ops.SILU_THEN_MUL, CPU).view(mx.uint16))
    b = np.array(ops.swiglu(gate, up, ops.MUL_THEN_SIGMOID, CPU).view(mx.uint16))
    assert 0 < np.count_nonzero(a != b) < a.size
    with pytest.raises(ops.RerunOpError, match="SwiGLU order must be one of"):
        ops.swiglu(gate, up, "sigmoid_first")


def test_devices_are_cpu_or_an_available_gpu_named_in_the_refusal() -> None:
    assert device_of("cpu") == mx.Device(mx.cpu)
    if not gpu_available():
        with pytest.raises(DeviceError, match="this MLX build has no GPU"):
            device_of("gpu")
    with pytest.raises(DeviceError, match="'cpu' or 'gpu', not 'tpu'"):
        device_of("tpu")
