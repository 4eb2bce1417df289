"""`diagnose` on every demo scenario names the planted cause, and on real llama.cpp runs the contract.

Real captures from the demo engines and from llama.cpp against MLX; the assertions are the
answers a person would want: which op is local, which contract reproduces it bit for bit,
what is inherited, and how much of the final error each local op explains.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import mlx.core as mx
import numpy as np
import pytest

from backends.commands.diagnose import EXIT_EXPLAINED, EXIT_UNEXPLAINED
from backends.diagnosis.budget import Injection, NotMeasurable, Replay
from backends.diagnosis.classify import Locality, weights_differ_at
from backends.diagnosis.document import render_html, render_text
from backends.diagnosis.run import (
    DIFFERENT_WEIGHTS,
    DiagnoseOptions,
    Diagnosis,
    iter_diagnose,
)
from backends.rerun.segment import RerunSession
from backends.rerun.weights import WeightSource
from sessions.capture.opening import open_capture
from sessions.compare.align_modes import POSITIONS
from sessions.compare.key import OpKey
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import STAGE_OF
from sessions.compare.result_cache import iter_compare_cached
from sessions.progress import Progress, run_to_end
from tests.hand_captures import T, bf16_bits, write_capture
from viewer.cli import main

pytestmark = pytest.mark.slow


def diagnose(pair: tuple[Path, Path], compare: CompareOptions = CompareOptions(), **options: object) -> Diagnosis:
    with open_capture(pair[0]) as native, open_capture(pair[1]) as oracle:
        comparison = run_to_end(iter_compare_cached(native, oracle, compare))
        return run_to_end(iter_diagnose(native, oracle, comparison, DiagnoseOptions(**options)))  # type: ignore[arg-type]


def causes(diagnosis: Diagnosis) -> dict[str, str]:
    return {op.key.text(): str(op.classification.locality) for op in diagnosis.ops}


def copied(pair: tuple[Path, Path], folder: Path, weights: bool = True) -> tuple[Path, Path]:
    """A copy of a demo pair in `folder`, with its weights file or without it."""
    for source in (*pair, *([pair[0].parent / "demo-qwen3-tiny.safetensors"] if weights else [])):
        shutil.copy(source, folder)
    return folder / pair[0].name, folder / pair[1].name


def declaring(pair: tuple[Path, Path], folder: Path, record: str, segment: str, contract: str) -> tuple[Path, Path]:
    """A copy of a demo pair whose native record `record` of step 0 `segment` declares `contract`
    as its effective contract: a record that misstates what the engine ran, bits unchanged."""
    native, oracle = copied(pair, folder)
    with h5py.File(native, "r+") as file:
        index = file["index"][:]
        hit = (index["name"] == record.encode()) & (index["segment"] == segment.encode()) & (index["step"] == 0)
        assert hit.sum() == 1
        index["effective_contract_id"][hit] = contract.encode()
        file["index"][...] = index
    return native, oracle


def nudged(pair: tuple[Path, Path], folder: Path, record: str, segment: str, elements: int) -> tuple[Path, Path]:
    """A copy of a demo pair whose native bfloat16 record `record` of step 0 `segment` has its
    first `elements` values one ULP up: an op that computed differently after its output was
    used, so nothing later changes."""
    native, oracle = copied(pair, folder)
    with h5py.File(native, "r+") as file:
        (row,) = [r for r in file["index"][:] if (r["name"], r["segment"], r["step"]) == (record.encode(), segment.encode(), 0)]
        stored, start = file[row["path"].decode()], int(row["offset"])
        values = stored[start : start + 2 * elements].view(np.uint16) + np.uint16(1)
        stored[start : start + 2 * elements] = values.view(np.uint8)
    return native, oracle


def test_attention_contract_is_local_at_the_visual_sdpa_and_the_single_range_candidate_reproduces_it(demo_pairs: dict) -> None:
    found = diagnose(demo_pairs["attention-contract"])
    (op,) = found.ops
    assert op.key == OpKey(0, "visual", 0, "sdpa") and op.classification.locality == Locality.LOCAL
    assert op.native_ran == "attn.bf16.single_range" and op.oracle_ran == "attn.f32.tiled64x64"
    assert op.also_exact == ["attn.mlx_sdpa.head_chunked", "attn.mlx_sdpa.unchunked"]
    assert op.classification.inputs_agree is True and op.classification.local == op.classification.total
    assert found.verdict == (
        "0:visual:0:sdpa is local: the native ran `attn.bf16.single_range` (bit-exact reproduction), and `attn.mlx_sdpa.head_chunked`, "
        "`attn.mlx_sdpa.unchunked` give the same bits; the oracle's contract on these inputs is `attn.f32.tiled64x64`. "
        "Against the float64 reference the oracle's route is closer to exact."
    )
    assert found.notes == ["Stopped after 1 local op(s); 104 later differing op(s) were not classified (--all, or the window's scope \"Every differing op\", classifies every one)."]


def test_the_candidate_that_is_the_oracles_route_shows_the_ops_own_error_against_the_native(demo_pairs: dict) -> None:
    """The same two tensors give one NMSE wherever the diagnosis shows them: the native is measured against the other."""
    (op,) = diagnose(demo_pairs["attention-contract"]).ops
    route = next(c for c in op.candidates if c.id == op.oracle_ran)
    assert route.vs_oracle_route is None or route.vs_oracle_route.bit_exact
    assert route.vs_native == op.classification.local
    assert route.vs_native is not None and route.vs_native.nmse == pytest.approx(1.1927e-05, rel=1e-4)


def test_paired_by_position_the_attention_contract_is_named_as_paired_by_calls(demo_pairs: dict) -> None:
    (by_calls,) = diagnose(demo_pairs["attention-contract"]).ops
    (by_position,) = diagnose(demo_pairs["attention-contract"], CompareOptions(alignment=POSITIONS)).ops
    assert by_position.key == OpKey(0, "visual", 0, "sdpa", positions=(5, 77))
    assert (by_position.native_declared, by_position.native_ran) == (by_calls.native_declared, by_calls.native_ran) == (
        "attn.bf16.single_range", "attn.bf16.single_range"
    )


def test_swiglu_order_is_local_at_ffn_act_and_reproduced_by_the_natives_order(demo_pairs: dict) -> None:
    (op,) = diagnose(demo_pairs["swiglu-order"]).ops
    assert op.key == OpKey(0, "text-before", 0, "ffn_act") and op.classification.locality == Locality.LOCAL
    assert (op.native_ran, op.oracle_ran, op.also_exact) == ("swiglu.mul_then_sigmoid", "swiglu.silu_then_mul", [])
    assert op.classification.local is not None and op.classification.local.differing == 1711 and op.classification.local.max_ulp == 2


def test_a_native_that_wrote_a_nan_and_an_infinity_where_exact_arithmetic_gives_numbers_is_never_the_closer_to_exact(demo_pairs: dict, tmp_path: Path) -> None:
    """Non-finite elements were left out of the distance to the float64 reference: a native that
    wrote NaN and +Inf over two of 5,120 numbers read as closer to exact than the oracle."""
    native, oracle = copied(demo_pairs["clean"], tmp_path)
    with h5py.File(native, "r+") as file:
        (row,) = [r for r in file["index"][:] if (r["name"], r["segment"], r["step"]) == (b"ffn_swiglu-0", b"text-before", 0)]
        stored, start = file[row["path"].decode()], int(row["offset"])
        stored[start : start + 4] = np.array([0x7FC0, 0x7F80], np.uint16).view(np.uint8)
    op = diagnose((native, oracle), mode="op", key=OpKey(0, "text-before", 0, "ffn_act")).ops[0]
    assert op.classification.closer_to_exact == "oracle's route"
    assert "Against the float64 reference the native is closer to exact" not in diagnose((native, oracle)).verdict


def test_runs_of_different_weights_are_said_to_be_so_before_what_the_reruns_found(demo_pairs: dict, tmp_path: Path) -> None:
    """Each op is rerun with the native's weights, so an op whose weights differ reads as
    inherited: "All 1 diagnosed op(s) are inherited" led, and the mismatch came last among the notes."""
    native, oracle = copied(demo_pairs["swiglu-order"], tmp_path)
    with h5py.File(native, "r+") as file:
        file.attrs["weights_hash"] = np.bytes_(b"sha256:other-weights")
    found = diagnose((native, oracle))
    assert found.verdict.startswith(f"{DIFFERENT_WEIGHTS} 0:text-before:0:ffn_act is local: ")
    assert diagnose(demo_pairs["swiglu-order"]).verdict.startswith("0:text-before:0:ffn_act is local: ")


def test_a_native_record_declaring_the_swiglu_order_it_did_not_run_is_said_to_declare_one_and_run_another(demo_pairs: dict) -> None:
    """The swiglu-order native records `swiglu.bf16.silu_then_mul` whatever order it runs: the
    record's id names the candidate `swiglu.silu_then_mul`, which does not give its bits."""
    found = diagnose(demo_pairs["swiglu-order"])
    (op,) = found.ops
    assert (op.native_declared, op.native_declared_exact, op.oracle_declared) == ("swiglu.bf16.silu_then_mul", False, "swiglu.bf16.silu_then_mul")
    assert found.verdict.startswith(
        "0:text-before:0:ffn_act is local: the native declares `swiglu.bf16.silu_then_mul`, but its bits are reproduced by "
        "`swiglu.mul_then_sigmoid` (bit-exact); the oracle's contract on these inputs is `swiglu.silu_then_mul`. "
    )


