"""Runs cut into different forward calls are compared position by position.

The Qwen3-VL seed's fourth defect: the native ran one combined prefill, llama.cpp ran three
cache-preserving calls (text-before Q=5, visual Q=1008, text-after Q=14). These captures are
that cut in miniature shape but real size: 1027 prompt positions, records in the canonical
layout, one bit flipped at position 700 where a test plants it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from backends.rerun.inputs import CapturedOps
from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.capture.records import Record
from sessions.commands import report as report_command
from sessions.compare.align_modes import POSITIONS
from sessions.compare.comparison import iter_compare
from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutTransform
from sessions.compare.mapped_record import MappedRecord, cut_problem
from sessions.compare.options import CompareOptions
from sessions.compare.pair_tensors import read_pair_bits
from sessions.compare.unaligned import NO_PARTNER, NO_POSITIONS
from sessions.compare.verdict import DIVERGENCE, PARITY
from sessions.progress import run_to_end
from viewer.cli import main
from viewer.comparison_view import unaligned_label

SEGMENTS = (("text-before", 5), ("visual", 1008), ("text-after", 14))
PROMPT = sum(n for _, n in SEGMENTS)
HIDDEN, HEADS, DIM = 8, 2, 4


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))


def _prompt_tensors(rng_seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    return {
        "embed": bf16_bits(rng.standard_normal((PROMPT, HIDDEN))),
        "q_rope": bf16_bits(rng.standard_normal((HEADS, PROMPT, DIM))),
        "layer_out": bf16_bits(rng.standard_normal((PROMPT, HIDDEN))),
        "logits": bf16_bits(rng.standard_normal((PROMPT, 16))),
    }


def _flip(bits: np.ndarray, position: int, axis: int = 0) -> np.ndarray:
    out = bits.copy()
    index = [0] * out.ndim
    index[axis] = position
    out[tuple(index)] ^= 1
    return out


def _call(data: dict[str, np.ndarray], first: int, stop: int, segment: str, recorded: bool, last: bool) -> list[T]:
    """One forward call's records: its rows of every tensor, logits only for the prompt's last row."""
    at = first if recorded else -1
    out = [
        T("embed", data["embed"][first:stop], segment=segment, dtype="bfloat16", position=at),
        T("q_rope", data["q_rope"][:, first:stop], segment=segment, layer=0, dtype="bfloat16", position=at),
        T("layer_out", data["layer_out"][first:stop], segment=segment, layer=0, dtype="bfloat16", position=at),
    ]
    if last:
        out.append(T("logits", data["logits"][stop - 1 : stop], segment=segment, dtype="bfloat16", position=stop - 1 if recorded else -1))
    return out


def combined(path: Path, data: dict[str, np.ndarray], recorded: bool = True) -> Path:
    return write_capture(path, "native", _call(data, 0, PROMPT, "prefill", recorded, True), [(0, 7, False)])


def segmented(path: Path, data: dict[str, np.ndarray], recorded: bool = True) -> Path:
    tensors: list[T] = []
    first = 0
    for i, (segment, rows) in enumerate(SEGMENTS):
        tensors += _call(data, first, first + rows, segment, recorded, i == len(SEGMENTS) - 1)
        first += rows
    return write_capture(path, "oracle", tensors, [(0, 7, False)])


def _compare(native: Path, oracle: Path, **options: object):
    with open_capture(native) as n, open_capture(oracle) as o:
        return run_to_end(iter_compare(n, o, CompareOptions(native_profile="canonical", oracle_profile="canonical", **options)))


@pytest.mark.parametrize("recorded", [True, False], ids=["positions recorded", "positions derived from call order"])
def test_identical_data_cut_into_one_call_or_three_segments_is_parity_position_by_position(tmp_path: Path, recorded: bool) -> None:
    data = _prompt_tensors()
    c = _compare(combined(tmp_path / "n.h5", data, recorded), segmented(tmp_path / "o.h5", data, recorded))
    assert c.verdict.word == PARITY
    assert c.alignment.mode == POSITIONS
    assert [p.key.text() for p in c.pairs if p.key.op == "layer_out"] == [
        "0:prefill:0:layer_out@0-4",
        "0:prefill:0:layer_out@5-1012",
        "0:prefill:0:layer_out@1013-1026",
    ]
    assert [p.key.text() for p in c.pairs if p.key.op == "logits"] == ["0:prefill:-1:logits@1026"]
    assert c.unaligned == []
    assert c.alignment.words() == "by position: native prefill 0-1026; oracle text-before 0-4, visual 5-1012, text-after 1013-1026"


@pytest.mark.parametrize("op, axis", [("layer_out", 0), ("q_rope", 1)], ids=["rows first", "heads rows dim"])
def test_one_flipped_bit_at_position_700_is_named_by_layer_op_and_position_on_every_surface(
    tmp_path: Path, op: str, axis: int, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _prompt_tensors()
    planted = {**data, op: _flip(data[op], 700, axis)}
    native, oracle = combined(tmp_path / "n.h5", planted), segmented(tmp_path / "o.h5", data)
    c = _compare(native, oracle)
    assert c.verdict.word == DIVERGENCE
    first = c.verdict.first
    assert first is not None and first.key == OpKey(0, "prefill", 0, op, 0, (5, 1013))
    assert first.detail.endswith("first at position 700")
    assert [p.key.text() for p in c.pairs if not p.metrics.bit_exact] == [f"0:prefill:0:{op}@5-1012"]

    json_path = tmp_path / "report.json"
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    code = report_command.run(
        parser.parse_args([str(native), str(oracle), "--native-profile", "canonical", "--oracle-profile", "canonical", "--json", str(json_path), "--no-cache"])
    )
    document = json.loads(json_path.read_text())
    assert code == 1
    assert document["verdict"]["first"]["key"] == f"0:prefill:0:{op}@5-1012"
    assert document["alignment"]["mode"] == "positions"
    commands = f"rerun --op 0:prefill:0:{op}@5-1012 --align positions, diagnose --op 0:prefill:0:{op}@5-1012 --align positions"
    assert f"First finding: diverged at 0:prefill:0:{op}@5-1012  ({commands})" in capsys.readouterr().out, "the commands find the key report printed"


def test_the_first_position_named_is_the_lowest_that_differs_in_any_head(tmp_path: Path) -> None:
    """q_rope is laid out heads first: the first differing element in storage order is head 0's
    at position 700, and the finding named it though head 1 differs at position 300."""
    data = _prompt_tensors()
    flipped = _flip(data["q_rope"], 700, 1)
    flipped[1, 300, 0] ^= 1
    native, oracle = combined(tmp_path / "n.h5", {**data, "q_rope": flipped}), segmented(tmp_path / "o.h5", data)
    first = _compare(native, oracle).verdict.first
    assert first is not None and first.key == OpKey(0, "prefill", 0, "q_rope", 0, (5, 1013))
    assert first.detail.endswith("first at position 300")


def test_the_pair_read_back_is_the_slice_of_the_combined_call_that_the_segment_computed(tmp_path: Path) -> None:
    data = _prompt_tensors()
    native, oracle = combined(tmp_path / "n.h5", _prompt_tensors(1)), segmented(tmp_path / "o.h5", data)
    c = _compare(native, oracle)
    pair = next(p for p in c.pairs if p.key.text() == "0:visual:0:q_rope@5-1012".replace("visual", "prefill"))
    with open_capture(native) as n, open_capture(oracle) as o:
        native_bits, oracle_bits, dtype = read_pair_bits(n, o, pair)
    assert dtype == "bfloat16"
    np.testing.assert_array_equal(native_bits, _prompt_tensors(1)["q_rope"][:, 5:1013])
    np.testing.assert_array_equal(oracle_bits, data["q_rope"][:, 5:1013])


def test_positions_only_one_run_holds_are_listed_and_the_rest_still_pairs(tmp_path: Path) -> None:
    data = _prompt_tensors()
    native = write_capture(tmp_path / "n.h5", "native", _call(data, 0, 1013, "prefill", True, False))
    oracle = segmented(tmp_path / "o.h5", data)
    c = _compare(native, oracle, alignment="positions")
    assert all(p.metrics.bit_exact for p in c.pairs)
    uncovered = [(u.side, u.name, u.reason, u.detail) for u in c.unaligned if u.name == "layer_out"]
    assert uncovered == [("oracle", "layer_out", NO_PARTNER, "no native record of layer_out holds positions 1013-1026")]


def test_a_step_without_recorded_positions_follows_the_call_before_it_where_that_call_was_recorded(tmp_path: Path) -> None:
    """A run whose prompt was recorded at positions 5-1026 (its first 5 cached) and whose decode
    steps record none: counted from 0, decode step 1 was placed at 1022, inside the prompt, and
    paired with the other run's prompt rows."""
    data = _prompt_tensors()
    decode = bf16_bits(np.random.default_rng(9).standard_normal((1, HIDDEN)))
    step = [T("layer_out", decode, step=1, segment="decode", layer=0, dtype="bfloat16")]
    native = write_capture(tmp_path / "n.h5", "native", _call(data, 5, PROMPT, "prefill", True, False) + step, [(0, 7, False), (1, 8, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", _call(data, 0, PROMPT, "prefill", False, False) + step, [(0, 7, False), (1, 8, False)])
    c = _compare(native, oracle, alignment="positions")
    assert c.alignment.native_calls == [f"prefill 5-{PROMPT - 1}", f"decode {PROMPT}"]
    assert all(p.metrics.bit_exact for p in c.pairs)
    assert OpKey(1, "decode", 0, "layer_out", 0, (PROMPT, PROMPT + 1)) in {p.key for p in c.pairs}
    assert {(u.side, u.key.positions) for u in c.unaligned} == {("oracle", (0, 5))}


def test_a_token_step_only_one_run_made_is_keyed_by_its_logits_record_on_every_surface(tmp_path: Path) -> None:
    """Keyed without the record's positions, the finding named a row neither the pairs nor the
    unaligned records had, so the window and `--op` could not find it."""
    data = _prompt_tensors()

    def decode(step: int) -> list[T]:
        return [T("logits", bf16_bits(np.full((1, 16), step, np.float32)), step=step, segment="decode", dtype="bfloat16")]

    native = write_capture(tmp_path / "n.h5", "native", _call(data, 0, PROMPT, "prefill", False, True) + decode(1), [(0, 7, False), (1, 8, False)])
    tensors = _call(data, 0, 5, "text-before", False, False) + _call(data, 5, PROMPT, "rest", False, True) + decode(1) + decode(2)
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors, [(0, 7, False), (1, 8, False), (2, 9, False)])
    c = _compare(native, oracle)
    assert c.alignment.mode == POSITIONS
    first = c.verdict.first
    assert first is not None and first.key == OpKey(2, "decode", -1, "logits", 0, (PROMPT + 1, PROMPT + 2))
    assert first.key in {u.key for u in c.unaligned}


def test_each_stretch_a_record_lacks_a_partner_for_is_a_row_named_by_its_positions(tmp_path: Path) -> None:
    """A record missing its partner for two stretches made two rows with one key and one label."""
    data = _prompt_tensors()
    tensors = _call(data, 5, 1013, "visual", True, False)
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors, [(0, 7, False)])
    c = _compare(combined(tmp_path / "n.h5", data), oracle, alignment="positions")
    rows = [(u.key.text(), unaligned_label(u)) for u in c.unaligned if u.name == "layer_out"]
    assert rows == [
        ("0:prefill:0:layer_out@0-4", "native: layer_out (step 0 prefill layer 0, positions 0–4)"),
        ("0:prefill:0:layer_out@1013-1026", "native: layer_out (step 0 prefill layer 0, positions 1013–1026)"),
    ]


def test_a_record_whose_partners_positions_two_records_claim_names_that_ambiguity_not_a_missing_partner(tmp_path: Path) -> None:
    """Both oracle records of visual positions 5-1012 are set aside as claimed twice; the native
    record that holds those positions was reported as having no oracle record there, and being
    native, that false sentence was the verdict's first finding on every surface."""
    data = _prompt_tensors()
    native = combined(tmp_path / "n.h5", data)
    tensors = _call(data, 0, 5, "text-before", True, False) + _call(data, 5, 1013, "visual", True, False)
    tensors += [T("layer_out", data["layer_out"][5:1013], segment="visual2", layer=0, dtype="bfloat16", position=5)]
    tensors += _call(data, 1013, PROMPT, "text-after", True, True)
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors, [(0, 7, False)])
    c = _compare(native, oracle, alignment="positions")
    first = c.verdict.first
    assert first is not None and first.key == OpKey(0, "prefill", 0, "layer_out", 0, (5, 1013))
    assert first.detail == (
        "native 'layer_out': key claimed twice (its oracle partner 'layer_out' (seq 5) is ambiguous: "
        "positions 5-1012 of layer_out are held by more than one oracle record)"
    )
    assert "no oracle record" not in " ".join(u.detail for u in c.unaligned)


