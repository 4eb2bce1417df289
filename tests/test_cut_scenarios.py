"""The cut demo scenarios: one real engine run twice, fed differently, and what that finds.

Every pair is recorded here by the real MLX or llama.cpp recorder (nothing planted); each test
checks the documented finding (docs/demo-scenarios.md), which for most cuts on a CPU is parity
position by position, and for llama.cpp's prompt tail fed token by token is a divergence at the
first fed position.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import h5py
import mlx.core as mx
import numpy as np
import pytest

from backends.demo.cut_pairs import CUT_SCENARIOS, WORK_DIR, iter_generate_cut
from backends.diagnosis.classify import Locality
from backends.diagnosis.run import DiagnoseOptions, iter_diagnose
from backends.dispatch.timeline import build_timeline, timeline_summary
from backends.kernels import attention_contracts as contracts
from sessions.capture.opening import open_capture
from sessions.compare.comparison import CUT_APART, Comparison, iter_compare
from sessions.compare.document import dumps
from sessions.compare.json_plain import plain
from sessions.compare.key import OpKey
from sessions.compare.options import CompareOptions
from sessions.progress import run_to_end
from viewer.cli import main

MLX_NAMES = [n for n, s in CUT_SCENARIOS.items() if s.engine == "mlx"]
LLAMA_NAMES = [n for n, s in CUT_SCENARIOS.items() if s.engine == "llama"]


@pytest.fixture(scope="module")
def cut_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    names = MLX_NAMES + (LLAMA_NAMES if _has_llama() else [])
    return run_to_end(iter_generate_cut(tmp_path_factory.mktemp("cut"), names))


def _has_llama() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _compare(native: Path, oracle: Path, alignment: str = "auto") -> Comparison:
    with open_capture(native) as n, open_capture(oracle) as o:
        return run_to_end(iter_compare(n, o, CompareOptions(alignment=alignment)))


def _finding(c: Comparison) -> tuple[str, object, object]:
    first = c.verdict.first
    return c.verdict.word, None if first is None else first.kind, None if first is None else first.key


@pytest.mark.parametrize("name", MLX_NAMES + LLAMA_NAMES)
def test_each_cut_scenario_validates_and_finds_what_its_documentation_says(cut_pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    if name not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs[name]
    for path in (native, oracle):
        assert main(["validate", str(path)]) == 0
    expected = CUT_SCENARIOS[name].expected
    assert _finding(_compare(native, oracle)) == (expected.word, expected.kind, expected.key)


def test_the_segmented_pair_is_compared_position_by_position_and_says_so(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    c = _compare(*cut_pairs["segmented-vs-combined"])
    assert c.alignment.mode == "positions"
    assert c.dispatch_not_compared == CUT_APART and c.dispatch_differences == []
    assert c.alignment.native_calls[:2] == ["prefill 0-82", "decode 83"]
    assert c.alignment.oracle_calls[:3] == ["text-before 0-4", "visual 5-76", "text-after 77-82"]
    assert [p.key.text() for p in c.pairs if p.key.op == "sdpa" and p.key.layer == 0 and p.key.step == 0] == [
        "0:prefill:0:sdpa@0-4",
        "0:prefill:0:sdpa@5-76",
        "0:prefill:0:sdpa@77-82",
    ]


def test_runs_cut_differently_paired_by_calls_say_why_their_records_found_no_partner(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    """By calls, the prefill records of runs cut differently read as gaps ("no partner") or a
    recorder bug ("canonical shapes differ"): nothing said the cut left them over, nor what pairs them."""
    hint = "the runs were cut into different calls, and pairing by token position compares what both computed"
    c = _compare(*cut_pairs["prefill-vs-decode"], alignment="calls")
    first = c.verdict.first
    assert first is not None and first.detail.startswith("native 'model.embed_tokens': canonical shapes differ (native [83, 384] vs oracle [79, 384]; ")
    assert first.detail.endswith(f"; {hint})")
    assert all(u.detail.endswith(hint) for u in c.unaligned if u.reason in ("no_partner", "shape_mismatch"))
    assert not any(hint in u.detail for u in _compare(*cut_pairs["prefill-vs-decode"]).unaligned), "by position they pair"


def test_a_rerun_saved_from_the_segmented_pair_and_paired_by_calls_says_the_runs_were_cut_differently(
    cut_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its one call, `prefill` 5-76, is no call of the oracle run: any rerun read as cut alike,
    and the alignment line said "same calls" above a finding that no oracle record pairs."""
    native, oracle = (str(p) for p in cut_pairs["segmented-vs-combined"])
    saved = tmp_path / "rerun.h5"
    argv = ["rerun", native, oracle, "--op", "0:prefill:0:sdpa@5-76", "--align", "positions", "--from", "native", "--save", str(saved)]
    assert main(argv) == 0
    capsys.readouterr()
    main(["report", str(saved), oracle, "--align", "calls"])
    alignment = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("alignment  "))
    assert alignment.startswith("alignment  by calls, cut differently: native prefill 5-76; oracle text-before 0-4, visual 5-76"), alignment
    assert main(["report", str(saved), oracle, "--align", "positions"]) == 0
    assert "alignment  by position" in capsys.readouterr().out