def test_of_several_exact_candidates_a_false_declaration_is_named_and_the_one_matching_the_natives_recorded_call_is_chosen(
    demo_pairs: dict, tmp_path: Path
) -> None:
    """The native's visual attention claims the tiled contract; its bits are the single range's,
    which MLX's SDPA on a CPU gives too, chunked or not. It recorded one call over all heads."""
    found = diagnose(declaring(demo_pairs["attention-contract"], tmp_path, "kqv_out-0", "visual", "attn.f32.tiled64x64"))
    (op,) = found.ops
    assert (op.native_declared, op.native_declared_exact, op.native_ran) == ("attn.f32.tiled64x64", False, "attn.mlx_sdpa.unchunked")
    assert op.also_exact == ["attn.mlx_sdpa.head_chunked", "attn.bf16.single_range"]
    assert found.verdict.startswith(
        "0:visual:0:sdpa is local: the native declares `attn.f32.tiled64x64`, but its bits are reproduced by `attn.mlx_sdpa.unchunked` "
        "(bit-exact), and `attn.mlx_sdpa.head_chunked`, `attn.bf16.single_range` give the same bits; the oracle's contract"
    )


def test_attention_calls_whose_cache_could_not_be_replayed_in_memory_are_named_by_row_instead_of_asked_of_numpy(demo_pairs: dict, tmp_path: Path) -> None:
    """A dispatch row's kv_len of 2**31 made the ggml candidates pad the cache to 1 TiB: a MemoryError traceback."""
    native, oracle = copied(demo_pairs["attention-contract"], tmp_path)
    with h5py.File(native, "r+") as file:
        table = file["dispatch"][()]
        table["kv_len"][2] = 2**31 - 1
        file["dispatch"][...] = table
    (op,) = diagnose((native, oracle)).ops
    ggml = [c for c in op.candidates if c.id.startswith("ggml.attn")]
    assert ggml and all(c.skipped is not None and f"{native}: /dispatch row 2: kv_len 2,147,483,647 cache cells (2 kv heads of 64) would take 3,200.0 GiB to replay" in c.skipped for c in ggml)
    assert op.native_ran == "attn.bf16.single_range", "the candidates that need no cache cells still run"


def test_signed_zero_is_the_plus_zero_copy_and_nothing_else(demo_pairs: dict) -> None:
    found = diagnose(demo_pairs["signed-zero"])
    (op,) = found.ops
    assert op.native_ran == "copy.plus_zero" and op.classification.local is not None
    assert op.classification.local.signed_zero_only and op.classification.local.differing == 21
    assert found.verdict.startswith("0:text-before:0:ffn_act is local: the native ran `copy.plus_zero` (bit-exact reproduction)")


def test_head_chunk_is_dispatch_only_with_identical_bits_on_this_cpu(demo_pairs: dict) -> None:
    found = diagnose(demo_pairs["head-chunk"])
    assert found.ops == [] and [n.key for n in found.dispatch] == [OpKey(0, "text-after", 0, "sdpa")]
    assert found.dispatch[0].reproducing == ["attn.mlx_sdpa.head_chunked", "attn.mlx_sdpa.unchunked"]
    assert found.verdict.startswith("Nothing computes differently on this CPU: 2 op(s) are dispatch-only, first 0:text-after:0:sdpa, with identical bits.")
    assert "heads per call 5+1 per KV group" in found.verdict and "which this CPU cannot measure" in found.verdict


