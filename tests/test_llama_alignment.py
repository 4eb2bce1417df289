"""Alignment across real engines: a llama.cpp capture against an MLX capture of the same weights."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from backends.demo.llama_pairs import demo_weights_f32  # noqa: E402
from backends.engines.gguf_export import (  # noqa: E402
    export_gguf,
    gguf_to_hf_names,
    read_gguf_weights,
    write_mlx_model_dir,
)
from backends.recorders.llama_process import iter_record_llama  # noqa: E402
from backends.recorders.llama_recorder import LlamaSettings  # noqa: E402
from backends.recorders.mlx_recorder import iter_record_mlx  # noqa: E402
from backends.recorders.record_schedule import TokenSchedule  # noqa: E402
from sessions.capture.opening import open_capture  # noqa: E402
from sessions.compare.align import Alignment, align  # noqa: E402
from sessions.compare.align_modes import CALLS  # noqa: E402
from sessions.compare.comparison import iter_compare  # noqa: E402
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import (  # noqa: E402
    BUILTIN_DIR,
    BUILTIN_FILES,
    ProfileError,
    builtin_profiles,
    profile_from_dict,
)
from sessions.compare.record_sources import record_sources, sources_for  # noqa: E402
from sessions.compare.unaligned import CUT_DIFFERENTLY, ONE_SIDED, PADDED_DIFFERENTLY  # noqa: E402
from sessions.compare.verdict import Kind  # noqa: E402
from sessions.progress import run_to_end  # noqa: E402
from tests.test_llama_recorder import TINY  # noqa: E402
from viewer.cli import main  # noqa: E402

LAYER_STAGES = {
    "attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "k_cache", "v_cache", "sdpa", "o_proj",
    "attn_residual", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down", "layer_out",
}
SCHEDULE = TokenSchedule((5, 17, 3, 88, 41, 9), decode_steps=1)


def _drain(work):  # type: ignore[no-untyped-def]
    for _ in work:
        pass


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One tiny model's weights as a GGUF for llama.cpp and as an MLX model folder."""
    directory = tmp_path_factory.mktemp("models")
    weights = demo_weights_f32(TINY, 11)
    gguf = export_gguf(TINY.as_dict(), weights, directory / "tiny.f32.gguf", "f32")
    held = gguf_to_hf_names(read_gguf_weights(gguf), list(weights), TINY.num_hidden_layers)
    return gguf, write_mlx_model_dir(TINY.as_dict(), held, directory / "mlx")


def _record_pair(models: tuple[Path, Path], schedule: TokenSchedule, directory: Path) -> tuple[Path, Path]:
    native, oracle = directory / "native.h5", directory / "oracle.h5"
    _drain(iter_record_llama(models[0], schedule, native))
    _drain(iter_record_mlx(models[1], schedule, oracle))
    return native, oracle