def test_every_record_inside_a_longer_one_is_set_aside_with_the_positions_it_shares(tmp_path: Path) -> None:
    """Two short calls inside one long call: overlaps were looked for between neighbours alone,
    so the second short record, whose neighbour does not overlap it, was paired."""
    data = _prompt_tensors()
    tensors = _call(data, 0, PROMPT, "full", True, False) + _call(data, 10, 20, "c1", True, False) + _call(data, 30, 40, "c2", True, False)
    native = write_capture(tmp_path / "n.h5", "native", tensors, [(0, 7, False)])
    c = _compare(native, combined(tmp_path / "o.h5", data), alignment="positions")
    refused = [(u.segment, u.reason, u.detail) for u in c.unaligned if u.side == "native" and u.name == "layer_out"]
    assert refused == [
        ("full", "duplicate_key", "positions 10-19 of layer_out are held by more than one native record"),
        ("c1", "duplicate_key", "positions 10-19 of layer_out are held by more than one native record"),
        ("c2", "duplicate_key", "positions 30-39 of layer_out are held by more than one native record"),
    ]
    assert not any(p.key.segment in ("c1", "c2") for p in c.pairs)


def test_a_record_of_no_rows_holds_no_position_and_says_so_while_the_record_over_its_place_lacks_a_partner(tmp_path: Path) -> None:
    """An oracle record of 0 rows at position 700, inside the native's record of the same op:
    pairing them stopped the comparison with an AssertionError, and a 0-row record that
    overlapped nothing vanished from both the pairs and the unaligned list."""
    data = _prompt_tensors()
    native = write_capture(
        tmp_path / "n.h5",
        "native",
        _call(data, 0, PROMPT, "prefill", True, True) + [T("layer_out", data["layer_out"], segment="prefill", layer=1, dtype="bfloat16", position=0)],
        [(0, 7, False)],
    )
    empty = T("layer_out", data["layer_out"][:0], segment="visual", layer=1, dtype="bfloat16", position=700)
    tensors = _call(data, 0, 5, "text-before", True, False) + _call(data, 5, 1013, "visual", True, False) + [empty]
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors + _call(data, 1013, PROMPT, "text-after", True, True), [(0, 7, False)])
    c = _compare(native, oracle, alignment="positions")
    assert [(u.side, u.key.text(), u.reason) for u in c.unaligned if u.layer == 1] == [
        ("native", "0:prefill:1:layer_out@0-1026", NO_PARTNER),
        ("oracle", "0:visual:1:layer_out", NO_POSITIONS),
    ]
    native_row, oracle_row = (u for u in c.unaligned if u.layer == 1)
    assert oracle_row.detail == "its canonical shape [0, 8] has no rows, so it holds no token position"
    assert native_row.detail == f"its oracle partner 'layer_out' (seq {oracle_row.seq}) is unaligned itself: no token positions: {oracle_row.detail}"
    assert all(p.metrics.bit_exact for p in c.pairs) and len(c.pairs) == 10  # embed, q_rope and layer 0 per oracle call, and the logits