def test_diagnose_op_on_the_dispatch_only_op_report_names_explains_it_and_all_looks_at_every_one(demo_pairs: dict) -> None:
    second = OpKey(0, "text-after", 1, "sdpa")
    one = diagnose(demo_pairs["head-chunk"], mode="op", key=second)
    assert [n.key for n in one.dispatch] == [second], "report suggests diagnose --op for a dispatch-only op: it must not say bit-exact"
    assert one.verdict.startswith(f"Nothing computes differently on this CPU: {second.text()} is dispatch-only (one of 2 such ops), with identical bits.")
    every = diagnose(demo_pairs["head-chunk"], mode="all")
    assert [n.key for n in every.dispatch] == [OpKey(0, "text-after", 0, "sdpa"), second]


def test_diagnose_op_on_a_contract_only_mismatch_report_names_says_which_declaration_the_bits_bear_out(
    demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bits identical, the native's record declaring the F16 single range: report calls it a
    contract mismatch and points at diagnose --op, which once answered "bit-exact: nothing to diagnose"."""
    native, oracle = declaring(demo_pairs["clean"], tmp_path, "kqv_out-0", "text-before", "attn.f16.single_range")
    out = tmp_path / "d.json"
    assert main(["diagnose", str(native), str(oracle), "--op", "0:text-before:0:sdpa", "--json", str(out)]) == EXIT_EXPLAINED
    assert capsys.readouterr().out.startswith(
        "0:text-before:0:sdpa has identical bits on both sides, but their records' contracts do not match: the native declares "
        "`attn.f16.single_range`, the oracle `attn.bf16.single_range`. From the native's inputs `attn.mlx_sdpa.head_chunked`, "
        "`attn.mlx_sdpa.unchunked`, `attn.bf16.single_range`, `attn.auto_qtile64` give these bits: the native's "
        "`attn.f16.single_range` does not; the oracle's `attn.bf16.single_range` does.\n"
    )
    (note,) = json.loads(out.read_text(encoding="utf-8"))["contract_only"]
    assert (note["key"], note["native_declared"], note["oracle_declared"]) == ("0:text-before:0:sdpa", "attn.f16.single_range", "attn.bf16.single_range")
    f16 = next(c for c in note["candidates"] if c["id"] == "attn.f16.single_range")
    assert f16["vs_native"]["differing"] == 1164


def test_diagnose_op_on_a_record_after_the_shared_eos_says_so_and_exits_as_nothing_to_diagnose(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The oracle stopped at the shared EOS, so the native's later records have no partner:
    report calls them invalid, and diagnose --op once refused one as no aligned op (exit 2)."""
    native, oracle = (str(p) for p in demo_pairs["post-eos"])
    assert main(["diagnose", native, oracle, "--op", "5:decode:0:sdpa"]) == EXIT_EXPLAINED
    assert capsys.readouterr().out.startswith("That op is after the shared EOS step: invalid, never a failure; nothing to diagnose there.\n")


def test_a_declared_contract_no_candidate_computes_is_named_as_such_beside_the_one_that_gives_the_bits(demo_pairs: dict, tmp_path: Path) -> None:
    found = diagnose(declaring(demo_pairs["attention-contract"], tmp_path, "kqv_out-0", "visual", "mlx.sdpa.routed"))
    (op,) = found.ops
    assert (op.native_declared_exact, op.native_ran) == (None, "attn.mlx_sdpa.unchunked")
    assert found.verdict.startswith(
        "0:visual:0:sdpa is local: the native declares `mlx.sdpa.routed`, which no candidate computes, but its bits are reproduced by "
        "`attn.mlx_sdpa.unchunked` (bit-exact)"
    )


@pytest.mark.parametrize("scenario", ["clean", "post-eos"])
def test_a_pair_at_parity_has_nothing_to_diagnose(demo_pairs: dict, scenario: str) -> None:
    found = diagnose(demo_pairs[scenario])
    assert found.ops == [] and found.dispatch == []
    assert found.verdict == "Nothing to diagnose: no aligned op before any shared EOS differs (PARITY)."


def test_a_failing_comparison_with_no_op_to_diagnose_exits_1_as_a_finding_no_rerun_explains(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Read by the mlx-lm profile, no native record has a partner: report fails, and diagnose said exit 0."""
    native, oracle = (str(p) for p in demo_pairs["swiglu-order"])
    assert main(["diagnose", native, oracle, "--native-profile", "mlx-lm"]) == EXIT_UNEXPLAINED
    assert "which no rerun explains" in capsys.readouterr().out
    assert main(["diagnose", *(str(p) for p in demo_pairs["clean"])]) == EXIT_EXPLAINED


def test_records_without_a_partner_beside_a_dispatch_only_op_are_named_and_exit_1(demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dispatch-only op was looked at, "Nothing computes differently" said, exit 0, and the
    records that make report's DIVERGENCE were never named."""
    native, oracle = copied(demo_pairs["head-chunk"], tmp_path)
    with h5py.File(native, "r+") as file:
        index = file["index"][:]
        index["name"][(index["name"] == b"ffn_norm-0") & (index["segment"] == b"text-before") & (index["step"] == 0)] = b"mystery"
        file["index"][...] = index
    assert main(["diagnose", str(native), str(oracle)]) == EXIT_UNEXPLAINED
    verdict = capsys.readouterr().out.splitlines()[0]
    assert verdict.startswith("Nothing computes differently on this CPU: 2 op(s) are dispatch-only, first 0:text-after:0:sdpa")
    assert verdict.endswith("; 2 record(s) could not be aligned, first at 0:text-before:0:mystery, which no rerun explains.")


def test_an_op_fed_an_upstream_difference_but_computing_faithfully_is_inherited_not_local(demo_pairs: dict) -> None:
    (o_proj,) = diagnose(demo_pairs["attention-contract"], mode="op", key=OpKey(0, "visual", 0, "o_proj")).ops
    assert o_proj.classification.locality == Locality.INHERITED and o_proj.classification.inputs_agree is False
    assert o_proj.classification.local is not None and o_proj.classification.local.bit_exact
    assert o_proj.candidates == []
    (down,) = diagnose(demo_pairs["swiglu-order"], mode="op", key=OpKey(0, "text-before", 0, "ffn_down")).ops
    assert down.classification.locality == Locality.INHERITED


def test_two_separate_causes_give_two_local_chains_with_their_own_contracts(demo_pairs: dict) -> None:
    """The swiglu-order native (also single-range everywhere) against the attention-contract oracle
    (tiled from Q=64): the SwiGLU order and the attention contract are both wrong, separately."""
    found = diagnose((demo_pairs["swiglu-order"][0], demo_pairs["attention-contract"][1]), mode="first", first=5)
    assert [(op.key.text(), op.native_ran) for op in found.local_chain] == [
        ("0:text-before:0:ffn_act", "swiglu.mul_then_sigmoid"),
        ("0:text-before:1:ffn_act", "swiglu.mul_then_sigmoid"),
        ("0:visual:0:sdpa", "attn.bf16.single_range"),
        ("0:visual:0:ffn_act", "swiglu.mul_then_sigmoid"),
        ("0:visual:1:sdpa", "attn.bf16.single_range"),
    ]
    assert [op.oracle_ran for op in found.local_chain] == ["swiglu.silu_then_mul"] * 2 + ["attn.f32.tiled64x64", "swiglu.silu_then_mul", "attn.f32.tiled64x64"]
    assert causes(found)["0:visual:0:o_proj"] == "inherited" and causes(found)["0:text-before:0:ffn_down"] == "inherited"
    assert "4 more local op(s), all reproduced exactly by a candidate" in found.verdict


def test_the_whole_run_budget_gives_the_visual_layer_0_attention_all_of_the_final_error(demo_pairs: dict, tmp_path: Path) -> None:
    out = tmp_path / "diagnosis.json"
    pair = demo_pairs["attention-contract"]
    assert main(["diagnose", str(pair[0]), str(pair[1]), "--all", "--json", str(out), "--html", str(tmp_path / "d.html")]) == EXIT_EXPLAINED
    document = json.loads(out.read_text(encoding="utf-8"))
    assert list(document)[:3] == ["format", "version", "verdict"]
    assert document["verdict"].startswith("0:visual:0:sdpa is local") and "103 later op(s) are inherited" in document["verdict"]
    assert document["local_chain"] == ["0:visual:0:sdpa", "0:visual:1:sdpa"]
    budget = document["budget"]
    assert budget["final_logits"] == "6:decode:-1:logits" and budget["baseline_exact"] is True
    rows = {row["key"]: row for row in budget["rows"]}
    assert rows["0:visual:0:sdpa"]["share"] == 1.0 and rows["0:visual:0:sdpa"]["injected"] == "the native's record (its inputs equal the oracle's)"
    assert rows["0:visual:1:sdpa"]["share"] == 0.0 and rows["0:visual:1:sdpa"]["final"]["bit_exact"] is True
    assert rows["0:visual:1:sdpa"]["injected"] == "attn.bf16.single_range on the oracle's inputs"
    assert document["verdict"] in (tmp_path / "d.html").read_text(encoding="utf-8").replace("&#x27;", "'").replace("&#x60;", "`")


def test_every_local_op_of_a_real_llama_cpp_run_is_reproduced_bit_exactly_by_a_ggml_candidate(llama_tiny_pairs: dict) -> None:
    expected = {"attn_norm": "ggml.rms_norm", "ffn_norm": "ggml.rms_norm", "final_norm": "ggml.rms_norm", "q_norm": "ggml.rms_norm",
                "k_norm": "ggml.rms_norm", "q_rope": "ggml.rope.neox", "k_rope": "ggml.rope.neox", "sdpa": "ggml.attn.f32", "ffn_act": "ggml.swiglu"}
    found = diagnose(llama_tiny_pairs["q8_0"], mode="all", budget=False)
    assert len(found.local_chain) == 87 and all(str(op.classification.locality) != "undetermined" for op in found.ops)
    for op in found.local_chain:
        assert op.native_ran == expected.get(op.key.op, "ggml.mul_mat.q8_0"), op.key.text()
    assert {op.key.op for op in found.ops if op.classification.locality == Locality.INHERITED} >= {"attn_residual", "layer_out"}
    # A Q8_0 GGUF against an F32 one: other weights, said first.
    assert found.verdict.startswith(f"{DIFFERENT_WEIGHTS} 0:prefill:0:q_proj is local: the native ran `ggml.mul_mat.q8_0` (bit-exact reproduction)")


def test_the_verdict_counts_the_later_ops_left_undetermined_and_says_why_the_first_was(demo_pairs: dict, tmp_path: Path) -> None:
    """Without its weights file only the attentions and the ops fed their inputs directly can be
    rerun: the sentence once named the 2 local and 36 inherited ops and hid the 67 others."""
    found = diagnose(copied(demo_pairs["attention-contract"], tmp_path, weights=False), mode="all", budget=False)
    assert len(found.open_ops) == 67
    missing = tmp_path / "demo-qwen3-tiny.safetensors"
    assert found.verdict.endswith(
        "1 more local op(s) with the same contract; 36 later op(s) are inherited; 67 later op(s) could not be classified, first "
        f"0:visual:0:o_proj (cannot be rerun on the oracle's route from the native's inputs: weights file {missing} (referenced by the "
        "native capture) does not exist (`--weights FILE` names another)). Against the float64 reference the oracle's route is closer to exact."
    )


def test_the_text_lists_the_ops_left_undetermined_under_a_heading_and_counts_those_it_leaves_out(demo_pairs: dict, tmp_path: Path) -> None:

    lines = render_text(diagnose(copied(demo_pairs["attention-contract"], tmp_path, weights=False), mode="all", budget=False)).splitlines()
    heading = lines.index("Not classified (execution order; a covered stage is accounted for by the op that computes it):")
    assert lines[heading + 1].startswith("  undetermined 0:visual:0:o_proj: cannot be rerun") and lines[heading - 1] == ""
    assert lines[heading + 6] == "  ... 62 more in the JSON"


def test_a_budget_row_whose_change_reaches_final_logits_the_native_has_exact_says_so_rather_than_a_dash(demo_pairs: dict, tmp_path: Path) -> None:
    from backends.diagnosis.document import budget_lines

    found = diagnose(nudged(demo_pairs["clean"], tmp_path, "attn_out-0", "visual", 10), mode="all")
    assert [op.key.text() for op in found.local_chain] == ["0:visual:0:o_proj"]
    assert found.budget is not None and found.budget.total is not None and found.budget.total.bit_exact
    (row,) = budget_lines(found.budget)[1:]
    assert row.startswith("  0:visual:0:o_proj            none (the native's are exact), yet alone it gives 329 differ · max 83 ULP  local 10 of 27,648")


def test_a_budget_of_more_rows_than_the_text_lists_counts_the_rest() -> None:
    from backends.diagnosis.budget import Budget, BudgetRow
    from backends.diagnosis.candidates import ErrorFigure
    from backends.diagnosis.document import LOCAL_ROWS_SHOWN, budget_lines

    error = ErrorFigure(3, 512, 2, 1e-6, False)
    rows = [BudgetRow(OpKey(0, "prefill", layer, "sdpa"), error, "the native's record", share=1 / (layer + 1), final=error) for layer in range(LOCAL_ROWS_SHOWN + 3)]
    lines = budget_lines(Budget(OpKey(0, "prefill", -1, "logits"), error, rows=rows))
    assert len(lines) == 1 + LOCAL_ROWS_SHOWN + 1 and lines[-1] == "  ... 3 more in the JSON"


def test_the_diagnosis_yields_progress_and_closing_it_cancels(demo_pairs: dict) -> None:
    with open_capture(demo_pairs["swiglu-order"][0]) as native, open_capture(demo_pairs["swiglu-order"][1]) as oracle:
        work = iter_diagnose(native, oracle, run_to_end(iter_compare_cached(native, oracle)), DiagnoseOptions(mode="all"))
        first, second = next(work), next(work)
        assert isinstance(first, Progress) and second.label == "classifying 0:text-before:0:ffn_act"
        work.close()


def test_a_kv_cache_saved_through_x_plus_zero_is_local_at_k_cache_and_the_plus_zero_copy_reproduces_it(tmp_path: Path) -> None:
    """Seed 001's trap on the cache itself: the native keeps its keys through a deep clone taken
    as x + 0, so every -0.0 key is stored as +0.0. The keys agree, the cells do not, and only the
    copy explains them."""
    rng = np.random.default_rng(3)
    keys = bf16_bits(rng.standard_normal((2, 3, 4)))
    keys[0, 1, 2] = keys[1, 2, 0] = 0x8000
    cells = np.ascontiguousarray(keys.transpose(1, 0, 2)).reshape(3, 8)
    cloned = np.where(cells == 0x8000, np.uint16(0), cells)

    def capture(name: str, stored: np.ndarray) -> Path:
        tensors = [T("k_rope", keys, layer=0, dtype="bfloat16"), T("k_cache", stored, layer=0, dtype="bfloat16")]
        return write_capture(tmp_path / f"{name}.h5", name, tensors, [(0, 5, False)])

    found = diagnose((capture("native", cloned), capture("oracle", cells)))
    (op,) = found.ops
    assert op.key == OpKey(0, "prefill", 0, "k_cache") and op.classification.locality == Locality.LOCAL
    assert (op.native_ran, op.oracle_ran) == ("copy.plus_zero", "cache.store")
    assert op.classification.local is not None and op.classification.local.differing == 2


def test_a_copy_of_the_oracles_route_never_names_the_oracles_contract_nor_the_natives_closest(tmp_path: Path) -> None:
    """Neither side's SwiGLU is a candidate's here: `copy.plus_zero` (the route's output + 0.0) is
    that route itself, bit-exact against it whenever it holds no -0.0, and was named as the oracle's
    contract and as the native's closest."""
    rng = np.random.default_rng(7)
    gate, up = bf16_bits(rng.standard_normal((3, 8))), bf16_bits(rng.standard_normal((3, 8)))
    act = bf16_bits(rng.standard_normal((3, 8)))
    shifted = act.copy()
    shifted[0, 0] += 1

    def capture(name: str, out: np.ndarray) -> Path:
        tensors = [T(op, bits, layer=0, dtype="bfloat16") for op, bits in (("ffn_gate", gate), ("ffn_up", up), ("ffn_act", out))]
        return write_capture(tmp_path / f"{name}.h5", name, tensors, [(0, 5, False)])

    (op,) = diagnose((capture("native", shifted), capture("oracle", act))).ops
    assert op.key == OpKey(0, "prefill", 0, "ffn_act") and op.classification.locality == Locality.LOCAL
    assert op.native_ran is None and op.oracle_ran is None
    assert op.closest is not None and op.closest != "copy.plus_zero"
    copy = next(c for c in op.candidates if c.id == "copy.plus_zero")
    assert copy.vs_native is not None and copy.vs_oracle_route is None


@pytest.mark.parametrize(
    ("oracle_up", "said"),
    [
        (None, "the native capture has ffn_up, but the comparison left it unpaired (no partner: no oracle record for step 0 prefill layer 0 ffn_up)"),
        ("wider", "the native capture has ffn_up, but the comparison left it unpaired (canonical shapes differ: native [3, 4] vs oracle [3, 8])"),
    ],
)
def test_an_input_the_native_holds_without_a_partner_is_named_as_unpaired_not_as_missing_from_the_native(tmp_path: Path, oracle_up: str | None, said: str) -> None:
    rng = np.random.default_rng(9)
    gate, up, act = (bf16_bits(rng.standard_normal((3, width))) for width in (4, 8, 4))
    shifted = act.copy()
    shifted[1, 1] += 1
    native = write_capture(tmp_path / "n.h5", "native", [T(op, bits, layer=0, dtype="bfloat16") for op, bits in (("ffn_gate", gate), ("ffn_up", up[:, :4].copy()), ("ffn_act", shifted))], [(0, 5, False)])
    oracle_ops = [("ffn_gate", gate), ("ffn_act", act)] + ([("ffn_up", up)] if oracle_up else [])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T(op, bits, layer=0, dtype="bfloat16") for op, bits in oracle_ops], [(0, 5, False)])
    (op,) = diagnose((native, oracle)).ops
    assert op.key == OpKey(0, "prefill", 0, "ffn_act") and op.classification.locality == Locality.UNDETERMINED
    assert said in op.classification.why and "has no ffn_up" not in op.classification.why