@pytest.fixture(scope="module")
def pair(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _record_pair(models, SCHEDULE, tmp_path_factory.mktemp("pair"))


def _align(pair: tuple[Path, Path], with_sources: bool = True) -> Alignment:
    profiles = builtin_profiles()
    with open_capture(pair[0], check_in_child=False) as native, open_capture(pair[1], check_in_child=False) as oracle:
        sources = sources_for(native, profiles["llama.cpp"]) if with_sources else None
        return align(native.records, oracle.records, profiles["llama.cpp"], profiles["mlx-lm"], native_sources=sources)


def test_every_layer_stage_both_engines_compute_is_aligned(pair: tuple[Path, Path]) -> None:
    alignment = _align(pair)
    for step, segment in ((0, "prefill"), (1, "decode")):
        for layer in range(TINY.num_hidden_layers):
            ops = {p.key.op for p in alignment.pairs if (p.key.step, p.key.segment, p.key.layer) == (step, segment, layer)}
            assert ops == LAYER_STAGES, (step, layer, LAYER_STAGES - ops)
        outer = {p.key.op for p in alignment.pairs if p.key.step == step and p.key.layer == -1}
        assert outer == {"embed", "final_norm", "logits"}
    assert [u for u in alignment.unaligned if u.side == "oracle"] == []


def test_a_one_token_prompt_aligns_every_layer_stage_by_calls_as_a_longer_one_does(models: tuple[Path, Path], tmp_path: Path) -> None:
    alignment = _align(_record_pair(models, TokenSchedule((5,), decode_steps=1), tmp_path))
    assert alignment.mode == CALLS
    for step in (0, 1):
        for layer in range(TINY.num_hidden_layers):
            ops = {p.key.op for p in alignment.pairs if (p.key.step, p.key.layer) == (step, layer)}
            assert ops == LAYER_STAGES, (step, layer, LAYER_STAGES - ops)
    embed = next(p for p in alignment.pairs if p.key.op == "embed")
    assert embed.native.record.shape == embed.native.shape == embed.oracle.shape == (1, TINY.hidden_size)
    assert [u for u in alignment.unaligned if u.side == "oracle"] == []


def test_records_only_llama_cpp_has_are_listed_one_sided_with_their_reason(pair: tuple[Path, Path]) -> None:
    alignment = _align(pair)
    assert {u.reason for u in alignment.unaligned} == {ONE_SIDED}
    by_name = {(u.step, u.name, u.occurrence): u for u in alignment.unaligned}
    assert by_name[(0, "kq-0", 0)].detail.startswith("attention scores")
    assert by_name[(0, "kq_soft_max-1", 0)].detail.startswith("attention probabilities")
    assert by_name[(0, "Qcur-0", 1)].detail.startswith("per-head view")
    norms = [by_name[(0, "norm-1", i)] for i in range(4)]
    assert [u.detail.split(" norm")[0] for u in norms] == ["attention", "Q", "K", "FFN"]
    assert [u.key.op if u.key else None for u in norms] == ["attn_rms", "q_rms", "k_rms", "ffn_rms"]


def test_a_llama_cpp_capture_against_itself_compares_every_stage_that_computes(pair: tuple[Path, Path]) -> None:
    """Against another llama.cpp capture, the stages MLX fuses pair too: each RMSNorm before its
    weight multiply, the scores, the probabilities and the per-head attention output, each once
    per layer and step. What stays one-sided is ggml's layout bookkeeping (views, reshapes,
    permutations), whose bits are their source's."""
    with open_capture(pair[0], check_in_child=False) as native:
        llama = builtin_profiles()["llama.cpp"]
        alignment = align(native.records, native.records, llama, llama, native_sources=record_sources(native), oracle_sources=record_sources(native))
    stages = ("attn_rms", "q_rms", "k_rms", "ffn_rms", "attn_scores", "attn_probs", "attn_pv")
    steps = SCHEDULE.decode_steps + 1
    counts = Counter(p.key.op for p in alignment.pairs if p.key.op in (*stages, "final_rms"))
    assert {p.key.occurrence for p in alignment.pairs if p.key.op in stages} == {0}, "each stage is occurrence 0, whichever norm-N it was"
    assert counts == {**{op: steps * TINY.num_hidden_layers for op in stages}, "final_rms": steps}
    kept_apart = {u.detail.split(":")[0] for u in alignment.unaligned}
    assert kept_apart == {
        "per-head view [rows, heads, dim] of the Q projection", "per-head view [rows, heads, dim] of the K projection",
        "per-head view [rows, heads, dim] of the V projection", "a ggml view of another node (same bits as its source)",
        "a ggml permutation of another node (same values as its source)", "a ggml reshape of another node (same bits as its source)",
    }


def test_qcur_stages_map_by_op_and_the_unnamed_projection_by_its_weight(pair: tuple[Path, Path]) -> None:
    alignment = _align(pair)
    stages = {(p.native.record.name, p.native.record.kernel_id): p.key.op for p in alignment.pairs if p.key.step == 0 and p.key.layer == 1}
    assert stages[("Qcur-1", "MUL_MAT")] == "q_proj"
    assert stages[("Qcur-1", "ROPE")] == "q_rope"
    assert stages[("Qcur_normed-1", "MUL")] == "q_norm"
    (projection,) = [name for (name, _), op in stages.items() if op == "o_proj"]
    assert projection.startswith("node_")
    with open_capture(pair[0], check_in_child=False) as native:
        sources = record_sources(native)
        seq = next(r.seq for r in native.records if r.name == projection and r.step == 0)
        assert sources[seq] == ("blk.1.attn_output.weight", "kqv_out-1")
    anchored = {(p.key, p.native.record.seq) for p in alignment.pairs if p.key.op == "o_proj"}
    assert len(anchored) == 2 * TINY.num_hidden_layers
    without_sources = {(p.key, p.native.record.seq) for p in _align(pair, with_sources=False).pairs if p.key.op == "o_proj"}
    assert without_sources == anchored


def test_layouts_bring_both_engines_to_one_canonical_shape(pair: tuple[Path, Path]) -> None:
    rows = len(SCHEDULE.prompt)
    shapes = {p.key.op: (p.native.record.shape, p.oracle.record.shape, p.native.shape) for p in _align(pair).pairs if p.key.step == 0 and p.key.layer == 0}
    assert shapes["q_rope"] == ((rows, 4, 32), (1, 4, rows, 32), (4, rows, 32))
    assert shapes["q_norm"] == ((rows, 4, 32), (1, rows, 4, 32), (4, rows, 32))
    assert shapes["sdpa"] == ((rows, 128), (1, 4, rows, 32), (rows, 128))


def test_the_engines_agree_on_the_embedding_and_part_at_the_first_rms_norm(pair: tuple[Path, Path]) -> None:
    """ggml sums the squares in double and scales by 1/sqrtf; MLX's CPU RMSNorm stays in float32."""
    first = {p.key.op: p for p in _align(pair).pairs if p.key.step == 0 and p.key.layer in (-1, 0)}
    with open_capture(pair[0], check_in_child=False) as native, open_capture(pair[1], check_in_child=False) as oracle:
        def bits(op: str) -> tuple[np.ndarray, np.ndarray]:
            return first[op].native.canonical(native.read_bits(first[op].native.record)), first[op].oracle.canonical(oracle.read_bits(first[op].oracle.record))

        embed_n, embed_o = bits("embed")
        norm_n, norm_o = bits("attn_norm")
    assert embed_n.tobytes() == embed_o.tobytes()
    assert norm_n.tobytes() != norm_o.tobytes()


def test_profile_rules_check_kernel_source_and_one_sided_keys() -> None:
    profile = profile_from_dict({"name": "p", "rule": [
        {"name": "node_{n}", "kernel": "MUL_MAT", "source": "blk.{layer}.w", "op": "o_proj"},
        {"name": "x-{layer}", "one_sided": "only here"},
    ]}, "p.toml")
    match = profile.match("node_7", 0, 1, "MUL_MAT", ("a", "blk.3.w"))
    assert match is not None and (match.op, match.layer) == ("o_proj", 3)
    assert profile.match("node_7", 0, 1, "ADD", ("blk.3.w",)) is None
    assert profile.match("node_7", 0, 1, "MUL_MAT", ()) is None
    assert profile.match("node_7", 0, 1, "MUL_MAT", ("blk.3.x",)) is None
    one = profile.match("x-2", 0, 1)
    assert one is not None and one.one_sided == "only here" and profile.uses_sources
    optional = profile_from_dict({"name": "p", "rule": [{"name": "x", "op": "k_cache", "one_sided": "why"}]}, "p.toml").match("x", 0, 1)
    assert optional is not None and (optional.op, optional.one_sided) == ("k_cache", "why")
    with pytest.raises(ProfileError, match="a one_sided rule without an op takes no layout"):
        profile_from_dict({"name": "p", "rule": [{"name": "x", "layout": "a b -> b a", "one_sided": "why"}]}, "p.toml")


def test_two_llama_cpp_runs_cut_differently_compare_the_kv_cache_cells_each_step_wrote(pair: tuple[Path, Path], models: tuple[Path, Path], tmp_path: Path) -> None:
    """The cells pair by position whatever the micro-batches (6 prompt tokens in one call against
    calls of 4 and 2), bit for bit."""
    cut = tmp_path / "ubatch4.h5"
    _drain(iter_record_llama(models[0], dataclasses.replace(SCHEDULE, ubatch=4), cut))
    with open_capture(pair[0], check_in_child=False) as native, open_capture(cut, check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions()))
    cells = sorted((p.key.op, p.key.layer, p.key.step, p.key.positions) for p in comparison.pairs if p.key.op.endswith("_cache"))
    assert cells == sorted(
        (op, layer, step, positions)
        for op in ("k_cache", "v_cache")
        for layer in range(TINY.num_hidden_layers)
        for step, positions in ((0, (0, 4)), (0, (4, 6)), (1, (6, 7)))
    )
    k_cache = next(p for p in comparison.pairs if p.key.op == "k_cache" and p.key.positions == (4, 6))
    assert (k_cache.native_name, k_cache.native_window, k_cache.metrics.shape) == ("cache_k_l0 (view) (written)", (4, 6), [2, 64])
    assert all(p.metrics.bit_exact for p in comparison.pairs if p.key.op.endswith("_cache"))
    probabilities = sorted((p.key.layer, p.key.positions, tuple(p.metrics.shape)) for p in comparison.pairs if p.key.op == "attn_probs" and p.key.step == 0)
    assert probabilities == [(layer, positions, (4, rows, 256)) for layer in (0, 1) for positions, rows in (((0, 4), 4), ((4, 6), 2))]
    assert all(p.metrics.bit_exact for p in comparison.pairs if p.key.op == "attn_probs")


