"""Every candidate contract, run on real captured inputs: whose bits it gives back, exactly.

One case per registry entry (a new contract adds its entry and its case): which pair, which op,
and what the candidate reproduces from the native's own inputs -- the native's captured bits,
the oracle's route on the same inputs, both (the engines agree there), neither, or why it
cannot run. The ggml cases run on real llama.cpp captures; they are what makes "the native ran
ggml.rms_norm" a measurement rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
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
    "ggml.attn.flash": ("llama-f32-flash", "0:prefill:0:sdpa", NATIVE),
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



@pytest.mark.parametrize("key", ["0:prefill:1:sdpa", "2:decode:1:sdpa"])
def test_flash_attention_is_its_own_contract_and_not_either_decomposed_one(sessions: dict[str, RerunSession], key: str) -> None:
    """The one-row kernel (six query rows, then one): F16 q and values, an F16 accumulator."""
    assert _reproduces(sessions["llama-f32-flash"], "ggml.attn.flash", key) == NATIVE
    assert _reproduces(sessions["llama-f32-flash"], "ggml.attn.f16_cache", key) == NEITHER
    assert _reproduces(sessions["llama-f32"], "ggml.attn.flash", key) == NEITHER


def test_flash_attention_from_64_query_rows_is_the_tiled_kernel_bit_for_bit(llama_tiny_pairs: dict, tmp_path: Path) -> None:
    """A 70-row prefill takes ggml's tiled kernel (q in float32, 64-cell tiles). Its first 63
    rows, as a call of their own, would take the one-row kernel, whose arithmetic misses them:
    the two paths are told apart."""
    from backends.kernels import ggml_cpu
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.llama_recorder import LlamaSettings
    from backends.recorders.record_schedule import TokenSchedule

    out = tmp_path / "flash70.h5"
    gguf = llama_tiny_pairs["f32"][0].parent / "tiny.f32.gguf"
    run_to_end(iter_record_llama(gguf, TokenSchedule(tuple((i * 7) % 90 + 1 for i in range(70))), out, LlamaSettings(flash_attn=True)))
    with open_capture(out, check_in_child=False) as capture:
        def last(name: str) -> np.ndarray:
            return capture.read_values([r for r in capture.records if r.name == name][-1]).astype(np.float32)

        q, k, v, out_bits = last("Qcur-0").transpose(1, 0, 2), last("Kcur-0").transpose(1, 0, 2), last("Vcur-0").reshape(70, 2, 32), last("kqv_out-0")
    v = v.transpose(1, 0, 2)
    tiled = ggml_cpu.flash_attention(q, k, v, scale=32**-0.5, causal=True)
    one_row = ggml_cpu.flash_attention(q[:, :63], k[:, :63], v[:, :63], scale=32**-0.5, causal=True)
    assert np.array_equal(tiled.transpose(1, 0, 2).reshape(70, -1).view(np.uint32), out_bits.view(np.uint32))
    assert not np.array_equal(one_row.transpose(1, 0, 2).reshape(63, -1).view(np.uint32), out_bits[:63].view(np.uint32))


def test_flash_attention_over_512_cells_in_one_row_is_refused_with_the_reason(sessions: dict[str, RerunSession]) -> None:
    flash = next(c for c in REGISTRY if c.id == "ggml.attn.flash")
    decode = candidate_inputs(sessions["llama-f32-flash"], "native", OpKey.parse("2:decode:1:sdpa"), None)
    assert flash.unavailable(decode) is None
    assert flash.unavailable(replace(decode, kv_cells=512)) == (
        "a one-row call over 512 cache cells (>= 512) splits the cells across llama.cpp's threads and merges the parts, "
        "which this candidate does not model"
    )