def test_an_op_after_the_shared_eos_is_not_diagnosed_and_a_finding_no_rerun_explains_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    bits = [bf16_bits(rng.standard_normal((1, 8))) for _ in range(3)]
    changed = bits[2].copy()
    changed[0, 3] += 1
    tokens = [(0, 5, False), (1, 9, True), (2, 4, False)]
    native = write_capture(tmp_path / "n.h5", "native", [T("ffn_act", b, step=s, segment="decode" if s else "prefill", layer=0, dtype="bfloat16") for s, b in enumerate([*bits[:2], changed])], tokens)
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("ffn_act", b, step=s, segment="decode" if s else "prefill", layer=0, dtype="bfloat16") for s, b in enumerate(bits)], tokens)
    after = diagnose((native, oracle), mode="op", key=OpKey(2, "decode", 0, "ffn_act"))
    assert after.ops == [] and after.verdict == "That op is after the shared EOS step: invalid, never a failure; nothing to diagnose there."

    wider = write_capture(tmp_path / "w.h5", "native", [T("ffn_act", np.zeros((1, 8), np.float32), layer=0), T("ffn_up", bits[0], layer=0, dtype="bfloat16")], [(0, 5, False)])
    narrow = write_capture(tmp_path / "x.h5", "oracle", [T("ffn_act", bits[0], layer=0, dtype="bfloat16"), T("ffn_up", bits[0], layer=0, dtype="bfloat16")], [(0, 5, False)])
    found = diagnose((wider, narrow))
    assert found.ops == [] and found.comparison_word == "DIVERGENCE"
    assert found.verdict.startswith(
        "Nothing to diagnose: no aligned op before any shared EOS differs (DIVERGENCE); the comparison's first finding is unaligned at 0:prefill:0:ffn_act (native 'ffn_act': dtypes differ (native float32 vs oracle bfloat16)"
    )