def test_the_batched_request_is_read_from_its_row(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    native, oracle = cut_pairs["batch-row"]
    with open_capture(oracle) as o:
        assert (o.meta.batch_size, o.meta.batch_row) == (8, 3)
        assert o.records[0].shape[0] == 8
    c = _compare(native, oracle)
    assert c.alignment.words() == "by the same calls (oracle is row 3 of a batch of 8)"
    assert c.unaligned == []


def test_llama_gives_a_request_the_same_prefill_bits_in_a_batch_and_other_bits_from_its_first_decode(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    if "batch-row-llama" not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs["batch-row-llama"]
    with open_capture(oracle) as o:
        assert (o.meta.batch_size, o.meta.batch_row, o.meta.batch_stacked) == (8, 3, True)
    c = _compare(native, oracle)
    assert c.alignment.words() == "by the same calls (oracle is row 3 of a batch of 8)"
    kinds = {(p.key.step, p.verdict.value) for p in c.pairs}
    assert kinds == {(0, "bit-exact"), *{(s, k) for s in (1, 2, 3) for k in ("bit-exact", "diverged")}}
    assert sorted(p.key.op for p in c.pairs if p.key.step == 1 and p.verdict.value == "bit-exact") == ["attn_norm", "attn_rms", "embed"]
    assert {u.reason for u in c.unaligned} == {"one_sided"}
    assert c.tokens.first_divergence_step is None and c.tokens.compared_steps == 4


def test_diagnose_of_a_stage_diagnoses_the_op_whose_rerun_computes_it_and_says_so(cut_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    # `diagnose --op 1:decode:0:attn_scores` (a key report lists) answered "undetermined: a stage
    # inside 1:decode:0:sdpa" with exit 1, where docs/diagnosis.md has the op that computes it classified.
    if "batch-row-llama" not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs["batch-row-llama"]
    main(["diagnose", str(native), str(oracle), "--op", "1:decode:0:attn_scores"])
    out = capsys.readouterr().out
    assert "1:decode:0:attn_scores is a stage inside 1:decode:0:sdpa, whose rerun computes it: 1:decode:0:sdpa is diagnosed." in out
    assert out.startswith("All 1 diagnosed op(s) are inherited") and "attn_scores is undetermined" not in out


def test_diagnose_works_position_by_position_on_the_llama_tail_fed_token_by_token(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    if "prefill-vs-decode-llama" not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs["prefill-vs-decode-llama"]
    with open_capture(native) as n, open_capture(oracle) as o:
        found = run_to_end(iter_diagnose(n, o, run_to_end(iter_compare(n, o)), DiagnoseOptions()))
    local = [op for op in found.ops if op.classification.locality == Locality.LOCAL]
    assert [op.key.text() for op in local] == ["0:prefill:0:q_proj@79"]
    (first,) = local
    assert first.classification.inputs_agree is True
    assert first.classification.why.startswith("native and oracle read bit-identical inputs and their outputs differ (613 of 768 differ, max 512 ULP")
    # One contract, two kernel paths: the native computed row 79 inside its 83-row prefill
    # (tinyBLAS), the oracle in a call of its own (vector dot); the candidate follows each call.
    assert (first.native_ran, first.oracle_ran) == ("ggml.mul_mat.f32", "ggml.mul_mat.f32")
    assert (first.native_call_rows, first.oracle_call_rows) == (83, 1)
    assert "(in a call of 1 row(s) against the native's 83: the kernel follows the call's shape)" in found.verdict


def test_a_stage_left_undetermined_with_its_op_says_why_the_op_was(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    """"its error is split there" pointed at an op that was undetermined itself, and never said why."""
    if "prefill-vs-decode-llama" not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs["prefill-vs-decode-llama"]
    with open_capture(native) as n, open_capture(oracle) as o:
        found = run_to_end(iter_diagnose(n, o, run_to_end(iter_compare(n, o, CompareOptions(alignment="calls"))), DiagnoseOptions()))
    assert found.verdict.startswith("1:decode:0:attn_scores is undetermined: a stage inside 1:decode:0:sdpa ")
    assert "; 1:decode:0:sdpa itself is undetermined: cannot be rerun on the oracle's route from the native's inputs: " in found.verdict


def test_llamas_attention_of_one_row_of_a_prefill_is_reproduced_by_the_kernels_of_that_call(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    """The attention candidates multiplied the probabilities by V on the one-row path for a row
    the native computed inside its 83-row prefill: llama.cpp's own attention read as not
    reproduced (539 of 768 elements off by up to 4,096 ULP). The table's line against the
    oracle's route is the one the oracle's contract was judged by, at the oracle's call shape."""
    if "prefill-vs-decode-llama" not in cut_pairs:
        pytest.skip("the llama extra (llama-cpp-python) is not installed")
    native, oracle = cut_pairs["prefill-vs-decode-llama"]
    key = OpKey(0, "prefill", 0, "sdpa", 0, (79, 80))
    with open_capture(native) as n, open_capture(oracle) as o:
        found = run_to_end(iter_diagnose(n, o, run_to_end(iter_compare(n, o)), DiagnoseOptions(mode="op", key=key)))
    (op,) = found.ops
    assert (op.native_ran, op.oracle_ran) == ("ggml.attn.f32", "ggml.attn.f32")
    assert (op.native_call_rows, op.oracle_call_rows) == (83, 1)
    judged = {c.id: c for c in op.candidates}["ggml.attn.f32"]
    assert judged.vs_native is not None and judged.vs_native.bit_exact
    assert judged.vs_oracle_route is not None and judged.vs_oracle_route.bit_exact


def test_the_json_document_writes_each_pair_as_the_plain_conversion_makes_it_with_its_metrics_last(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    """`--json` makes a pair's object from its fields directly, not through `plain` (5.3 s of a
    240,000-pair document): it must still say what `plain` says, key order included, for pairs cut
    by position (windows), with layouts, and with a user's reason that JSON has to escape."""
    c = _compare(*cut_pairs["segmented-vs-combined"])
    windowed = next(p for p in c.pairs if p.native_window is not None or p.oracle_window is not None)
    reasoned = dataclasses.replace(c.pairs[0], manual_reason='the user\'s "reason"\n\x01 ü', native_layout="(h d) -> h d")
    pairs = [windowed, reasoned, *c.pairs[:3]]
    written = json.loads(dumps(dataclasses.replace(c, pairs=pairs)))["pairs"]
    expected = [plain(p) for p in pairs]
    assert written == expected
    assert [list(w) for w in written] == [[name for name in e if name != "metrics"] + ["metrics"] for e in expected]
    assert written[0]["native_window"] is not None or written[0]["oracle_window"] is not None
    assert written[1]["manual_reason"] == 'the user\'s "reason"\n\x01 ü'


def test_the_json_document_writes_the_error_growth_as_the_plain_conversion_makes_it_non_finite_nmse_included(cut_pairs: dict[str, tuple[Path, Path]]) -> None:
    c = _compare(*cut_pairs["segmented-vs-combined"])
    overflowed = dataclasses.replace(c.pairs[1], metrics=dataclasses.replace(c.pairs[1].metrics, nmse=math.nan))
    c = dataclasses.replace(c, pairs=[c.pairs[0], overflowed, *c.pairs[2:]])
    written = json.loads(dumps(c))["error_growth"]
    assert written == plain(c.error_growth)
    assert written[1]["nmse"] == "NaN" and len(written) == len(c.pairs) > 2


def _record_bits(file: h5py.File, name: str, occurrence: int = 0) -> tuple[int, np.ndarray]:
    index = file["index"][:]
    (row,) = np.flatnonzero((index["name"] == name.encode()) & (index["segment"] == b"prefill") & (index["occurrence"] == occurrence))
    entry = index[row]
    start = int(entry["offset"])
    raw = file[entry["path"].decode()][start : start + int(entry["nbytes"])]
    return int(row), raw.view(np.uint32).reshape(tuple(int(n) for n in entry["shape"][: entry["ndim"]]))


def test_the_q64_switch_of_a_call_compared_in_windows_is_judged_at_the_calls_rows_not_the_windows(cut_pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """A native that computed its whole 83-row prefill attention tiled, as `attn.auto_qtile64`
    selects from 64 rows, against an oracle cut into calls of 5, 72 and 6 rows: judged on the
    6 rows of the window compared, the switch took the single-range side, and the verdict said the
    native declares `attn.auto_qtile64` but ran `attn.f32.tiled64x64`."""
    for source in cut_pairs["segmented-vs-combined"]:
        shutil.copy(source, tmp_path)
    shutil.copytree(cut_pairs["segmented-vs-combined"][0].parent / WORK_DIR, tmp_path / WORK_DIR)  # the model the captures reference
    native = tmp_path / cut_pairs["segmented-vs-combined"][0].name
    oracle = tmp_path / cut_pairs["segmented-vs-combined"][1].name
    with h5py.File(native, "r+") as file:
        _, q = _record_bits(file, "model.layers.0.self_attn.rope", 0)
        _, k = _record_bits(file, "model.layers.0.self_attn.rope", 1)
        _, v = _record_bits(file, "model.layers.0.self_attn.v_proj")
        batch, kv_heads, rows, dim = k.shape  # MLX's layout: [batch, heads, rows, head dim]
        values = mx.array(v.view(np.float32)).reshape(batch, rows, kv_heads, dim).transpose(0, 2, 1, 3)
        out = contracts.tiled_attention(mx.array(q.view(np.float32)), mx.array(k.view(np.float32)), values, scale=dim**-0.5, causal=True)
        row, before = _record_bits(file, "model.layers.0.self_attn.sdpa")
        tiled = np.array(out).view(np.uint32).reshape(before.shape)
        entry = file["index"][row]
        file[entry["path"].decode()][int(entry["offset"]) : int(entry["offset"]) + int(entry["nbytes"])] = tiled.view(np.uint8).ravel()
        index = file["index"][:]
        index["effective_contract_id"][row] = contracts.AUTO_QTILE64.encode()
        file["index"][...] = index
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(alignment="positions")))
        window = next(p.key for p in comparison.pairs if p.key.op == "sdpa" and p.key.layer == 0 and p.key.positions and p.key.positions[0] == 77)
        (op,) = run_to_end(iter_diagnose(n, o, comparison, DiagnoseOptions(mode="op", key=window))).ops
    assert (op.native_ran, op.native_declared_exact) == (contracts.AUTO_QTILE64, True)
    assert op.oracle_call_rows is None, "the oracle's single-range contract does not follow the call's rows: no note says it does"


def test_with_the_prompt_cut_differently_a_decode_steps_attention_calls_are_still_compared(cut_pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """Every call was left uncompared once the prompts were cut differently, though decode steps
    are cut alike: a decode step's call that ran another primitive read PARITY."""
    native, source = cut_pairs["segmented-vs-combined"]
    oracle = tmp_path / source.name
    shutil.copy(source, oracle)
    with h5py.File(oracle, "r+") as file:
        table, index = file["dispatch"][:], file["index"][:]
        (at, *_) = [row for row, seq in enumerate(table["index_seq"].tolist()) if index[seq]["step"] == 1]
        table["primitive"][at] = table["metal_primitive"][at] = b"sdpa_full"
        file["dispatch"][...] = table
    c = _compare(native, oracle)
    assert c.alignment.mode == "positions" and c.dispatch_not_compared == CUT_APART
    assert _finding(c)[:2] == ("DISPATCH-ONLY", "dispatch-only") and str(c.verdict.first.key) == "1:decode:0:sdpa@83"
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, c)
    assert timeline.differs.any(), "the timeline marks the call that differs"
    assert timeline_summary(timeline).split("; ")[1] == "1 op(s) dispatch differently", "said beside why the prompt's calls were not compared"
