"""Reruns of the demo captures: oracle bits come back exactly, and the native's route explains
each scenario's difference. Real captures from the demo engines, real MLX, real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.rerun.capture_out import save_rerun
from backends.rerun.segment import (
    RerunOptions,
    iter_rerun,
    rerun_target,
    rerunnable_keys,
)
from sessions.capture.opening import open_capture
from sessions.compare.align import align
from sessions.compare.comparison import iter_compare
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import builtin_profiles
from sessions.progress import Progress, run_to_end

pytestmark = pytest.mark.slow

SINGLE_OPS = [
    "0:text-after:0:attn_norm", "0:text-after:0:q_proj", "0:text-after:0:q_norm", "0:text-after:0:q_rope",
    "0:text-after:0:k_rope", "0:text-after:0:sdpa", "0:text-after:1:o_proj", "0:text-after:1:attn_residual",
    "0:text-after:1:ffn_norm", "0:text-after:1:ffn_act", "0:text-after:1:ffn_down", "0:text-after:1:layer_out",
    "2:decode:1:sdpa", "2:decode:0:q_rope", "0:visual:0:sdpa", "0:visual:-1:final_norm", "0:visual:-1:logits",
]


def _rerun(pair: tuple[Path, Path], key: str, **options: object):
    with open_capture(pair[0]) as native, open_capture(pair[1]) as oracle:
        return run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target(key), RerunOptions(**options)))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", SINGLE_OPS)
def test_rerunning_an_oracle_record_on_cpu_reproduces_its_bits(demo_pairs: dict, key: str) -> None:
    result = _rerun(demo_pairs["clean"], key)
    (op,) = result.ops
    assert op.three_way["rerun vs oracle"] is not None and op.three_way["rerun vs oracle"].bit_exact
    assert result.device == "cpu"
    assert any("decomposed fallback" in note for note in result.notes) == (op.key.op == "sdpa"), "the attention note is for attention alone"


def test_the_tiled_oracle_attention_is_reproduced_from_its_effective_contract(demo_pairs: dict) -> None:
    result = _rerun(demo_pairs["attention-contract"], "0:visual:1:sdpa")
    assert result.routes.attention == "attn.f32.tiled64x64"
    assert result.reproduces("oracle") and not result.reproduces("native")


def test_attention_contract_oracle_inputs_on_the_native_route_give_the_native_bits(demo_pairs: dict) -> None:
    result = _rerun(demo_pairs["attention-contract"], "0:visual:0:sdpa", source="oracle", route_from="native")
    (op,) = result.ops
    assert result.routes.attention == "attn.bf16.single_range"
    assert op.inputs_agree is True
    assert op.three_way["rerun vs native"].bit_exact  # type: ignore[union-attr]
    assert op.three_way["rerun vs oracle"].differing == op.three_way["native vs oracle"].differing > 0  # type: ignore[union-attr]
    assert op.closer == "oracle"
    assert op.exact["oracle"].rmse < op.exact["native"].rmse


def test_a_segment_whose_layer_input_agrees_says_inputs_differ_only_from_the_attention_that_reads_the_differing_cache(demo_pairs: dict) -> None:
    """At decode step 1 of attention-contract, layer 1's input agrees (layer 0 of a decode step
    ran one route on both sides) but its cache holds the visual prefill's differing keys."""
    result = _rerun(demo_pairs["attention-contract"], "1:decode:1:decoder_layer")
    agree = {op.key.op: op.inputs_agree for op in result.ops}
    assert [op for op, agrees in agree.items() if agrees] == ["attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope"]
    assert agree["sdpa"] is False and agree["layer_out"] is False
    assert all(op.three_way["native vs oracle"].bit_exact for op in result.ops if op.inputs_agree)  # type: ignore[union-attr]


def test_swiglu_order_oracle_inputs_on_the_native_order_give_the_native_bits(demo_pairs: dict) -> None:
    result = _rerun(demo_pairs["swiglu-order"], "0:text-before:0:ffn_act", route_from="native")
    (op,) = result.ops
    assert result.routes.swiglu == "mul_then_sigmoid"
    assert op.three_way["rerun vs native"].bit_exact and not op.three_way["rerun vs oracle"].bit_exact  # type: ignore[union-attr]
    assert any("provenance options" in s for s in result.route_sources)