def test_probabilities_over_caches_padded_differently_are_set_aside_and_the_runs_stay_at_parity(pair: tuple[Path, Path], models: tuple[Path, Path], tmp_path: Path) -> None:
    """300 prompt tokens in one call pad the cache to 512 cells; cut at 256 the first call's cache
    has 256. Those scores and probabilities cannot be compared cell by cell, which is no
    divergence: the attention output they feed is, and every op agrees bit for bit. The second
    call's scores hold cells the one-call run had written and the cut run had not yet: set aside
    as cut differently, while the probabilities after the mask are compared."""
    prompt = tuple((i * 7 + 3) % TINY.vocab_size for i in range(300))
    schedule = TokenSchedule(prompt, decode_steps=1)
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    gguf = models[0]
    _drain(iter_record_llama(gguf, schedule, whole))
    _drain(iter_record_llama(gguf, dataclasses.replace(schedule, ubatch=256), cut))
    with open_capture(whole, check_in_child=False) as native, open_capture(cut, check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions()))
    assert comparison.verdict.word == "PARITY"
    padded = [u for u in comparison.unaligned if u.reason == PADDED_DIFFERENTLY]
    assert sorted((u.side, u.layer, u.key.op, u.key.positions) for u in padded if u.key) == [
        (side, layer, op, (0, 256)) for side in ("native", "oracle") for layer in range(TINY.num_hidden_layers) for op in ("attn_probs", "attn_scores")
    ]
    assert len(padded) == 2 * 2 * TINY.num_hidden_layers and "padded to 512 and 256 cells" in padded[0].detail
    assert [u for u in comparison.unaligned if u.reason == CUT_DIFFERENTLY] == [], "both second calls end at 300, so their scores saw the same cells"
    compared = {p.key.text() for p in comparison.pairs if p.key.op in ("attn_scores", "attn_probs") and p.key.layer == 0}
    assert compared == {f"{call}:0:{op}@{rows}" for op in ("attn_scores", "attn_probs") for call, rows in (("0:prefill", "256-299"), ("1:decode", "300"))}