def test_a_set_aside_record_without_positions_is_named_only_for_the_positions_its_call_holds(tmp_path: Path) -> None:
    """The oracle's text-after layer_out has no positions of its own (one axis too many), and its
    visual call recorded no layer_out. Matched by step alone, it was named the partner of the
    native's visual positions, which its call never held."""
    data = _prompt_tensors()
    native = write_capture(tmp_path / "n.h5", "native", _call(data, 0, 1013, "prefill", True, True), [(0, 7, False)])
    visual = [t for t in _call(data, 5, 1013, "visual", True, False) if t.name != "layer_out"]
    after = [t for t in _call(data, 1013, PROMPT, "text-after", True, False) if t.name != "layer_out"]
    after.append(T("layer_out", data["layer_out"][None, 1013:PROMPT], segment="text-after", layer=0, dtype="bfloat16", position=1013))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _call(data, 0, 5, "text-before", True, False) + visual + after, [(0, 7, False)])
    c = _compare(native, oracle, alignment="positions")
    assert [(u.key.text(), u.why()) for u in c.unaligned if u.side == "native" and u.name == "layer_out"] == [
        ("0:prefill:0:layer_out@5-1012", "no partner: no oracle record of layer_out holds positions 5-1012"),
    ]
    whole = _compare(combined(tmp_path / "whole.h5", data), oracle, alignment="positions")
    (row,) = [u for u in whole.unaligned if u.side == "native" and u.name == "layer_out"]
    assert row.key.positions == (5, PROMPT) and row.detail.startswith("its oracle partner 'layer_out' (seq ") and "is unaligned itself: no token positions" in row.detail