def test_a_decoder_layer_segment_rerun_reproduces_every_oracle_op_and_carries_the_kv_history(demo_pairs: dict) -> None:
    result = _rerun(demo_pairs["clean"], "3:decode:1:decoder_layer")
    assert [op.key.op for op in result.ops][-3:] == ["ffn_act", "ffn_down", "layer_out"]
    assert len(result.ops) == 17 and result.reproduces("oracle") and result.reproduces("native")
    sdpa = next(op for op in result.ops if op.key.op == "sdpa")
    assert sdpa.calls[0].call.kv_len == 5 + 72 + 6 + 3
    rope = next(op for op in result.ops if op.key.op == "q_rope")
    assert "offset 85" in rope.route


def test_head_chunk_off_changes_the_calls_but_not_the_bits_on_cpu(demo_pairs: dict) -> None:
    on = _rerun(demo_pairs["clean"], "0:text-after:0:sdpa", head_chunk=True)
    off = _rerun(demo_pairs["clean"], "0:text-after:0:sdpa", head_chunk=False)
    assert [c.call.head_count for c in on.ops[0].calls] == [5, 1, 5, 1]
    assert len(off.ops[0].calls) == 1
    assert {c.metal_primitive for c in on.ops[0].calls} == {"sdpa_vector"} and off.ops[0].calls[0].metal_primitive == "fallback"
    assert np.array_equal(on.ops[0].bits, off.ops[0].bits)


def test_by_default_a_rerun_splits_attention_as_its_route_sides_record_did(demo_pairs: dict) -> None:
    native = _rerun(demo_pairs["head-chunk"], "0:text-after:0:sdpa", source="native")
    oracle = _rerun(demo_pairs["head-chunk"], "0:text-after:0:sdpa", source="oracle")
    assert len(native.ops[0].calls) == 1, "the native engine has no head-chunk route: it made one call, as report and diagnose say"
    assert [c.call.head_count for c in oracle.ops[0].calls] == [5, 1, 5, 1]
    assert "head-chunk off (the native record made 1 call(s))" in native.route_sources
    assert "head-chunk on (the oracle record made 4 call(s))" in oracle.route_sources


def test_a_float32_rerun_is_rounded_for_comparison_and_said_so(demo_pairs: dict) -> None:
    result = _rerun(demo_pairs["clean"], "0:visual:0:sdpa", dtype="float32")
    assert result.ops[0].computed_dtype == "float32" and result.ops[0].dtype == "bfloat16"
    assert any("Computed in float32" in note for note in result.notes)


def test_the_rerun_yields_progress_and_closing_it_cancels(demo_pairs: dict) -> None:
    with open_capture(demo_pairs["clean"][0]) as native, open_capture(demo_pairs["clean"][1]) as oracle:
        work = iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:visual:0:decoder_layer"))
        first, second = next(work), next(work)
        assert isinstance(first, Progress) and second.label.startswith("rerunning step 0 visual layer 0 attn_norm")
        work.close()


def test_a_rerun_saved_as_a_capture_opens_and_aligns_with_the_oracle(demo_pairs: dict, tmp_path: Path) -> None:
    result = _rerun(demo_pairs["head-chunk"], "0:text-after:0:attention_block")
    path = save_rerun(result, tmp_path / "rerun.h5")
    profiles = builtin_profiles()
    with open_capture(path) as rerun, open_capture(demo_pairs["head-chunk"][1]) as oracle:
        assert rerun.meta.role == "rerun" and rerun.complete
        assert rerun.meta.provenance["rerun_of"] == "0:text-after:0:attention_block"
        pairs = align(rerun.records, oracle.records, profiles["canonical"], profiles["mlx-lm"]).pairs
        assert len(pairs) == 11
        for pair in pairs:
            assert np.array_equal(
                pair.native.layout.apply(rerun.read_bits(pair.native.record)) if pair.native.layout else rerun.read_bits(pair.native.record),
                pair.oracle.layout.apply(oracle.read_bits(pair.oracle.record)),
            )
        events = rerun.dispatch
        assert len(events) == 4 and set(events["head_count"].tolist()) == {5, 1}
        assert set(events["kv_heads"].tolist()) == {2} and set(events["q_heads"].tolist()) == {12}
        assert {(r.contract_id, r.effective_contract_id) for r in rerun.records} == {("", "")}
        with open_capture(demo_pairs["head-chunk"][1]) as oracle:
            assert run_to_end(iter_compare(rerun, oracle, CompareOptions(native_profile="canonical"))).contracts.findings == []


