"""The demo engines: what they record, that recording changes no bits, and that the native's
hand-written ops reproduce MLX's own (which is why the clean pair can match bit for bit)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import platformdirs
import pytest
from mlx_lm.models.cache import KVCache

from backends.demo.generate import (
    DEFAULT_SCENARIO,
    SCENARIOS,
    DemoPrompt,
    default_demo_dir,
    iter_generate,
    pair_paths,
)
from backends.engines.capture_sink import CaptureSink
from backends.engines.demo_model import DemoConfig, build_oracle_model, seeded_weights
from backends.engines.demo_scenarios import EngineOptions
from backends.engines.native_engine import rms_norm, rope_neox, rope_tables
from backends.engines.oracle_engine import OracleEngine
from backends.kernels import attention_contracts as contracts
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter
from sessions.progress import Progress

ORACLE_LAYER_STAGES = [
    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.q_norm",
    "self_attn.k_norm", "self_attn.rope", "self_attn.rope", "self_attn.sdpa", "self_attn.o_proj", "attn_residual",
    "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.swiglu", "mlp.down_proj",
]
NATIVE_LAYER_STAGES = [
    "attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "kqv_out", "attn_out",
    "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out", "l_out",
]


def _bits(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16))


@pytest.mark.slow
def test_oracle_records_every_stage_in_execution_order_with_mlx_layouts(demo_pairs: dict) -> None:
    with open_capture(demo_pairs["clean"][1]) as oracle:
        visual = [r for r in oracle.records if r.step == 0 and r.segment == "visual"]
        expected = ["model.embed_tokens"]
        for n in range(DemoConfig().num_hidden_layers):
            expected += [f"model.layers.{n}.{s}" for s in ORACLE_LAYER_STAGES] + [f"model.layers.{n}"]
        assert [r.name for r in visual] == expected + ["model.norm", "lm_head"]
        shapes = {(r.name, r.occurrence): r.shape for r in visual}
        assert shapes[("model.layers.1.self_attn.q_norm", 0)] == (1, 72, 12, 64)
        assert shapes[("model.layers.1.self_attn.rope", 1)] == (1, 2, 72, 64)
        assert shapes[("model.layers.1.self_attn.sdpa", 0)] == (1, 12, 72, 64)
        assert shapes[("lm_head", 0)] == (1, 72, 512)
        assert {r.dtype for r in oracle.records} == {"bfloat16"}
        assert sorted({(r.step, r.segment) for r in oracle.records})[:4] == [
            (0, "text-after"), (0, "text-before"), (0, "visual"), (1, "decode")]


@pytest.mark.slow
def test_native_uses_llama_cpp_names_and_row_major_layouts(demo_pairs: dict) -> None:
    with open_capture(demo_pairs["clean"][0]) as native:
        decode = [r for r in native.records if r.step == 2]
        expected = ["inp_embd"]
        for n in range(DemoConfig().num_hidden_layers):
            expected += [f"{s}-{n}" for s in NATIVE_LAYER_STAGES]
        assert [r.name for r in decode] == expected + ["result_norm", "result_output"]
        q = [r for r in decode if r.name == "Qcur-0"]
        assert [(r.occurrence, r.shape) for r in q] == [(0, (1, 768)), (1, (1, 12, 64))]
        assert native.meta.role == "native" and native.complete


@pytest.mark.slow
def test_every_sdpa_record_owns_its_dispatch_events_with_routes(demo_pairs: dict) -> None:
    for path in demo_pairs["clean"]:
        with open_capture(path) as capture:
            sdpa = {r.seq: r for r in capture.records if r.name.endswith("sdpa") or r.name.startswith("kqv_out")}
            assert set(capture.dispatch["index_seq"].tolist()) == set(sdpa)
            assert set(capture.dispatch["primitive"].tolist()) == {b"fallback"}
            assert set(capture.dispatch["metal_primitive"].tolist()) == {b"sdpa_vector", b"sdpa_full"}
            for record in sdpa.values():
                assert record.kernel_id and record.effective_contract_id == contracts.SINGLE_RANGE
            provenance = capture.meta.provenance
            assert provenance["options"]["head_chunk"] is True and provenance["mlx_version"] == mx.__version__


def test_recording_changes_no_bits_and_restores_the_classes(tmp_path: Path) -> None:
    config = DemoConfig()
    weights = seeded_weights(config, 3)
    prompt = DemoPrompt.from_seed(config, 3)
    plain_model = build_oracle_model(config, weights)
    cache = [KVCache() for _ in plain_model.layers]
    plain = [plain_model(mx.array(ids)[None], cache=cache)[0] for _, ids in prompt.segments]
    originals = (nn.Linear.__call__, nn.RMSNorm.__call__, mx.fast.scaled_dot_product_attention)
    with CaptureWriter(tmp_path / "o.h5", CaptureMeta(role="oracle")) as writer:
        sink = CaptureSink(writer)
        engine = OracleEngine(build_oracle_model(config, weights), EngineOptions(), sink)
        for segment, ids in prompt.segments:
            sink.segment = segment
            assert np.array_equal(_bits(engine.forward(list(ids))), _bits(plain.pop(0)))
    assert (nn.Linear.__call__, nn.RMSNorm.__call__, mx.fast.scaled_dot_product_attention) == originals


def test_native_rms_norm_and_rope_reproduce_mlx_fast_bits() -> None:
    key = mx.random.key(7)
    x = (mx.random.normal((9, 12, 64), key=key) * 3).astype(mx.bfloat16)
    weight = (1 + 0.1 * mx.random.normal((64,), key=mx.random.key(8))).astype(mx.bfloat16)
    assert np.array_equal(_bits(rms_norm(x, weight, 1e-6)), _bits(mx.fast.rms_norm(x, weight, 1e-6)))
    cos, sin = rope_tables(mx.arange(77, 86), 64, 1_000_000.0, mx.bfloat16)
    mine = rope_neox(x, cos, sin)
    theirs = mx.fast.rope(x.transpose(1, 0, 2)[None], 64, traditional=False, base=1_000_000.0, scale=1.0, offset=77)
    assert np.array_equal(_bits(mine), _bits(theirs[0].transpose(1, 0, 2)))


def test_single_range_contract_is_mlx_cpu_sdpa_and_the_tiled_one_is_not() -> None:
    k1, k2, k3 = mx.random.split(mx.random.key(5), 3)
    q = mx.random.normal((1, 12, 72, 64), key=k1).astype(mx.bfloat16)
    k = mx.random.normal((1, 2, 77, 64), key=k2).astype(mx.bfloat16)
    v = mx.random.normal((1, 2, 77, 64), key=k3).astype(mx.bfloat16)
    mlx_out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    single = contracts.single_range_attention(q, k, v, scale=0.125, causal=True)
    tiled = contracts.tiled_attention(q, k, v, scale=0.125, causal=True)
    assert np.array_equal(_bits(single), _bits(mlx_out))
    assert (_bits(tiled) != _bits(single)).mean() > 0.1
    qf, kf, vf = (np.array(a.astype(mx.float32), dtype=np.float64) for a in (q, k, v))
    scores = np.einsum("hqd,hkd->hqk", qf[0], np.repeat(kf[0], 6, axis=0)) * 0.125
    scores[:, np.arange(72)[:, None] + 5 < np.arange(77)[None]] = -np.inf
    p = np.exp(scores - scores.max(-1, keepdims=True))
    exact = np.einsum("hqk,hkd->hqd", p / p.sum(-1, keepdims=True), np.repeat(vf[0], 6, axis=0))
    for out in (single, tiled):
        assert np.abs(np.array(out.astype(mx.float32))[0] - exact).max() < 0.05
    assert contracts.auto_qtile64_contract(63) == contracts.SINGLE_RANGE
    assert contracts.auto_qtile64_contract(64) == contracts.TILED_64


def test_generate_api_paths_progress_and_unknown_scenarios(tmp_path: Path) -> None:
    assert DEFAULT_SCENARIO in SCENARIOS
    assert default_demo_dir() == platformdirs.user_cache_path("parity-xray") / "demo"
    assert pair_paths(tmp_path, "clean") == (tmp_path / "clean.native.h5", tmp_path / "clean.oracle.h5")
    work = iter_generate(tmp_path, ["clean"], seed=1)
    steps = []
    try:
        while True:
            steps.append(next(work))
    except StopIteration as stop:
        result = stop.value
    assert [p.done for p in steps] == [1, 2, 3] and all(isinstance(p, Progress) and p.total == 3 for p in steps)
    assert result == {"clean": pair_paths(tmp_path, "clean")}
    with pytest.raises(ValueError, match="unknown scenario"):
        next(iter_generate(tmp_path, ["nope"]))