def test_the_prompt_tail_fed_token_by_token_pairs_with_the_same_rows_of_one_prefill(tmp_path: Path) -> None:
    data = _prompt_tensors()
    fed = _call(data, 0, PROMPT - 4, "prefill", True, False)
    for position in range(PROMPT - 4, PROMPT):
        fed += _call(data, position, position + 1, f"feed-{position}", True, position == PROMPT - 1)
    native = combined(tmp_path / "n.h5", data)
    oracle = write_capture(tmp_path / "o.h5", "oracle", fed, [(0, 7, False)])
    c = _compare(native, oracle)
    assert c.verdict.word == PARITY
    assert [p.key.text() for p in c.pairs if p.key.op == "embed"][-2:] == ["0:prefill:-1:embed@1025", "0:prefill:-1:embed@1026"]


def test_paired_by_calls_a_record_whose_partner_is_not_stored_by_batch_row_says_so(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = bf16_bits(rng.standard_normal((1, 6, HIDDEN)))
    alone = write_capture(tmp_path / "alone.h5", "native", [T("model.layers.0", rows, layer=0, dtype="bfloat16")])
    batched = write_capture(
        tmp_path / "batch.h5", "oracle", [T("model.layers.0", bf16_bits(rng.standard_normal((6, 6, HIDDEN))), layer=0, dtype="bfloat16")], batch_size=8, batch_row=3
    )
    with open_capture(alone) as n, open_capture(batched) as o:
        c = run_to_end(iter_compare(n, o, CompareOptions(native_profile="mlx-lm", oracle_profile="mlx-lm", alignment="calls")))
    assert [(u.side, u.why()) for u in c.unaligned] == [
        ("native", "no partner: its oracle partner 'model.layers.0' (seq 0) is unaligned itself: not stored by batch row: its stored axis 0 is 6, not the run's batch of 8"),
        ("oracle", "not stored by batch row: its stored axis 0 is 6, not the run's batch of 8"),
    ]


def test_a_side_whose_profile_maps_no_record_is_paired_by_calls_and_says_it_made_no_call(tmp_path: Path) -> None:
    """All of an empty list's records hold positions: `auto` chose positions for it, and the text ended
    in "oracle "; then it said "cut differently" of a run nothing said how it was cut."""
    data = _prompt_tensors()
    with open_capture(combined(tmp_path / "n.h5", data)) as n, open_capture(segmented(tmp_path / "o.h5", data)) as o:
        c = run_to_end(iter_compare(n, o, CompareOptions(native_profile="canonical", oracle_profile="mlx-lm")))
    assert (c.alignment.mode, c.alignment.words()) == (
        "calls", "by calls (the oracle run has no record its profile maps to an op): native prefill 0-1026; oracle no call (no record with known positions)"
    )


def test_a_batched_record_whose_capture_does_not_say_it_is_batched_is_not_cut_along_its_batch_axis(tmp_path: Path) -> None:
    """[4, rows, hidden] where layer_out is `rows hidden`: axis 0 was taken for the token rows,
    which made up calls ("prefill 0-10") and listed records twice."""
    data = _prompt_tensors()
    native = combined(tmp_path / "n.h5", data)
    stacked = np.stack([data["layer_out"][:PROMPT]] * 4)
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", stacked, segment="prefill", layer=0, dtype="bfloat16", position=0)], [(0, 7, False)])
    c = _compare(native, oracle, alignment="positions")
    (refused,) = [u for u in c.unaligned if u.side == "oracle"]
    assert refused.why() == (
        f"no token positions: its canonical shape [4, {PROMPT}, {HIDDEN}] has 3 axes where layer_out has 2 (rows hidden), so which "
        "holds the token positions is unknown (a batched run whose capture does not say so with batch_size?)"
    )
    assert c.alignment.oracle_calls == [] and [u.name for u in c.unaligned if u.side == "native"].count("layer_out") == 1


def test_records_that_cannot_be_cut_pair_whole_where_both_runs_hold_the_same_positions(tmp_path: Path) -> None:
    """A q8_0 record cannot be cut, but a decode step's holds the same position on both sides and
    needs no cut: it was refused all the same, so such a pair could never reach PARITY."""
    blocks = np.arange(5 * 34, dtype=np.uint8).reshape(5, 34)

    def quantized(a: int, b: int, segment: str, step: int = 0) -> T:
        return T("ffn_down", blocks[a:b].copy(), step=step, segment=segment, layer=0, dtype="q8_0", logical_shape=(b - a, 32), position=a)

    native = write_capture(tmp_path / "n.h5", "native", [quantized(0, 4, "prefill"), quantized(4, 5, "decode", 1)], [(0, 7, False), (1, 8, False)])
    oracle = write_capture(
        tmp_path / "o.h5", "oracle", [quantized(0, 2, "first"), quantized(2, 4, "second"), quantized(4, 5, "decode", 1)], [(0, 7, False), (1, 8, False)]
    )
    c = _compare(native, oracle, alignment="positions")
    assert [p.key.text() for p in c.pairs] == ["1:decode:0:ffn_down@4"] and c.pairs[0].metrics.bit_exact
    assert sorted((u.side, u.seq, u.why()) for u in c.unaligned) == [
        ("native", 0, "no token positions: quantized blocks cannot be cut into positions"),
        ("oracle", 0, "no token positions: quantized blocks cannot be cut into positions"),
        ("oracle", 1, "no token positions: quantized blocks cannot be cut into positions"),
    ]


def test_a_request_alone_compares_with_its_row_of_a_batch_and_ignores_the_other_requests(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    batch = bf16_bits(rng.standard_normal((8, 6, HIDDEN)))
    alone = write_capture(tmp_path / "alone.h5", "native", [T("model.layers.0", batch[3:4].copy(), layer=0, dtype="bfloat16")])
    other_rows_differ = batch.copy()
    other_rows_differ[2] ^= 1
    batched = write_capture(
        tmp_path / "batch.h5", "oracle", [T("model.layers.0", other_rows_differ, layer=0, dtype="bfloat16")], batch_size=8, batch_row=3
    )
    with open_capture(alone) as n, open_capture(batched) as o:
        c = run_to_end(iter_compare(n, o, CompareOptions(native_profile="mlx-lm", oracle_profile="mlx-lm")))
    assert c.verdict.word == PARITY and len(c.pairs) == 1
    assert c.alignment.words() == "by the same calls (oracle is row 3 of a batch of 8)"

    own_row_differs = batch.copy()
    own_row_differs[3, 4, 5] ^= 1
    batched = write_capture(
        tmp_path / "batch2.h5", "oracle", [T("model.layers.0", own_row_differs, layer=0, dtype="bfloat16")], batch_size=8, batch_row=3
    )
    with open_capture(alone) as n, open_capture(batched) as o:
        c = run_to_end(iter_compare(n, o, CompareOptions(native_profile="mlx-lm", oracle_profile="mlx-lm")))
    assert c.verdict.word == DIVERGENCE
    assert c.pairs[0].metrics.first_difference is not None and c.pairs[0].metrics.first_difference.coord == [4, 5]


def test_a_stacked_batch_gives_each_request_its_record_without_the_added_axis(tmp_path: Path) -> None:
    """llama.cpp's records have no batch axis: a batched run stacks the requests along an added axis 0
    (`batch_stacked`), so row 3 is the request's record itself, read through its layout and cut by position."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((8, 6, HEADS, DIM)).astype(np.float32)
    out = rng.standard_normal((8, 6, HIDDEN)).astype(np.float32)
    q[3, 4, 1, 2] = np.nextafter(q[3, 4, 1, 2], np.float32(np.inf))
    alone_q = rng.standard_normal((6, HEADS, DIM)).astype(np.float32)
    alone_q[:4], alone_q[4:] = q[3, :4], q[3, 4:]
    alone_q[4, 1, 2] = np.nextafter(q[3, 4, 1, 2], np.float32(-np.inf))
    halves = [(0, 4, "prefill.0"), (4, 6, "prefill.1")]
    alone = write_capture(
        tmp_path / "alone.h5", "native",
        [t for a, b, seg in halves for t in (
            T("Qcur-0", alone_q[a:b].copy(), segment=seg, layer=0, kernel_id="ROPE", position=a),
            T("l_out-0", out[3, a:b].copy(), segment=seg, layer=0, kernel_id="ADD", position=a),
            T("ffn_out-0", out[3, a:b].copy(), segment=seg, layer=0, kernel_id="MUL_MAT", position=a),
        )],
    )  # fmt: skip
    whole = out.reshape(48, HIDDEN)
    batched = write_capture(
        tmp_path / "batch.h5", "oracle",
        [T("Qcur-0", q, layer=0, kernel_id="ROPE", position=0), T("l_out-0", out, layer=0, kernel_id="ADD", position=0),
         T("ffn_out-0", whole, layer=0, kernel_id="MUL_MAT", position=0)],
        batch_size=8, batch_row=3, batch_stacked=True,
    )  # fmt: skip
    with open_capture(alone) as n, open_capture(batched) as o:
        c = run_to_end(iter_compare(n, o, CompareOptions(native_profile="llama.cpp", oracle_profile="llama.cpp")))
        first = c.pairs[c.first_divergence]
        native_bits, oracle_bits, _ = read_pair_bits(n, o, first)
    assert c.alignment.words() == "by position (oracle is row 3 of a batch of 8): native prefill.0 0-3, prefill.1 4-5; oracle prefill 0-5"
    assert [(p.key.text(), p.verdict.value) for p in c.pairs] == [
        ("0:prefill.0:0:q_rope@0-3", "bit-exact"), ("0:prefill.0:0:layer_out@0-3", "bit-exact"),
        ("0:prefill.1:0:q_rope@4-5", "diverged"), ("0:prefill.1:0:layer_out@4-5", "bit-exact"),
    ]  # fmt: skip
    assert first.metrics.first_difference is not None and first.metrics.first_difference.coord == [1, 0, 2]
    assert native_bits.shape == oracle_bits.shape == (HEADS, 2, DIM)
    assert [(u.side, u.name, u.reason, u.detail) for u in c.unaligned if u.side == "oracle"] == [
        ("oracle", "ffn_out-0", "not_batched", "its stored axis 0 is 48, not the run's batch of 8")
    ]


def test_a_batch_stacked_attribute_other_than_0_or_1_is_refused(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "x.h5", "oracle", [T("l_out-0", np.zeros((2, 1, HIDDEN), np.float32), layer=0)], batch_size=2, batch_row=1)
    with h5py.File(path, "r+", locking=False) as file:
        file.attrs.create("batch_stacked", np.int64(2))
    with pytest.raises(CaptureError, match="batch_stacked.*is 2; the format allows 0 or 1"):
        with open_capture(path):
            pass


def test_a_key_with_positions_reads_back_from_its_text() -> None:
    key = OpKey(0, "prefill", 3, "ffn_down", 1, (5, 1013))
    assert key.text() == "0:prefill:3:ffn_down#1@5-1012"
    assert OpKey.parse(key.text()) == key
    assert OpKey.parse("0:prefill:3:ffn_down@700") == OpKey(0, "prefill", 3, "ffn_down", 0, (700, 701))
    assert key.label() == "step 0 prefill layer 3 ffn_down#1 positions 5–1012"
    with pytest.raises(ValueError, match="positions must be integers"):
        OpKey.parse("0:prefill:3:ffn_down@a-b")


def test_pairs_shipped_to_workers_as_rows_are_built_again_equal_from_the_workers_own_captures(tmp_path: Path) -> None:
    """Workers get each pair as a row of plain values (seqs, keys, shapes, layouts, windows) and
    build it again from the captures they open: pairs cut by position, a request's row of a batch
    and a manual pairing come back exactly as alignment made them."""
    from sessions.compare.align import ManualPair, align
    from sessions.compare.key import RecordKey
    from sessions.compare.mapped_record import batch_of
    from sessions.compare.parallel_compare import rebuilt, shipped
    from sessions.compare.profiles import resolve_profile

    data = _prompt_tensors()
    rng = np.random.default_rng(3)
    batch = bf16_bits(rng.standard_normal((8, 6, HIDDEN)))
    cases = {
        "cut by position": (combined(tmp_path / "c.h5", data), segmented(tmp_path / "s.h5", data), "canonical", ()),
        "a row of a batch": (
            write_capture(tmp_path / "alone.h5", "native", [T("model.layers.0", batch[3:4].copy(), layer=0, dtype="bfloat16")]),
            write_capture(tmp_path / "batch.h5", "oracle", [T("model.layers.0", batch, layer=0, dtype="bfloat16")], batch_size=8, batch_row=3),
            "mlx-lm",
            (),
        ),
        "paired by hand": (
            combined(tmp_path / "c2.h5", data),
            combined(tmp_path / "c3.h5", data),
            "canonical",
            (ManualPair(RecordKey(0, "prefill", 0, "layer_out"), RecordKey(0, "prefill", 0, "layer_out"), "checked by hand"),),
        ),
    }
    made = {}
    for case, (native, oracle, profile, overrides) in cases.items():
        with open_capture(native) as n, open_capture(oracle) as o:
            made[case] = align(
                list(n.records), list(o.records), resolve_profile(profile), resolve_profile(profile),
                overrides=overrides, native_batch=batch_of(n), oracle_batch=batch_of(o),
            ).pairs
            rows = [shipped(pair) for pair in made[case]]
        with open_capture(native) as n, open_capture(oracle) as o:
            assert rebuilt(rows, n, o) == made[case], case
    assert any(p.native.window is not None for p in made["cut by position"]), "positions cut the combined call's records"
    assert all(p.oracle.batch is not None and p.oracle.batch.row == 3 for p in made["a row of a batch"])
    assert [p.manual_reason for p in made["paired by hand"] if p.manual_reason] == ["checked by hand"]


def test_a_layout_that_merges_the_rows_with_another_axis_names_both_axes_it_merges() -> None:
    """The message named `rows` as the axis the rows were merged with, for `(x rows)`."""
    record = Record(0, 0, "prefill", 0, "layer_out", 0, "bfloat16", (2, 4, 8), "/t", "", "", "", 0, 0)
    layout = LayoutTransform.parse("x rows hidden -> (x rows) hidden")
    mapped = MappedRecord(record, OpKey(0, "prefill", 0, "layer_out"), layout, (8, 8))
    assert cut_problem(mapped) == (
        "its layout 'x rows hidden -> (x rows) hidden' merges x and rows into the token rows, so one position's elements are not one slice"
    )


def test_a_rerun_by_position_missing_an_input_says_it_looked_for_the_records_paired_with_those_positions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The oracle holds positions 5-1012 in its call `visual`: "looked at step 0 prefill" named a call it never made."""
    data = _prompt_tensors()
    native, oracle = combined(tmp_path / "n.h5", data), segmented(tmp_path / "o.h5", data)
    args = ["rerun", str(native), str(oracle), "--op", "0:prefill:0:layer_out@5-1012", "--native-profile", "canonical", "--oracle-profile", "canonical"]
    assert main(args) == 2
    assert capsys.readouterr().err.rstrip().endswith("(looked for the records paired with step 0 prefill positions 5-1012)")


def test_a_rerun_input_left_unpaired_for_some_positions_says_why_not_that_there_is_none(tmp_path: Path) -> None:
    """Each stretch without a partner is keyed by its positions; the rerun's lookup by the call's key missed them."""
    data = _prompt_tensors()
    tensors = _call(data, 0, 1013, "visual", True, False) + [t for t in _call(data, 1013, PROMPT, "text-after", True, True) if t.name != "layer_out"]
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors, [(0, 7, False)])
    native = combined(tmp_path / "n.h5", data)
    c = _compare(native, oracle, alignment="positions")
    with open_capture(native) as n:
        ops = CapturedOps.build(n, "native", {}, c.unaligned)
        assert ops.lacks(0, "prefill", 0, "layer_out") == (
            "layer_out, but the comparison left it unpaired (no partner: no oracle record of layer_out holds positions 1013-1026)"
        )


SMALL = 12
"""The prompt of the small runs below: calls of a few records each, decode steps after it."""


def _small(first: int, stop: int, segment: str, step: int = 0, recorded: bool = True, logits: bool = True, logits_only: bool = False) -> list[T]:
    """One call of a small run: its rows of the embedding and a layer's output, and the logits of its last row.
    `logits_only`: only the logits record says where it is (the others read -1)."""
    data = _prompt_tensors(1)
    at = first if recorded and not logits_only else -1
    out = [
        T("embed", data["embed"][first:stop], step=step, segment=segment, dtype="bfloat16", position=at),
        T("layer_out", data["layer_out"][first:stop], step=step, segment=segment, layer=0, dtype="bfloat16", position=at),
    ]
    if logits:
        out.append(T("logits", data["logits"][stop - 1 : stop], step=step, segment=segment, dtype="bfloat16", position=stop - 1 if recorded else -1))
    return out


def _decode(steps: list[int], recorded: bool = False) -> list[T]:
    return [t for s in steps for t in _small(SMALL + s - 1, SMALL + s, "decode", step=s, recorded=recorded)]


def _tokens(steps: list[int]) -> list[tuple[int, int, bool]]:
    return [(s, 7 + s, False) for s in steps]


def test_a_decode_step_whose_position_is_not_recorded_sits_at_prompt_length_plus_step_minus_one(tmp_path: Path) -> None:
    """Placed where the call before it ended, step 3 of a run that lacks step 2 sat on step 2's
    position and was compared with the other run's step 2: 41 ops "diverged" of identical runs."""
    native = write_capture(tmp_path / "n.h5", "native", _small(0, SMALL, "prefill", recorded=False) + _decode([1, 3]), _tokens([0, 1, 3]))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _small(0, 8, "text", recorded=False, logits=False) + _small(8, SMALL, "image", recorded=False) + _decode([1, 2, 3]), _tokens([0, 1, 2, 3]))
    c = _compare(native, oracle, alignment="positions")
    assert all(p.metrics.bit_exact for p in c.pairs)
    assert {p.key.text() for p in c.pairs if p.key.step == 3} == {"3:decode:-1:embed@14", "3:decode:0:layer_out@14", "3:decode:-1:logits@14"}
    assert {(u.side, u.key.step) for u in c.unaligned} == {("oracle", 2)}, "only the step the native lacks is without a partner"