def test_scores_from_micro_batches_that_had_written_different_cells_are_set_aside_and_the_rest_compared(pair: tuple[Path, Path], models: tuple[Path, Path], tmp_path: Path) -> None:
    """Six tokens in one micro-batch against three of two: the first two micro-batches' scores
    cover cells the one-call run had written and they had not (the mask hides them), so they are
    `cut_differently`; the last micro-batch and the decode steps saw the same cells and compare."""
    cut = tmp_path / "ubatch2.h5"
    _drain(iter_record_llama(models[0], dataclasses.replace(SCHEDULE, ubatch=2), cut))
    with open_capture(pair[0], check_in_child=False) as native, open_capture(cut, check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions()))
    assert comparison.verdict.word == "PARITY" and comparison.alignment.mode == "positions"
    set_aside = sorted((u.side, u.key.text()) for u in comparison.unaligned if u.reason == CUT_DIFFERENTLY and u.key and u.key.layer == 0)
    assert set_aside == [(side, f"0:prefill:0:attn_scores@{rows}") for side in ("native", "oracle") for rows in ("0-1", "2-3")]
    detail = next(u.detail for u in comparison.unaligned if u.reason == CUT_DIFFERENTLY)
    assert "written the cache up to position 6 (native) and 2 (oracle)" in detail
    compared = sorted(p.key.text() for p in comparison.pairs if p.key.op == "attn_scores" and p.key.layer == 0)
    assert compared == ["0:prefill:0:attn_scores@4-5", "1:decode:0:attn_scores@6"]