def test_missing_inputs_are_named_with_the_layer_and_side(demo_pairs: dict, tmp_path: Path) -> None:
    from sessions.capture.writer import CaptureWriter

    native_path = tmp_path / "no-k.native.h5"
    with open_capture(demo_pairs["clean"][0]) as source, CaptureWriter(native_path, source.meta) as writer:
        for record in source.records:
            dropped = record.segment == "text-before" and record.name == "Kcur-1" and record.occurrence == 1
            if record.step == 0 and record.segment in ("text-before", "visual") and not dropped:
                writer.add_tensor(record.name, source.read_bits(record), step=0, segment=record.segment, layer=record.layer, dtype=record.dtype)
    with open_capture(native_path) as native, open_capture(demo_pairs["clean"][1]) as oracle:
        with pytest.raises(ValueError, match=r"^SDPA rerun needs q, k and v of layer 1; the native capture has no k \("):
            run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:text-before:1:sdpa"), RerunOptions(source="native")))
        with pytest.raises(ValueError, match="needs the K/V cache of layer 1 from step 0 text-before .*native capture has no k there"):
            run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:visual:1:sdpa"), RerunOptions(source="native")))
        with pytest.raises(ValueError, match="embed cannot be rerun"):
            run_to_end(iter_rerun(native, oracle, run_to_end(iter_compare(native, oracle)), rerun_target("0:text-before:-1:embed"), RerunOptions()))


def test_a_rerun_from_a_saved_rerun_that_needs_the_cache_before_it_is_refused_not_run_without_it(demo_pairs: dict, tmp_path: Path) -> None:
    """A saved rerun holds only its own call: read as a run with no calls before it, its
    visual q_rope ran at RoPE offset 0 and its sdpa over 72 cached rows instead of 77, and a
    faithful native read as "does not reproduce" (exit 1) with a float64 RMSE 240x too large."""
    saved = save_rerun(_rerun(demo_pairs["attention-contract"], "0:visual:0:attention_block", source="oracle", route_from="native"), tmp_path / "rerun.h5")
    oracle = demo_pairs["attention-contract"][1]
    made_from = f"({demo_pairs['attention-contract'][0]} and {oracle})"
    for key, asks in (("0:visual:0:q_rope", "q_rope rerun of layer 0 at step 0 visual"), ("0:visual:0:sdpa", "SDPA rerun of layer 0 at step 0 visual")):
        expected = (
            f"{asks} needs the KV cache the calls before step 0 visual left, and the native capture is a saved rerun, which "
            f"holds only the ops it recomputed; rerun from the captures it was made from {made_from}"
        )
        with pytest.raises(ValueError) as refused:
            _rerun((saved, oracle), key, source="native")
        assert str(refused.value) == expected
    with pytest.raises(ValueError) as refused:
        _rerun((saved, oracle), "0:visual:0:sdpa", source="oracle")
    assert str(refused.value) == (
        "SDPA rerun needs the K/V cache of layer 0 from step 0 text-before (earlier rows of this layer's cache); the oracle capture has "
        "k and v, but the comparison left them unpaired (not rerun: the native capture is a rerun, which holds only the ops it recomputed) there"
    ), "the oracle holds them: 'has no k and v' blamed the wrong capture"


def test_a_rerun_from_a_saved_rerun_of_the_runs_first_call_needs_no_cache_and_runs(demo_pairs: dict, tmp_path: Path) -> None:
    """Nothing came before the first call, so nothing is missing: refusing it too was a regression."""
    native, oracle = demo_pairs["attention-contract"]
    saved = save_rerun(_rerun((native, oracle), "0:text-before:0:attention_block", source="oracle", route_from="native"), tmp_path / "rerun.h5")
    for key in ("0:text-before:0:q_rope", "0:text-before:0:sdpa"):
        (op,) = _rerun((saved, oracle), key, source="native").ops
        assert op.three_way["rerun vs native"].bit_exact, key