def test_a_prompt_recorded_out_of_order_and_a_call_whose_logits_alone_say_where_it_is_are_placed_where_they_are(tmp_path: Path) -> None:
    """The prompt's calls recorded 8-11 then 0-7 put the unrecorded decode steps at 8 and 9,
    inside the prompt; a call whose logits alone were recorded (at its last row, 11) began there."""
    native = write_capture(tmp_path / "n.h5", "native", _small(0, SMALL, "prefill") + _decode([1, 2], recorded=True), _tokens([0, 1, 2]))
    shuffled = _small(8, SMALL, "text-after") + _small(0, 8, "text-before", logits=False) + _decode([1, 2])
    oracle = write_capture(tmp_path / "o.h5", "oracle", shuffled, _tokens([0, 1, 2]))
    assert _compare(native, oracle, alignment="positions").verdict.word == PARITY
    logits_only = write_capture(tmp_path / "l.h5", "oracle", _small(0, SMALL, "prefill", logits_only=True) + _decode([1, 2], recorded=True), _tokens([0, 1, 2]))
    c = _compare(native, logits_only, alignment="positions")
    assert c.verdict.word == PARITY and not c.unaligned


def test_an_empty_call_in_one_run_computes_nothing_and_is_no_finding(tmp_path: Path) -> None:
    """An oracle whose text-before segment holds no rows (an image-only prompt) against a run
    that has none: its 0-row records were each a finding, "has no rows", and identical runs DIVERGED."""
    native = write_capture(tmp_path / "n.h5", "native", _small(0, SMALL, "prefill") + _decode([1], recorded=True), _tokens([0, 1]))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _small(0, 0, "text-before", logits=False) + _small(0, SMALL, "visual") + _decode([1], recorded=True), _tokens([0, 1]))
    c = _compare(native, oracle, alignment="positions")
    assert (c.verdict.word, c.unaligned) == (PARITY, [])
    assert c.alignment.oracle_calls[:2] == ["text-before (no rows)", "visual 0-11"]