def test_an_f16_cache_against_an_f32_one_is_a_dtype_mismatch_and_parts_first_at_the_attention_scores(
    pair: tuple[Path, Path], models: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp's F16 cache rounds the keys it stores; the scores read the rounded keys, so the
    first thing that differs is K^T Q, every norm before it agreeing (each RMSNorm and its
    weight multiply compared apart), and the cells themselves are named as stored in another
    dtype rather than compared."""
    f16 = tmp_path / "f16.h5"
    _drain(iter_record_llama(models[0], SCHEDULE, f16, LlamaSettings(kv_type="f16")))
    with open_capture(pair[0], check_in_child=False) as native, open_capture(f16, check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions()))
    assert comparison.verdict.first is not None
    first = comparison.verdict.first.key
    assert (first.step, first.layer, first.op, comparison.verdict.first.kind) == (0, 0, "attn_scores", Kind.DIVERGED)
    scores = next(p for p in comparison.pairs if p.key == first)
    before = [p for p in comparison.pairs if (p.key.step, p.key.layer) == (0, 0) and p.native_seq < scores.native_seq]
    assert {"attn_rms", "attn_norm", "q_rms", "q_norm", "k_rms", "k_norm"} <= {p.key.op for p in before}
    assert all(p.metrics.bit_exact for p in before)
    mismatched = sorted((u.name, u.detail) for u in comparison.unaligned if (u.step, u.layer, u.side, u.reason) == (0, 0, "native", "dtype_mismatch"))
    detail = "native float32 vs oracle float16"
    assert mismatched == [("cache_k_l0 (view) (written)", detail), ("cache_v_l0 (reshaped) (view) (written)", detail)]
    assert main(["report", str(pair[0]), str(f16)]) == 1
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("DIVERGENCE: first diverged at 0:prefill:0:attn_scores")
    hint = "(a stage of 0:prefill:0:sdpa: rerun --op 0:prefill:0:sdpa, diagnose --op 0:prefill:0:sdpa)"
    assert [line for line in text if line.startswith("First finding:")] == [f"First finding: diverged at 0:prefill:0:attn_scores  {hint}"]


def test_the_cache_cells_llama_cpp_wrote_pair_with_those_mlx_lm_wrote_and_equal_their_k_rope_and_v_proj(pair: tuple[Path, Path]) -> None:
    """Each engine's cache holds its own post-RoPE keys and projected values, bit for bit, so
    both sides' cells are what their k_rope and v_proj say; against a capture that records no
    cache (the demo oracle) the cells are one-sided."""
    alignment = _align(pair)
    with open_capture(pair[0], check_in_child=False) as native, open_capture(pair[1], check_in_child=False) as oracle:
        for step in (0, 1):
            by_op = {p.key.op: p for p in alignment.pairs if (p.key.step, p.key.layer) == (step, 1)}
            for side, capture in (("native", native), ("oracle", oracle)):
                keys, rope = (getattr(by_op[op], side).canonical(capture.read_bits(getattr(by_op[op], side).record)) for op in ("k_cache", "k_rope"))
                assert keys.shape == (rope.shape[1], rope.shape[0] * rope.shape[2])
                assert keys.tobytes() == np.ascontiguousarray(rope.transpose(1, 0, 2)).tobytes()
                values, projected = (getattr(by_op[op], side).canonical(capture.read_bits(getattr(by_op[op], side).record)) for op in ("v_cache", "v_proj"))
                assert values.tobytes() == projected.tobytes()
    with open_capture(pair[0], check_in_child=False) as native:
        no_cache = [r for r in native.records if not r.name.startswith("cache_")]
        llama = builtin_profiles()["llama.cpp"]
        unaligned = align(native.records, no_cache, llama, llama).unaligned
    written = {(u.key.op if u.key else None, u.reason, u.detail) for u in unaligned if u.name.endswith("(written)")}
    reason = "KV-cache cells written this step: the other capture records no KV cache"
    assert written == {("k_cache", ONE_SIDED, reason), ("v_cache", ONE_SIDED, reason)}


def test_flash_attention_on_and_off_store_the_same_cache_cells_and_part_at_the_attention(pair: tuple[Path, Path], models: tuple[Path, Path], tmp_path: Path) -> None:
    """Flash attention stores V untransposed, the other path transposed: both come out as the
    cells each token wrote, so the first layer's cache compares bit for bit and the first finding
    is the attention itself, where the two paths run different kernels."""
    flash = tmp_path / "flash.h5"
    _drain(iter_record_llama(models[0], SCHEDULE, flash, LlamaSettings(flash_attn=True)))
    with open_capture(pair[0], check_in_child=False) as native, open_capture(flash, check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions()))
    verdicts = {p.label: p.verdict for p in comparison.pairs if p.key.layer == 0 and p.key.op.endswith("_cache")}
    assert verdicts == {f"step {s} {segment} layer 0 {op}": "bit-exact" for s, segment in ((0, "prefill"), (1, "decode")) for op in ("k_cache", "v_cache")}
    assert comparison.verdict.first is not None
    first = comparison.verdict.first.key
    assert (first.step, first.layer, first.op, comparison.verdict.first.kind) == (0, 0, "sdpa", Kind.CONTRACT_MISMATCH)
    assert comparison.verdict.first.detail == "kernel or contract differs: kernel_id: native 'CONT' vs oracle 'RESHAPE'"


def test_the_comparison_of_a_real_capture_anchors_every_output_projection_by_its_weight(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A profile without the sourceless fallback still pairs o_proj in every layer and step: the
    comparison reads the nodes' sources and the weight-anchored rule places them."""
    builtin = (BUILTIN_DIR / BUILTIN_FILES["llama.cpp"]).read_text(encoding="utf-8")
    fallback = '[[rule]]\nname = "node_{n}"\nkernel = "MUL_MAT"\nwithout_sources = true\nop = "o_proj"\n'
    assert builtin.count(fallback) == 1
    strict = tmp_path / "llama_strict.toml"
    strict.write_text(builtin.replace(fallback, ""), encoding="utf-8")
    options = CompareOptions(native_profile=str(strict), oracle_profile="mlx-lm")
    with open_capture(pair[0], check_in_child=False) as native, open_capture(pair[1], check_in_child=False) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, options))
        sources = record_sources(native)
    projections = [p for p in comparison.pairs if p.key.op == "o_proj"]
    assert sorted((p.key.step, p.key.layer) for p in projections) == [(s, layer) for s in (0, 1) for layer in range(TINY.num_hidden_layers)]
    for p in projections:
        assert p.native_name.startswith("node_") and f"blk.{p.key.layer}.attn_output.weight" in sources[p.native_seq]
    assert [u for u in comparison.unaligned + comparison.post_eos_unaligned if u.reason != ONE_SIDED] == []


def test_only_records_whose_mapping_depends_on_sources_have_them_read(pair: tuple[Path, Path]) -> None:
    with open_capture(pair[0], check_in_child=False) as native:
        read = sources_for(native, builtin_profiles()["llama.cpp"])
        expected = {
            r.seq for r in native.records
            if (r.kernel_id == "RMS_NORM" and r.name.startswith("norm-")) or (r.kernel_id == "MUL_MAT" and r.name.startswith("node_"))
        }
        assert set(read) == expected and 0 < len(read) < len(native.records) // 4
        assert sources_for(native, builtin_profiles()["mlx-lm"]) == {}