def test_a_rerun_saved_from_relative_paths_finds_its_weights_and_captures_from_any_folder(
    demo_pairs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its provenance named them as typed, relative to a folder it was not read from."""
    from viewer.cli import main

    native, oracle = demo_pairs["swiglu-order"]
    monkeypatch.chdir(native.parent)
    saved = tmp_path / "rerun.h5"
    argv = ["rerun", native.name, oracle.name, "--op", "0:text-before:0:decoder_layer", "--from", "oracle", "--route-from", "native"]
    assert main([*argv, "--save", str(saved)]) == 0
    monkeypatch.chdir(tmp_path)
    with open_capture(saved) as rerun:
        provenance = rerun.meta.provenance
    assert (provenance["native_capture"], provenance["weights_from"]) == (str(native), [str(native.parent / "demo-qwen3-tiny.safetensors")])
    assert _rerun((saved, oracle), "0:text-before:0:o_proj", source="native").weights_from == provenance["weights_from"]


def test_a_rerun_on_the_route_of_a_saved_rerun_takes_the_route_and_weights_the_saved_rerun_took(demo_pairs: dict, tmp_path: Path) -> None:
    """A saved rerun's records declare no contract and its provenance names no model: its SwiGLU
    order was read as mlx-lm's, and its o_proj found no weights file."""
    native, oracle = demo_pairs["swiglu-order"]
    saved = save_rerun(_rerun((native, oracle), "0:text-before:0:decoder_layer", source="oracle", route_from="native"), tmp_path / "rerun.h5")
    result = _rerun((saved, oracle), "0:text-before:0:ffn_act", source="oracle", route_from="native")
    assert result.routes.swiglu == "mul_then_sigmoid"
    assert result.route_sources == ["swiglu mul_then_sigmoid (the order the native capture, a saved rerun, took)"]
    (op,) = result.ops
    assert op.three_way["rerun vs native"].bit_exact and op.three_way["rerun vs oracle"].differing == 1711
    weights = _rerun((saved, oracle), "0:text-before:0:o_proj", source="native")
    assert weights.weights_from == [str(native.parent / "demo-qwen3-tiny.safetensors")]


def test_a_saved_rerun_reports_against_its_route_side_as_the_rerun_said_where_it_was_cut(demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its other records and its tokens are by design (the rerun holds one op), and paired by
    position it pairs where it was cut, not from position 0."""
    from viewer.cli import main

    native, oracle = (str(p) for p in demo_pairs["attention-contract"])
    for align_mode, key in (("calls", "0:visual:0:sdpa"), ("positions", "0:visual:0:sdpa@5-76")):
        saved = tmp_path / f"{align_mode}.h5"
        assert main(["rerun", native, oracle, "--align", align_mode, "--op", key, "--from", "native", "--route-from", "oracle", "--save", str(saved)]) == 0
        capsys.readouterr()
        assert main(["report", str(saved), oracle, "--align", align_mode]) == 0
        text = capsys.readouterr().out
        assert text.startswith("PARITY: ") and "ops        1 aligned (1 bit-exact); 332 unaligned (all by design)" in text, text[:600]
        assert f"  {key}" not in text.split("Worst ops", 1)[1].split("\n\n", 1)[0]
        alignment = next(line for line in text.splitlines() if line.startswith("alignment  "))
        assert "cut differently" not in alignment, "a rerun holds a part of the run's calls by design"


def test_a_rerun_says_where_its_weights_came_from_and_a_named_file_leaves_the_saved_weights_hash_unknown(demo_pairs: dict, tmp_path: Path) -> None:
    native, oracle = demo_pairs["clean"]
    weights = str(native.parent / "demo-qwen3-tiny.safetensors")
    referenced = _rerun(demo_pairs["clean"], "0:visual:0:q_proj")
    named = _rerun(demo_pairs["clean"], "0:visual:0:q_proj", weights_path=weights)
    assert referenced.weights_from == named.weights_from == [weights]
    assert (referenced.weights_named, named.weights_named) == (False, True)
    assert _rerun(demo_pairs["clean"], "0:visual:0:sdpa").weights_from == []
    with open_capture(save_rerun(referenced, tmp_path / "r.h5")) as kept, open_capture(save_rerun(named, tmp_path / "n.h5")) as unknown, open_capture(oracle) as source:
        assert kept.meta.weights_hash == source.meta.weights_hash != "" and unknown.meta.weights_hash == ""
        assert unknown.meta.provenance["weights_from"] == [weights]


def test_a_segment_of_runs_paired_by_position_is_rerun_from_the_records_of_its_positions(demo_pairs: dict) -> None:
    """Segment keys carry their positions, as the comparison pairs them; they were dropped, and
    every op of the segment was "not captured" or its inputs "missing"."""
    with open_capture(demo_pairs["clean"][0]) as native, open_capture(demo_pairs["clean"][1]) as oracle:
        comparison = run_to_end(iter_compare(native, oracle, CompareOptions(alignment="positions")))
        assert rerun_target("0:text-before:1:attention_block@0-4") in rerunnable_keys(comparison)
        for key in ("0:text-before:1:attention_block@0-4", "2:decode:1:decoder_layer@84"):
            result = run_to_end(iter_rerun(native, oracle, comparison, rerun_target(key)))
            assert result.reproduces("oracle") and {op.key.positions for op in result.ops} == {rerun_target(key).positions}, key

