"""Every candidate contract, run on real captured inputs: whose bits it gives back, exactly.

One case per registry entry (a new contract adds its entry and its case): which pair, which op,
and what the candidate reproduces from the native's own inputs -- the native's captured bits,
the oracle's route on the same inputs, both (the engines agree there), neither, or why it
cannot run. The ggml cases run on real llama.cpp captures; they are what makes "the native ran
ggml.rms_norm" a measurement rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.diagnosis.candidates import candidate_inputs, record_bits, run_candidate
from backends.diagnosis.classify import classify
from backends.diagnosis.registry import REGISTRY
from backends.rerun.segment import RerunSession
from sessions.capture.opening import open_capture
from sessions.compare.key import OpKey
from sessions.compare.result_cache import iter_compare_cached
from sessions.progress import run_to_end

pytestmark = pytest.mark.slow

NATIVE, ORACLE, BOTH, NEITHER = "native", "oracle", "both", "neither"

CASES: dict[str, tuple[str, str, str]] = {
    # RMSNorm
    "rms_norm.mlx": ("clean", "0:visual:0:attn_norm", BOTH),
    "rms_norm.f32.weight_after_cast": ("clean", "0:visual:0:attn_norm", BOTH),
    "rms_norm.f32.weight_before_cast": ("clean", "0:visual:0:attn_norm", NEITHER),
    "ggml.rms_norm": ("llama-f32", "0:prefill:0:attn_norm", NATIVE),
    # matmul / linear
    "linear.mlx": ("llama-f32", "0:prefill:0:q_proj", ORACLE),
    "linear.f32_accumulate": ("clean", "0:visual:0:q_proj", BOTH),
    "ggml.mul_mat.f32": ("llama-f32", "0:prefill:0:q_proj", NATIVE),
    "ggml.mul_mat.f32.no_fma": ("llama-f32", "0:prefill:0:q_proj", NEITHER),
    "ggml.mul_mat.f16": ("llama-f16", "0:prefill:0:q_proj", NATIVE),
    "ggml.mul_mat.bf16": ("llama-f32", "0:prefill:0:q_proj", NEITHER),
    "ggml.mul_mat.q8_0": ("llama-q8_0", "0:prefill:0:q_proj", NATIVE),
    "ggml.mul_mat.q8_0.ref_quantizer": ("llama-q8_0", "0:prefill:0:q_proj", NEITHER),
    "ggml.act.q8_k": ("clean", "0:visual:0:ffn_down", NEITHER),
    # SwiGLU
    "swiglu.silu_then_mul": ("swiglu-order", "0:text-before:0:ffn_act", ORACLE),
    "swiglu.mul_then_sigmoid": ("swiglu-order", "0:text-before:0:ffn_act", NATIVE),
    "swiglu.silu_exp": ("swiglu-order", "0:text-before:0:ffn_act", NEITHER),
    "swiglu.f32": ("llama-f32", "0:prefill:0:ffn_act", ORACLE),
    "ggml.swiglu": ("llama-f32", "0:prefill:0:ffn_act", NATIVE),
    # RoPE
    "rope.mlx.neox": ("clean", "0:text-after:0:q_rope", BOTH),
    "rope.mlx.interleaved": ("clean", "0:text-after:0:q_rope", NEITHER),
    "rope.mlx.neox.position0": ("clean", "0:text-after:0:q_rope", NEITHER),
    "rope.tables.input_dtype": ("clean", "0:text-after:0:q_rope", BOTH),
    "rope.tables.f32": ("clean", "0:text-after:0:q_rope", NEITHER),
    "ggml.rope.neox": ("llama-f32", "0:prefill:0:q_rope", NATIVE),
    "ggml.rope.neox.no_fma": ("llama-f32", "0:prefill:0:q_rope", NEITHER),
    # attention
    "attn.mlx_sdpa.head_chunked": ("attention-contract", "0:visual:0:sdpa", NATIVE),
    "attn.mlx_sdpa.unchunked": ("attention-contract", "0:visual:0:sdpa", NATIVE),
    "attn.bf16.single_range": ("attention-contract", "0:visual:0:sdpa", NATIVE),
    "attn.f16.single_range": ("attention-contract", "0:visual:0:sdpa", NEITHER),
    "attn.f32.single_range": ("attention-contract", "0:visual:0:sdpa", NEITHER),
    "attn.f32.tiled64x64": ("attention-contract", "0:visual:0:sdpa", ORACLE),
    "attn.auto_qtile64": ("attention-contract", "0:visual:0:sdpa", ORACLE),
    "ggml.attn.f32": ("llama-f32", "0:prefill:0:sdpa", NATIVE),
    "ggml.attn.f16_cache": ("llama-f32-kv16", "0:prefill:0:sdpa", NATIVE),
    # residuals and copies
    "residual.add": ("clean", "0:visual:0:attn_residual", BOTH),
    "cache.store": ("llama-f32", "1:decode:1:k_cache", BOTH),
    "copy.plus_zero": ("signed-zero", "0:text-before:0:ffn_act", NATIVE),
}


@pytest.fixture(scope="module")
def pairs(demo_pairs: dict, llama_tiny_pairs: dict) -> dict[str, tuple[Path, Path]]:
    return {**demo_pairs, **{f"llama-{variant}": pair for variant, pair in llama_tiny_pairs.items()}}


@pytest.fixture(scope="module")
def sessions(pairs: dict[str, tuple[Path, Path]]) -> Iterator[dict[str, RerunSession]]:
    """One rerun session per pair, opened when a case first needs it."""
    opened: dict[str, RerunSession] = {}
    files = []

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> RerunSession:
            native, oracle = open_capture(pairs[name][0]), open_capture(pairs[name][1])
            files.extend((native, oracle))
            opened[name] = RerunSession(native, oracle, run_to_end(iter_compare_cached(native, oracle)))
            self[name] = opened[name]
            return opened[name]

    yield Lazy()
    for capture in files:
        capture.close()


def _reproduces(session: RerunSession, candidate_id: str, key_text: str) -> str:
    key = OpKey.parse(key_text)
    pair = next(p for p in session.comparison.pairs if p.key == key)
    found = classify(session, pair)
    candidate = next(c for c in REGISTRY if c.id == candidate_id)
    result = run_candidate(candidate, candidate_inputs(session, "native", key, found.route_bits), record_bits(session.captured["native"], key))
    assert result.skipped is None, result.skipped
    assert result.vs_native is not None and result.vs_oracle_route is not None
    native, oracle = result.vs_native.bit_exact, result.vs_oracle_route.bit_exact
    return {(True, True): BOTH, (True, False): NATIVE, (False, True): ORACLE, (False, False): NEITHER}[(native, oracle)]


def test_every_registered_candidate_has_a_case() -> None:
    assert set(CASES) == {c.id for c in REGISTRY}


@pytest.mark.parametrize("candidate_id", list(CASES))
def test_candidate_reproduces_what_its_case_says(sessions: dict[str, RerunSession], candidate_id: str) -> None:
    pair, key, expected = CASES[candidate_id]
    assert _reproduces(sessions[pair], candidate_id, key) == expected


def test_ggml_mul_mat_takes_vec_dot_for_one_activation_row_where_contraction_cannot_show(sessions: dict[str, RerunSession]) -> None:
    assert _reproduces(sessions["llama-f32"], "ggml.mul_mat.f32", "1:decode:0:q_proj") == NATIVE
    assert _reproduces(sessions["llama-q8_0"], "ggml.mul_mat.q8_0", "1:decode:0:q_proj") == NATIVE


def test_a_candidate_that_cannot_run_says_why(sessions: dict[str, RerunSession]) -> None:
    session = sessions["clean"]
    q8_k = next(c for c in REGISTRY if c.id == "ggml.act.q8_k")
    position0 = next(c for c in REGISTRY if c.id == "rope.mlx.neox.position0")
    q8_0 = next(c for c in REGISTRY if c.id == "ggml.mul_mat.q8_0")
    q_proj = candidate_inputs(session, "native", OpKey.parse("0:visual:0:q_proj"), None)
    assert q8_k.unavailable(q_proj) == "Q8_K blocks hold 256 values; this op's input width 384 is not a multiple of 256"
    assert q8_0.unavailable(q_proj) == "needs the weight's stored Q8_0 blocks; the weight does not come from a GGUF file"
    rope = candidate_inputs(session, "native", OpKey.parse("0:text-before:0:q_rope"), None)
    assert position0.unavailable(rope) == "the cache offset is 0 here: positions from 0 are the captured positions"


@pytest.mark.parametrize("key", ["0:prefill:1:sdpa", "2:decode:1:sdpa"])
def test_attention_over_an_f16_cache_is_the_f16_contract_in_prefill_and_decode_and_not_the_f32_one(sessions: dict[str, RerunSession], key: str) -> None:
    """Prefill (six query rows: tinyBLAS) and decode (one row: vec_dot_f16) both round q and the
    probabilities to F16; the F32 cache's contract misses every element there, and the F16 one
    misses the F32 cache's run."""
    assert _reproduces(sessions["llama-f32-kv16"], "ggml.attn.f16_cache", key) == NATIVE
    assert _reproduces(sessions["llama-f32-kv16"], "ggml.attn.f32", key) == NEITHER
    assert _reproduces(sessions["llama-f32"], "ggml.attn.f16_cache", key) == NEITHER