@pytest.mark.parametrize("alignment", ["auto", "calls", "positions"])
def test_logits_of_every_row_against_logits_of_the_last_row_compare_the_last_row(tmp_path: Path, alignment: str) -> None:
    """llama.cpp by default and vLLM compute logits only for the row they sample from: against a
    run that records every row's, the whole records' shapes differed ([12, 16] vs [1, 16]) by
    calls, and rows 0-10 lacked a partner by position: identical runs read as DIVERGENCE."""
    data = _prompt_tensors(1)

    def run(path: Path, role: str, every_row: bool) -> Path:
        rows = slice(0, SMALL) if every_row else slice(SMALL - 1, SMALL)
        logits = T("logits", data["logits"][rows], segment="prefill", dtype="bfloat16", position=rows.start)
        return write_capture(path, role, _small(0, SMALL, "prefill", logits=False) + [logits] + _decode([1], recorded=True), _tokens([0, 1]))

    c = _compare(run(tmp_path / "n.h5", "native", True), run(tmp_path / "o.h5", "oracle", False), alignment=alignment)
    assert (c.verdict.word, c.unaligned) == (PARITY, [])
    (logits,) = [p for p in c.pairs if p.key.op == "logits" and p.key.step == 0]
    assert logits.metrics.shape == [1, 16], "the last row both computed"