def test_an_op_named_without_its_positions_gets_the_keys_it_was_paired_under_and_one_file_twice_is_said(
    demo_pairs: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = (str(p) for p in demo_pairs["attention-contract"])
    assert main(["diagnose", native, oracle, "--align", "positions", "--op", "0:visual:0:sdpa"]) == 2
    assert capsys.readouterr().err == (
        "parity-xray diagnose: 0:visual:0:sdpa is not an aligned op of this comparison: the records were paired by position, "
        "and this op's pairs are 0:visual:0:sdpa@5-76\n"
    )
    assert main(["diagnose", native, oracle, "--op", "0:visual:0:sdpa@5-76"]) == 2
    assert capsys.readouterr().err == (
        "parity-xray diagnose: 0:visual:0:sdpa@5-76 is not an aligned op of this comparison: the records were paired by calls, "
        "where this op is 0:visual:0:sdpa; its @ positions name a pair made by position (--align positions; in the window, "
        "Compare > Pair records > By token position)\n"
    ), "the way back: a key copied from a report paired by position"
    assert main(["diagnose", native, native]) == 0
    assert "SAME FILE: the native and the oracle are one file, so every op is bit-exact whatever it holds" in capsys.readouterr().out


def test_an_f16_cache_truncated_is_local_against_one_rounded_to_nearest_which_the_store_reproduces(tmp_path: Path) -> None:
    """float32 keys stored in an F16 cache: `cache.store` rounds once, to nearest even, as F16C and
    MLX's astype do, so it is the oracle's contract bit for bit; a native that truncates instead
    is local there, and no candidate is it."""
    keys = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    cells = np.ascontiguousarray(keys.transpose(1, 0, 2)).reshape(3, 8)
    nearest = cells.astype(np.float16)
    too_far = np.abs(nearest.astype(np.float32)) > np.abs(cells)
    truncated = (nearest.view(np.uint16) - too_far.astype(np.uint16)).view(np.float16)
    assert too_far.any()

    def capture(name: str, stored: np.ndarray) -> Path:
        tensors = [T("k_rope", keys, layer=0), T("k_cache", stored.view(np.uint16), layer=0, dtype="float16")]
        return write_capture(tmp_path / f"{name}.h5", name, tensors, [(0, 5, False)])

    (op,) = diagnose((capture("native", truncated), capture("oracle", nearest))).ops
    assert op.key == OpKey(0, "prefill", 0, "k_cache") and op.classification.locality == Locality.LOCAL
    assert (op.native_ran, op.oracle_ran) == (None, "cache.store")
    assert op.classification.local is not None and op.classification.local.differing == int(too_far.sum())


def test_the_budget_replay_says_it_cannot_change_a_cache_op(demo_pairs: dict) -> None:
    """The replay keeps each layer's cache as k_rope and v_proj: an injected k_cache would change
    nothing, so it is refused with the reason rather than measured as a share of 0."""
    with open_capture(demo_pairs["clean"][0]) as native, open_capture(demo_pairs["clean"][1]) as oracle:
        comparison = run_to_end(iter_compare_cached(native, oracle))
        replay = Replay(RerunSession(native, oracle, comparison), comparison.pairs[-1].key)
        key = OpKey(0, "visual", 0, "k_cache")
        with pytest.raises(NotMeasurable, match="it has no k_cache to change"):
            replay.run(key, Injection(key, mx.zeros((1,)), "a test"))


def test_llama_cpp_as_the_oracle_an_f16_cache_is_named_at_the_first_attention(llama_tiny_pairs: dict) -> None:
    """Both runs are llama.cpp, F32 cache against F16: the recorder names the KQ mask causal after
    checking its values, so the attention can be rerun; its inputs agree bit for bit, so it is
    local even though MLX's route cannot reproduce llama.cpp's bits, and each side's ggml
    contract is named."""
    found = diagnose((llama_tiny_pairs["f32"][0], llama_tiny_pairs["f32-kv16"][0]))
    first = next(op for op in found.ops if op.classification.locality == Locality.LOCAL)
    assert first.key == OpKey(0, "prefill", 0, "sdpa") and first.classification.inputs_agree is True
    assert (first.native_ran, first.oracle_ran) == ("ggml.attn.f32", "ggml.attn.f16_cache")
    assert first.classification.why.startswith("native and oracle read bit-identical inputs and their outputs differ")
    stages = {OpKey(0, "prefill", 0, op) for op in ("attn_scores", "attn_probs", "attn_pv")}
    assert found.covered_keys() == stages and found.open_ops == []
    assert found.counts_text().endswith("1 local, 0 inherited, 0 undetermined, 3 stage(s) covered by the op that computes them")
    # Every surface's word for them: the window and the HTML said "undetermined" of what the count called covered.
    assert {key: word for key, word in found.locality().items() if key in stages} == dict.fromkeys(stages, "covered")
    text, page = render_text(found), render_html(found)
    for stage in stages:
        assert f"  covered {stage}: " in text and re.search(rf"<td>{re.escape(stage.text())}</td><td>[^<]*</td><td>covered</td>", page)
    assert "<td>undetermined</td>" not in page


def test_llama_cpp_as_the_oracle_splits_local_from_inherited_by_the_contracts_that_give_its_bits(llama_tiny_pairs: dict) -> None:
    """Flash attention on (native) against off (oracle), both llama.cpp. MLX's route does not
    give llama.cpp's bits, so the candidates that do decide: `ggml.mul_mat.f32` gives the oracle's
    o_proj from its inputs and the native's from the native's, so o_proj only inherited. Every
    local op is an attention; where candidates that give the oracle's bits disagree on the
    native's inputs, the op is left undetermined, naming them."""
    found = diagnose((llama_tiny_pairs["f32-flash"][0], llama_tiny_pairs["f32"][0]), mode="all", budget=False)
    assert {(op.key.op, op.native_ran, op.oracle_ran) for op in found.local_chain} == {("sdpa", "ggml.attn.flash", "ggml.attn.f32")}
    assert len(found.local_chain) == 6
    o_proj = next(op.classification for op in found.ops if op.key == OpKey(0, "prefill", 0, "o_proj"))
    assert o_proj.locality == Locality.INHERITED
    assert o_proj.why.startswith("the contracts that give the oracle's own bits from its own inputs (`ggml.mul_mat.f32`; the oracle's route does not")
    undetermined = [op.classification for op in found.ops if op.classification.locality == Locality.UNDETERMINED and op.key.op not in STAGE_OF]
    assert all("`ggml.rms_norm` give the native's bits and the oracle's route" in c.why for c in undetermined)
    stages = [op.classification for op in found.ops if op.key.op in STAGE_OF]
    assert stages and all(c.locality == Locality.UNDETERMINED and c.why.startswith("a stage inside ") for c in stages)
    undetermined += stages
    assert len(found.ops) - len(found.local_chain) - len(undetermined) == sum(op.classification.locality == Locality.INHERITED for op in found.ops) > 60


def test_diagnose_first_0_is_refused_rather_than_read_as_first_1(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    pair = demo_pairs["attention-contract"]
    with pytest.raises(SystemExit) as stopped:
        main(["diagnose", str(pair[0]), str(pair[1]), "--first", "0"])
    assert stopped.value.code == 2 and "argument --first: must be a whole number >= 1, not 0" in capsys.readouterr().err


def test_a_budget_of_final_logits_at_parity_shares_out_nothing_and_says_so_as_its_json_does(demo_pairs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["signed-zero"]
    assert main(["diagnose", str(native), str(oracle), "--all", "--json", str(tmp_path / "d.json")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  0:text-before:0:ffn_act ")]
    assert rows and "none (no final error to share out)" in rows[-1] and "0%" not in rows[-1]
    budget = json.loads((tmp_path / "d.json").read_text())["budget"]
    assert {row["share"] for row in budget["rows"]} == {None}


def test_no_budget_without_all_is_refused(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = demo_pairs["signed-zero"]
    assert main(["diagnose", str(native), str(oracle), "--no-budget"]) == 2
    assert capsys.readouterr().err == "parity-xray diagnose: --no-budget goes with --all (only --all shares out the final error)\n"


def test_the_diagnosis_text_and_page_write_a_captures_control_characters_as_escapes() -> None:
    from backends.diagnosis.document import render_html, render_text

    found = Diagnosis("n.h5", "o.h5", "all", "Nothing to diagnose.", "PARITY", notes=["The run cannot be replayed from the weights file missing\x1b[2J\x1b]0;pwned\x07"])
    text, page = render_text(found), render_html(found)
    assert "weights file missing\\x1b[2J\\x1b]0;pwned\\x07" in text and "weights file missing\\x1b[2J" in page
    assert "\x1b" not in text and "\x07" not in text and "\x1b" not in page



def test_first_stops_after_a_thousand_undetermined_ops_in_a_row_and_says_how_many_it_left(tmp_path: Path) -> None:
    from backends.diagnosis.run import UNDETERMINED_RUN

    same = bf16_bits([[1.0, 2.0, 3.0, 4.0]])
    spread = same + 1
    layers = UNDETERMINED_RUN + 50
    native = [T("q_proj", spread, layer=layer, dtype="bfloat16") for layer in range(layers)]
    oracle = [T("q_proj", same, layer=layer, dtype="bfloat16") for layer in range(layers)]
    paths = write_capture(tmp_path / "n.h5", "native", native), write_capture(tmp_path / "o.h5", "oracle", oracle)
    found = diagnose(paths)
    assert len(found.ops) == UNDETERMINED_RUN == 1000
    assert {str(op.classification.locality) for op in found.ops} == {"undetermined"}
    assert found.notes[-1] == "Stopped after 1,000 differing ops in a row could not be classified; 50 later differing op(s) were not classified (--all, or the window's scope \"Every differing op\", classifies every one)."
    assert found.verdict.startswith("0:prefill:0:q_proj is undetermined: cannot be rerun on the oracle's route from the native's inputs: q_proj rerun needs")


def test_first_counts_undetermined_ops_in_a_row_afresh_in_a_segment_of_another_name(tmp_path: Path) -> None:
    same = bf16_bits([[1.0, 2.0, 3.0, 4.0]])
    layers = range(600)
    native = [T("q_proj", same + 1, segment=segment, layer=layer, dtype="bfloat16") for segment in ("visual", "text-after") for layer in layers]
    oracle = [T("q_proj", same, segment=segment, layer=layer, dtype="bfloat16") for segment in ("visual", "text-after") for layer in layers]
    paths = write_capture(tmp_path / "n.h5", "native", native), write_capture(tmp_path / "o.h5", "oracle", oracle)
    found = diagnose(paths)
    assert len(found.ops) == 1200 and not any(note.startswith("Stopped after") for note in found.notes)


def test_diagnose_takes_the_weights_file_a_moved_pair_no_longer_finds_beside_it(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    moved = [shutil.copy(path, tmp_path) for path in demo_pairs["attention-contract"]]
    o_proj = "0:visual:0:o_proj"
    assert main(["diagnose", *moved, "--op", o_proj]) == EXIT_UNEXPLAINED
    out = capsys.readouterr().out
    assert f"weights file {tmp_path / 'demo-qwen3-tiny.safetensors'} (referenced by the native capture) does not exist (`--weights FILE` names another)" in out
    weights = demo_pairs["attention-contract"][0].parent / "demo-qwen3-tiny.safetensors"
    assert main(["diagnose", *moved, "--op", o_proj, "--weights", str(weights)]) == EXIT_EXPLAINED
    assert "1 differing op(s) classified: 0 local, 1 inherited, 0 undetermined" in capsys.readouterr().out


def test_where_the_replay_does_not_reproduce_the_oracle_a_change_that_changes_nothing_shares_nothing(demo_pairs: dict, tmp_path: Path) -> None:
    """Roles swapped on the SwiGLU pair, the oracle's engine options dropped: the replay runs
    mlx-lm's order, which is the native's, not the oracle's. Measured against one replay from the
    first local op, nine injections of exactly what the replay computes anyway read 97.6% each."""
    mlx_lm_run, demo_native_run = copied(demo_pairs["swiglu-order"], tmp_path)[::-1]
    native, oracle = mlx_lm_run.rename(tmp_path / "native.h5"), demo_native_run.rename(tmp_path / "oracle.h5")
    with h5py.File(oracle, "r+") as f:
        provenance = json.loads(bytes(f.attrs["provenance_json"]).decode())
        del provenance["options"]
        f.attrs["provenance_json"] = np.frombuffer(json.dumps(provenance).encode(), np.uint8)
        f.attrs["role"] = np.bytes_(b"oracle")
    with h5py.File(native, "r+") as f:
        f.attrs["role"] = np.bytes_(b"native")
    budget = diagnose((native, oracle), mode="all").budget
    assert budget is not None and budget.baseline_exact is False
    assert len(budget.rows) == 18 and {row.share for row in budget.rows} == {0.0}
    assert all(row.final is not None and row.final.bit_exact for row in budget.rows)
    assert any("against the replay from the same op with nothing changed" in note for note in budget.notes)


def test_an_op_whose_weights_alone_differ_is_inherited_from_its_weights_not_local(demo_pairs: dict, tmp_path: Path) -> None:
    """A native that ran a fine-tuned copy of one weight (its own file and hash): with the same
    inputs, the route check reran the oracle's route with the native's weights, found it "did not
    reproduce the oracle's own bits", and called the op local, "explained" by `linear.mlx`."""
    native, oracle = copied(demo_pairs["clean"], tmp_path)
    weights = mx.load(str(tmp_path / "demo-qwen3-tiny.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    tuned = dict(weights)
    tuned[name] = mx.concatenate([(weights[name][:1].astype(mx.float32) * 1.01).astype(mx.bfloat16), weights[name][1:]])
    mx.save_safetensors(str(tmp_path / "tuned.safetensors"), tuned)
    with h5py.File(native, "r+") as file:
        (row,) = [r for r in file["index"][:] if (r["name"], r["segment"], r["step"]) == (b"ffn_swiglu-0", b"text-before", 0)]
        (out,) = [r for r in file["index"][:] if (r["name"], r["segment"], r["step"]) == (b"ffn_out-0", b"text-before", 0)]
        stored = file[row["path"].decode()]
        x = mx.array(stored[int(row["offset"]) : int(row["offset"]) + int(row["nbytes"])].view(np.uint16)).view(mx.bfloat16)
        with mx.stream(mx.cpu):
            y = x.reshape(int(row["shape"][0]), -1) @ tuned[name].T
            mx.eval(y)
        file[out["path"].decode()][int(out["offset"]) : int(out["offset"]) + int(out["nbytes"])] = np.array(y.view(mx.uint16)).view(np.uint8).ravel()
        provenance = json.loads(bytes(file.attrs["provenance_json"]).decode())
        provenance["weights_file"] = "tuned.safetensors"
        file.attrs["provenance_json"] = np.frombuffer(json.dumps(provenance).encode(), np.uint8)
        file.attrs["weights_hash"] = np.bytes_(b"sha256:tuned")
    found = diagnose((native, oracle))
    (op,) = found.ops
    assert op.key.text() == "0:text-before:0:ffn_down"
    assert (str(op.classification.locality), op.classification.weights_differ, op.classification.inputs_agree) == ("inherited", True, True)
    assert "this op's weights differ between the runs, and its inputs are bit-identical" in op.classification.why
    assert found.verdict.endswith("the weights differ at 1 of them, first 0:text-before:0:ffn_down.")


def test_a_weights_file_other_than_the_one_the_runs_hashed_is_said_to_be_so_first(demo_pairs: dict, tmp_path: Path) -> None:
    """`--weights` of a fine-tuned copy: one op falsely local, eight undetermined, and nothing
    said of the file, which every rerun read for both sides."""
    weights = mx.load(str(demo_pairs["swiglu-order"][0].parent / "demo-qwen3-tiny.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    weights[name] = (weights[name].astype(mx.float32) * 1.01).astype(mx.bfloat16)
    tuned = tmp_path / "tuned.safetensors"
    mx.save_safetensors(str(tuned), weights)
    with open_capture(demo_pairs["swiglu-order"][0]) as native:
        recorded = native.meta.weights_hash
    found = diagnose(demo_pairs["swiglu-order"], weights_path=str(tuned))
    assert found.verdict.startswith(
        f"The weights file {tuned} does not match the weights hash of both runs ({recorded}): every rerun reads it, "
        "so what the reruns find is of other weights than the runs used. 0:text-before:0:ffn_act is local"
    )
    same = diagnose(demo_pairs["swiglu-order"], weights_path=str(demo_pairs["swiglu-order"][0].parent / "demo-qwen3-tiny.safetensors"))
    assert same.verdict.startswith("0:text-before:0:ffn_act is local")


def test_a_weights_file_that_cannot_be_what_it_is_taken_for_is_refused_before_any_rerun(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """A capture named as the weights turned every op that takes a weight "undetermined" and
    exited 1, a finding, where the input was wrong."""
    native, oracle = demo_pairs["attention-contract"]
    assert main(["diagnose", str(native), str(oracle), "--all", "--no-budget", "--weights", str(native)]) == 2
    said = f"weights file {native} (named for this rerun) cannot be read as safetensors, which a weights file not named *.gguf is taken to be (it begins b'\\x89HDF"
    assert said in capsys.readouterr().err


def test_a_declared_contract_naming_another_dtype_than_the_records_is_no_candidates_and_never_said_to_be_what_ran(demo_pairs: dict, tmp_path: Path) -> None:
    """A bfloat16 record declaring `swiglu.f16.mul_then_sigmoid` read "the native ran
    swiglu.mul_then_sigmoid (bit-exact)" with its declaration exact, though float16 arithmetic
    differs: the candidate computes in its input's dtype, bfloat16 here."""
    found = diagnose(declaring(demo_pairs["swiglu-order"], tmp_path, "ffn_swiglu-0", "text-before", "swiglu.f16.mul_then_sigmoid"))
    (op,) = found.ops
    assert (op.native_declared, op.native_declared_id, op.native_declared_exact) == ("swiglu.f16.mul_then_sigmoid", None, None)
    assert (op.oracle_declared, op.oracle_declared_id) == ("swiglu.bf16.silu_then_mul", "swiglu.silu_then_mul")
    assert found.verdict.startswith(
        "0:text-before:0:ffn_act is local: the native declares `swiglu.f16.mul_then_sigmoid`, which no candidate computes, "
        "but its bits are reproduced by `swiglu.mul_then_sigmoid` (bit-exact)"
    )


def test_runs_of_the_same_weights_read_no_weight_to_compare_them(demo_pairs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides' weights were read for every op classified, to see whether they differ: a real
    model's GGUF weight decoded twice more per op, where the runs' weights hashes already agree."""
    read: list[str] = []
    original = WeightSource.get

    def counted(self: WeightSource, op: str, layer: int, width: int | None = None) -> mx.array:
        read.append(op)
        return original(self, op, layer, width)

    monkeypatch.setattr(WeightSource, "get", counted)
    with open_capture(demo_pairs["swiglu-order"][0]) as native, open_capture(demo_pairs["swiglu-order"][1]) as oracle:
        comparison = run_to_end(iter_compare_cached(native, oracle))
        session = RerunSession(native, oracle, comparison)
        pair = next(p for p in comparison.pairs if p.key.text() == "0:text-before:0:ffn_down")
        assert not weights_differ_at(session, pair.key)
    assert read == [], "the runs' weights hashes agree: nothing to read"
