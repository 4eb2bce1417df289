"""Every candidate contract, run on real captured inputs: whose bits it gives back, exactly.

One case per registry entry (a new contract adds its entry and its case): which pair, which op,
and what the candidate reproduces from the native's own inputs -- the native's captured bits,
the oracle's route on the same inputs, both (the engines agree there), neither, or why it
cannot run. The ggml cases run on real llama.cpp captures; they are what makes "the native ran
ggml.rms_norm" a measurement rather than a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.diagnosis.candidates import (
    candidate_inputs,
    compare_bits,
    record_bits,
    run_candidate,
)
from backends.diagnosis.classify import classify
from backends.diagnosis.registry import REGISTRY
from backends.rerun.segment import ExactDistance, RerunSession, closer_to_exact
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
    assert result.vs_native is not None and (result.vs_oracle_route is None) == candidate.of_route
    native, oracle = result.vs_native.bit_exact, result.vs_oracle_route is not None and result.vs_oracle_route.bit_exact
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


def _flash_run(llama_tiny_pairs: dict, tmp_path: Path, prompt: int, decode_steps: int = 0) -> Path:
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.llama_recorder import LlamaSettings
    from backends.recorders.record_schedule import TokenSchedule

    out = tmp_path / f"flash{prompt}.h5"
    gguf = llama_tiny_pairs["f32"][0].parent / "tiny.f32.gguf"
    schedule = TokenSchedule(tuple((i * 7) % 90 + 1 for i in range(prompt)), decode_steps=decode_steps)
    run_to_end(iter_record_llama(gguf, schedule, out, LlamaSettings(flash_attn=True)))
    return out


def _layer0_attention(path: Path, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Layer 0's q [heads, rows, dim] at `step`, the keys and values of every step up to it
    [kv_heads, cells, dim], llama.cpp's output [rows, heads*dim] and the cells its call covered."""
    with open_capture(path, check_in_child=False) as capture:
        def at(name: str, upto: int, last: bool = True) -> np.ndarray:
            found = [r for r in capture.records if r.layer == 0 and r.step == upto and r.name == name]
            return capture.read_values(found[-1 if last else 0]).astype(np.float32)

        q = at("Qcur-0", step).transpose(1, 0, 2)
        k = np.concatenate([at("Kcur-0", s) for s in range(step + 1)]).transpose(1, 0, 2)
        v = np.concatenate([at("Vcur-0", s, last=False) for s in range(step + 1)])
        out = at("kqv_out-0", step)
        kqv = next(r for r in capture.records if r.layer == 0 and r.step == step and r.name == "kqv_out-0")
        cells = int(capture.dispatch[capture.dispatch["index_seq"] == kqv.seq]["kv_len"][0])
    return q, k, v.reshape(v.shape[0], k.shape[0], -1).transpose(1, 0, 2), out, cells


def _bits(attention: np.ndarray) -> np.ndarray:
    return attention.transpose(1, 0, 2).reshape(attention.shape[1], -1).view(np.uint32)


def test_flash_attention_from_64_query_rows_is_the_tiled_kernel_bit_for_bit(llama_tiny_pairs: dict, tmp_path: Path) -> None:
    """A 70-row prefill takes ggml's tiled kernel (q in float32, 64-cell tiles). Its first 63
    rows, as a call of their own, would take the one-row kernel, whose arithmetic misses them:
    the two paths are told apart."""
    from backends.kernels import ggml_cpu

    q, k, v, out, _ = _layer0_attention(_flash_run(llama_tiny_pairs, tmp_path, 70), 0)
    tiled = ggml_cpu.flash_attention(q, k, v, scale=32**-0.5, causal=True)
    one_row = ggml_cpu.flash_attention(q[:, :63], k[:, :63], v[:, :63], scale=32**-0.5, causal=True)
    assert np.array_equal(_bits(tiled), out.view(np.uint32))
    assert not np.array_equal(_bits(one_row), out[:63].view(np.uint32))


def test_a_decode_step_over_512_cells_is_split_across_the_threads_and_merged_bit_for_bit(llama_tiny_pairs: dict, tmp_path: Path) -> None:
    """300 prompt tokens fill more than 256 cells, so llama.cpp attends over 512 (its dispatch
    event says so) and splits them between its 2 threads; one pass over all cells misses."""
    from backends.kernels import ggml_cpu

    path = _flash_run(llama_tiny_pairs, tmp_path, 300, decode_steps=1)
    q, k, v, out, cells = _layer0_attention(path, 1)
    with open_capture(path, check_in_child=False) as capture:
        assert (cells, capture.meta.provenance["threads"]) == (512, 2)
    split = ggml_cpu.flash_attention(q, k, v, scale=32**-0.5, causal=True, cells=cells, threads=2)
    whole = ggml_cpu.flash_attention(q, k, v, scale=32**-0.5, causal=True)
    assert np.array_equal(_bits(split), out.view(np.uint32))
    assert not np.array_equal(_bits(whole), out.view(np.uint32))