def test_a_steps_logits_agreement_is_of_the_row_its_token_comes_from_never_of_an_earlier_one(tmp_path: Path) -> None:
    """The oracle recorded logits for positions 0-7 and fed the prompt's tail one token per call
    without them: step 0's "logits differ at the oracle's token" was position 7's, beside a token
    emitted at position 11."""
    data = _prompt_tensors(1)
    nudged = data["logits"].copy()
    nudged[7] ^= 1
    native = write_capture(
        tmp_path / "n.h5", "native",
        _small(0, SMALL, "prefill", logits=False) + [T("logits", nudged[:SMALL], segment="prefill", dtype="bfloat16", position=0)], [(0, 7, False)],
    )
    fed = [t for at in range(8, SMALL) for t in _small(at, at + 1, f"feed-{at}", logits=False)]
    oracle = write_capture(
        tmp_path / "o.h5", "oracle",
        _small(0, 8, "prefill", logits=False) + [T("logits", data["logits"][:8], segment="prefill", dtype="bfloat16", position=0)] + fed, [(0, 7, False)],
    )
    c = _compare(native, oracle, alignment="positions")
    (step,) = c.tokens.steps
    assert step.logits is None, "no pair holds position 11, where the token comes from"
    assert any(p.key.op == "logits" and not p.metrics.bit_exact for p in c.pairs), "position 7's difference is still a finding of its own"


def test_every_rows_logits_of_a_prompt_split_in_chunks_against_the_last_rows_of_one_call_are_no_finding(tmp_path: Path) -> None:
    """Judged by the chunked run's own calls, its first chunk's rows 0-7 ended that chunk and were
    a finding: identical runs read as DIVERGENCE."""
    data = _prompt_tensors(1)

    def logits(rows: slice, segment: str) -> T:
        return T("logits", data["logits"][rows], segment=segment, dtype="bfloat16", position=rows.start)

    chunked = _small(0, 8, "chunk-a", logits=False) + [logits(slice(0, 8), "chunk-a")] + _small(8, SMALL, "chunk-b", logits=False) + [logits(slice(8, SMALL), "chunk-b")]
    native = write_capture(tmp_path / "n.h5", "native", chunked + _decode([1], recorded=True), _tokens([0, 1]))
    oracle = write_capture(tmp_path / "o.h5", "oracle", _small(0, SMALL, "prefill") + _decode([1], recorded=True), _tokens([0, 1]))
    for pair in ((native, oracle), (oracle, native)):
        c = _compare(*pair, alignment="positions")
        assert (c.verdict.word, c.unaligned) == (PARITY, [])