def test_a_split_decode_whose_thread_count_is_unknown_is_not_run_and_says_why(sessions: dict[str, RerunSession]) -> None:
    flash = next(c for c in REGISTRY if c.id == "ggml.attn.flash")
    decode = candidate_inputs(sessions["llama-f32-flash"], "native", OpKey.parse("2:decode:1:sdpa"), None)
    assert (decode.kv_cells, decode.threads) == (256, 2) and flash.unavailable(decode) is None
    assert flash.unavailable(replace(decode, kv_cells=512, threads=None)) == (
        "a one-row call over 512 cache cells splits them across llama.cpp's threads, and the capture does not say how many "
        "(provenance `threads`)"
    )


def test_a_batched_flash_call_chooses_its_kernel_by_the_rows_of_each_request(llama_tiny_pairs: dict, tmp_path: Path) -> None:
    """Two requests of 40 prompt tokens make a call of 80 rows, but llama.cpp gives each request
    its own KV stream and chooses the flash kernel per stream: 40 rows, the one-row kernel. Taken
    as one stream, 80 rows would be the tiled kernel, which misses."""
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.llama_recorder import LlamaSettings
    from backends.recorders.record_schedule import TokenSchedule

    gguf = llama_tiny_pairs["f32"][0].parent / "tiny.f32.gguf"
    schedule = TokenSchedule(tuple((i * 7) % 90 + 1 for i in range(40)))
    batched, alone = tmp_path / "batched.h5", tmp_path / "alone.h5"
    run_to_end(iter_record_llama(gguf, schedule, batched, LlamaSettings(flash_attn=True), batch=2))
    run_to_end(iter_record_llama(gguf, schedule, alone, LlamaSettings(flash_attn=True)))
    flash = next(c for c in REGISTRY if c.id == "ggml.attn.flash")
    key = OpKey.parse("0:prefill:1:sdpa")
    with open_capture(batched) as native, open_capture(alone) as oracle:
        session = RerunSession(native, oracle, run_to_end(iter_compare_cached(native, oracle)))
        inputs = candidate_inputs(session, "native", key, None)
        native_bits = record_bits(session.captured["native"], key)
        assert (inputs.call_rows, inputs.streams) == (80, 2)
        per_stream = run_candidate(flash, inputs, native_bits).vs_native
        one_stream = run_candidate(flash, replace(inputs, streams=1), native_bits).vs_native
    assert per_stream is not None and per_stream.bit_exact
    assert one_stream is not None and not one_stream.bit_exact


def test_an_infinity_or_a_nan_of_other_bits_is_named_in_reports_words_not_read_as_nmse_0() -> None:
    """+Inf against 1.0 read "1 of 4 differ, max 16,384 ULP, NMSE 0" where `report` says "an
    infinity against another value"; two NaNs of other bits read "differ, NMSE 0"."""
    ones = np.full(4, 0x3F80, np.uint16)
    infinity = ones.copy()
    infinity[0] = 0x7F80
    assert compare_bits(infinity, ones, "bfloat16").text() == "1 of 4 differ, each an infinity against another value"
    infinity[1] = 0x3F81
    both = compare_bits(infinity, ones, "bfloat16")
    assert both.inf_mismatch == 1 and both.text().startswith("2 of 4 differ (1 an infinity against another value), max ")
    assert both.short().startswith("2 differ · 1 Inf · max ")
    payloads = compare_bits(np.full(4, 0x7FC1, np.uint16), np.full(4, 0x7FC0, np.uint16), "bfloat16")
    assert payloads.text() == "4 of 4 differ, each a NaN against a NaN of other bits (no ULP distance)"
    assert payloads.short() == "4 NaN payload"


def test_a_nan_against_a_number_is_named_never_shown_as_zero_ulp_and_ranks_behind_a_finite_difference() -> None:
    numbers = np.array([0x3F80, 0x4000, 0x3F80, 0x4000], np.uint16)
    all_nan = compare_bits(np.full(4, 0x7FC0, np.uint16), numbers, "bfloat16")
    assert (all_nan.text(), all_nan.short()) == ("4 of 4 differ, each a NaN against a number (no ULP distance)", "4 NaN vs number")
    one_nan = numbers.copy()
    one_nan[0], one_nan[1] = 0x7FC0, 0x4001
    mixed = compare_bits(one_nan, numbers, "bfloat16")
    assert mixed.short() == "2 differ · 1 NaN vs number · max 1 ULP"
    far = numbers.copy()
    far[:2] = (0x4100, 0x4200)
    finite = compare_bits(far, numbers, "bfloat16")
    assert finite.closeness() < mixed.closeness() and finite.max_ulp is not None and finite.max_ulp > 1


def test_with_no_finite_element_to_measure_neither_side_is_said_to_be_closer_to_exact() -> None:
    """Two all-NaN outputs have a NaN distance to the float64 reference each; NaN compares false
    both ways, and the verdict said "the oracle's route is closer to exact"."""
    nothing, near, far = ExactDistance(math.nan, math.nan, 0.0), ExactDistance(1e-6, 1e-6, 0.9), ExactDistance(1e-3, 1e-3, 0.1)
    assert closer_to_exact(nothing, nothing, "oracle's route") == "unknown"
    assert closer_to_exact(near, nothing, "oracle") == "unknown" and closer_to_exact(nothing, near, "oracle") == "unknown"
    assert closer_to_exact(near, far, "oracle's route") == "native" and closer_to_exact(far, near, "oracle's route") == "oracle's route"
    assert closer_to_exact(near, near, "oracle") == "tie"
