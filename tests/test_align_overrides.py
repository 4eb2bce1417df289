"""The user's alignment overrides: manual pairs and breaks, named by record identity, never ignored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.opening import open_capture
from sessions.compare.align import ManualBreak, ManualPair
from sessions.compare.comparison import iter_compare
from sessions.compare.document import dumps, loads
from sessions.compare.in_child import options_from_json, options_to_json
from sessions.compare.key import RecordKey
from sessions.compare.options import CompareOptions
from sessions.compare.result_cache import iter_compare_cached
from sessions.compare.unaligned import (
    MANUAL_BREAK,
    NO_PARTNER,
    NO_RULE,
    OVERRIDE_MISSING,
    OVERRIDE_UNUSABLE,
    SHAPE_MISMATCH,
)
from sessions.compare.verdict import DIVERGENCE, PARITY, Kind
from sessions.investigation.model import (
    AlignmentOverride,
    RecordRef,
    overrides_for_pair,
)
from sessions.progress import run_to_end

ROWS, WIDTH = 3, 8


def _bits(seed: int, shape: tuple[int, ...] = (ROWS, WIDTH)) -> np.ndarray:
    return bf16_bits(np.random.default_rng(seed).standard_normal(shape))


def _captures(tmp_path: Path, oracle_rope_layer: int = 0, native_prefix: list[T] | None = None) -> tuple[Path, Path]:
    """A q_proj and an ffn_down pair at layer 0; the oracle's ffn_down sits at `oracle_rope_layer`."""
    native = [*(native_prefix or []), T("q_proj", _bits(1), layer=0, dtype="bfloat16"), T("ffn_down", _bits(2), layer=0, dtype="bfloat16")]
    oracle = [T("q_proj", _bits(1), layer=0, dtype="bfloat16"), T("ffn_down", _bits(2), layer=oracle_rope_layer, dtype="bfloat16")]
    return write_capture(tmp_path / "n.h5", "native", native), write_capture(tmp_path / "o.h5", "oracle", oracle)


def _compare(native: Path, oracle: Path, *overrides: ManualPair | ManualBreak):  # type: ignore[no-untyped-def]
    options = CompareOptions(native_profile="canonical", oracle_profile="canonical", overrides=overrides)
    with open_capture(native) as n, open_capture(oracle) as o:
        return run_to_end(iter_compare(n, o, options))


def test_breaking_a_pair_makes_both_records_unaligned_with_the_users_reason(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path)
    comparison = _compare(native, oracle, ManualBreak(RecordKey(0, "prefill", 0, "ffn_down"), "oracle fuses the FFN differently"))
    assert [p.key.op for p in comparison.pairs] == ["q_proj"]
    assert [(u.side, u.name, u.reason, u.detail) for u in comparison.unaligned] == [
        ("native", "ffn_down", MANUAL_BREAK, "oracle fuses the FFN differently"),
        ("oracle", "ffn_down", MANUAL_BREAK, "oracle fuses the FFN differently"),
    ]
    assert comparison.verdict.word == DIVERGENCE


def test_a_reason_from_a_saved_session_reaches_every_finding_with_its_control_characters_escaped(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path)
    forged = "fused\x1b[2J\nPARITY: all good"
    comparison = _compare(native, oracle, ManualBreak(RecordKey(0, "prefill", 0, "ffn_down"), forged))
    assert [u.detail for u in comparison.unaligned] == ["fused\\x1b[2J\\nPARITY: all good"] * 2
    assert comparison.verdict.first is not None and "\n" not in comparison.verdict.first.detail


def test_a_manual_pair_joins_records_the_profiles_cannot_and_carries_its_reason(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path, oracle_rope_layer=1)
    automatic = _compare(native, oracle)
    assert sorted((u.side, u.reason) for u in automatic.unaligned) == [("native", NO_PARTNER), ("oracle", NO_PARTNER)]
    pair = ManualPair(RecordKey(0, "prefill", 0, "ffn_down"), RecordKey(0, "prefill", 1, "ffn_down"), "oracle numbers layers from 1")
    comparison = _compare(native, oracle, pair)
    assert comparison.unaligned == []
    assert comparison.verdict.word == PARITY
    manual = [p for p in comparison.pairs if p.manual_reason is not None]
    assert [(p.native_name, p.oracle_name, p.manual_reason, p.metrics.bit_exact) for p in manual] == [
        ("ffn_down", "ffn_down", "oracle numbers layers from 1", True)
    ]
    assert [p.manual_reason for p in loads(dumps(comparison)).pairs] == [None, "oracle numbers layers from 1"]


def test_an_override_still_names_the_same_records_after_a_recapture_shifts_every_seq(tmp_path: Path) -> None:
    pair = ManualPair(RecordKey(0, "prefill", 0, "ffn_down"), RecordKey(0, "prefill", 1, "ffn_down"), "layer offset")
    first = _compare(*_captures(tmp_path, oracle_rope_layer=1), pair)
    shifted = _compare(*_captures(tmp_path, oracle_rope_layer=1, native_prefix=[T("embed", _bits(9), dtype="bfloat16")]), pair)
    before = next(p for p in first.pairs if p.manual_reason)
    after = next(p for p in shifted.pairs if p.manual_reason)
    assert after.native_seq == before.native_seq + 1
    assert (after.native_name, after.oracle_name, after.oracle_seq) == (before.native_name, before.oracle_name, before.oracle_seq)


def test_an_override_naming_a_record_that_is_not_there_is_reported_and_the_rest_still_aligns(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path)
    gone = RecordKey(0, "prefill", 0, "ffn_down", occurrence=3)
    comparison = _compare(
        native, oracle, ManualBreak(gone, "stale"), ManualPair(RecordKey(0, "prefill", 0, "q_proj"), gone, "stale pair")
    )
    assert [p.key.op for p in comparison.pairs] == ["q_proj", "ffn_down"]
    assert [(u.side, u.seq, u.name, u.occurrence, u.reason) for u in comparison.unaligned] == [
        ("native", -1, "ffn_down", 3, OVERRIDE_MISSING),
        ("oracle", -1, "ffn_down", 3, OVERRIDE_MISSING),
    ]
    assert "stale pair" in comparison.unaligned[1].detail
    assert comparison.verdict.word == DIVERGENCE
    assert comparison.verdict.first is not None and comparison.verdict.first.kind == Kind.UNALIGNED
    assert comparison.verdict.first.detail == f"native 'ffn_down': manual override names no record here ({comparison.unaligned[0].detail})", "the headline says why, not only that"


def test_the_last_override_of_a_native_record_replaces_the_earlier_ones(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path)
    ffn = RecordKey(0, "prefill", 0, "ffn_down")
    comparison = _compare(native, oracle, ManualBreak(ffn, "looked wrong"), ManualPair(ffn, ffn, "it was right after all"))
    assert [(p.key.op, p.manual_reason) for p in comparison.pairs] == [("q_proj", None), ("ffn_down", "it was right after all")]
    assert comparison.unaligned == []


def test_an_oracle_record_paired_by_hand_twice_keeps_its_first_pairing_and_reports_the_second(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path, oracle_rope_layer=1)
    n_q, n_ffn, o_ffn = RecordKey(0, "prefill", 0, "q_proj"), RecordKey(0, "prefill", 0, "ffn_down"), RecordKey(0, "prefill", 1, "ffn_down")
    comparison = _compare(native, oracle, ManualPair(n_ffn, o_ffn, "first"), ManualPair(n_q, o_ffn, "second"))
    assert [(p.key.op, p.manual_reason) for p in comparison.pairs] == [("q_proj", None), ("ffn_down", "first")]
    assert [(u.side, u.seq, u.reason) for u in comparison.unaligned] == [("oracle", -1, OVERRIDE_UNUSABLE)]
    assert "already manually paired" in comparison.unaligned[0].detail


def test_a_manual_pair_of_different_shapes_is_refused_like_an_automatic_one(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "n.h5", "native", [T("ffn_down", _bits(1), layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("ffn_down", _bits(1, (ROWS, 4)), layer=2, dtype="bfloat16")])
    comparison = _compare(native, oracle, ManualPair(RecordKey(0, "prefill", 0, "ffn_down"), RecordKey(0, "prefill", 2, "ffn_down"), "try it"))
    assert comparison.pairs == []
    assert [(u.side, u.reason) for u in comparison.unaligned] == [("native", SHAPE_MISMATCH), ("oracle", SHAPE_MISMATCH)]
    assert "manual pairing: try it" in comparison.unaligned[0].detail


def test_a_record_whose_partner_the_user_paired_elsewhere_says_so_rather_than_that_it_has_none(tmp_path: Path) -> None:
    layers = [T("ffn_down", _bits(layer), layer=layer, dtype="bfloat16") for layer in (0, 1)]
    native, oracle = write_capture(tmp_path / "n.h5", "native", layers), write_capture(tmp_path / "o.h5", "oracle", layers)
    comparison = _compare(native, oracle, ManualPair(RecordKey(0, "prefill", 1, "ffn_down"), RecordKey(0, "prefill", 0, "ffn_down"), "suspect"))
    assert [(u.side, u.layer, u.reason) for u in comparison.unaligned] == [("native", 0, NO_PARTNER), ("oracle", 1, NO_PARTNER)]
    assert comparison.unaligned[0].detail == (
        "the oracle record that would pair with it, 'ffn_down' (seq 0), is manually paired with native 'ffn_down' (seq 1) (suspect)"
    )
    assert comparison.unaligned[1].detail == (
        "the native record that would pair with it, 'ffn_down' (seq 1), is manually paired with oracle 'ffn_down' (seq 0) (suspect)"
    )


def test_by_position_a_record_whose_positions_the_user_paired_elsewhere_says_so(tmp_path: Path) -> None:
    rows = _bits(5, (8, WIDTH))
    native = write_capture(
        tmp_path / "n.h5", "native",
        [T("layer_out", rows[a:b], segment=segment, layer=0, dtype="bfloat16", position=a) for segment, a, b in (("prefill-a", 0, 4), ("prefill-b", 4, 8))],
    )
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", rows, layer=0, dtype="bfloat16", position=0)])
    options = CompareOptions(
        native_profile="canonical", oracle_profile="canonical", alignment="positions",
        overrides=(ManualPair(RecordKey(0, "prefill-b", 0, "layer_out"), RecordKey(0, "prefill", 0, "layer_out"), "check the tail"),),
    )
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, options))
    alone = next(u for u in comparison.unaligned if u.segment == "prefill-a")
    assert (alone.reason, alone.detail) == (
        NO_PARTNER,
        "the oracle record that would pair with it, 'layer_out' (seq 0), is manually paired with native 'layer_out' (seq 1) (check the tail)",
    )


def test_overrides_are_part_of_the_cache_key_and_cross_the_process_boundary(tmp_path: Path) -> None:
    native, oracle = _captures(tmp_path)
    broken = CompareOptions(native_profile="canonical", oracle_profile="canonical", overrides=(ManualBreak(RecordKey(0, "prefill", 0, "ffn_down"), "why"),))
    plain = CompareOptions(native_profile="canonical", oracle_profile="canonical")
    assert options_from_json(options_to_json(broken)) == broken
    cache = tmp_path / "cache"
    with open_capture(native) as n, open_capture(oracle) as o:
        assert len(run_to_end(iter_compare_cached(n, o, plain, cache)).pairs) == 2
        assert [p.label for p in iter_compare_cached(n, o, broken, cache)] != ["cached result"]
        assert len(run_to_end(iter_compare_cached(n, o, broken, cache)).pairs) == 1
        assert len(run_to_end(iter_compare_cached(n, o, plain, cache)).pairs) == 2


def test_a_manual_pair_needs_a_record_with_a_canonical_op_and_says_so(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "n.h5", "native", [T("mystery", _bits(1), layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("ffn_down", _bits(1), layer=0, dtype="bfloat16")])
    comparison = _compare(native, oracle, ManualPair(RecordKey(0, "prefill", 0, "mystery"), RecordKey(0, "prefill", 0, "ffn_down"), "same tensor"))
    assert comparison.pairs == []
    assert sorted((u.side, u.seq, u.reason) for u in comparison.unaligned) == [
        ("native", -1, OVERRIDE_UNUSABLE),
        ("native", 0, NO_RULE),
        ("oracle", 0, NO_PARTNER),
    ]


def test_a_sessions_overrides_for_a_pair_are_those_between_its_two_captures_either_way_round() -> None:
    a, b = RecordKey(0, "prefill", 0, "ffn_down"), RecordKey(0, "prefill", 1, "ffn_down")
    session_overrides = (
        AlignmentOverride("pair", RecordRef("oracle", b), RecordRef("native", a), "swapped ends"),
        AlignmentOverride("unpair", RecordRef("native", a), RecordRef("oracle", b), "broken"),
        AlignmentOverride("pair", RecordRef("native", a), RecordRef("rerun", b), "another capture"),
    )
    assert overrides_for_pair(session_overrides, "native", "oracle") == (ManualPair(a, b, "swapped ends"), ManualBreak(a, "broken"))


@pytest.mark.slow
def test_a_manual_pairing_is_what_the_timeline_and_the_rerun_use(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    from backends.dispatch.timeline import build_timeline
    from backends.rerun.segment import RerunOptions, iter_rerun
    from sessions.compare.key import OpKey

    key = OpKey(0, "text-after", 0, "sdpa")
    native_record = RecordKey(0, "text-after", 0, "kqv_out-0")
    wrong_oracle = RecordKey(0, "text-after", 1, "model.layers.1.self_attn.sdpa")
    native_path, oracle_path = demo_pairs["head-chunk"]
    with open_capture(native_path) as n, open_capture(oracle_path) as o:
        automatic = run_to_end(iter_compare(n, o))
        manual = run_to_end(iter_compare(n, o, CompareOptions(overrides=(ManualPair(native_record, wrong_oracle, "user says so"),))))
        paired = next(p for p in manual.pairs if p.key == key)
        assert paired.manual_reason == "user says so" and paired.oracle_name == wrong_oracle.name

        for comparison, oracle_seq in ((automatic, next(p.oracle_seq for p in automatic.pairs if p.key == key)), (manual, paired.oracle_seq)):
            timeline = build_timeline(n, o, comparison)
            slot = timeline.keys.index(key)
            oracle_calls = (timeline.slot == slot) & (timeline.side == 1)
            rows = o.dispatch[o.dispatch["index_seq"] == oracle_seq]
            expected_ms = (rows["t_start_ns"] - o.dispatch["t_start_ns"].min()) / 1e6
            assert len(rows) == 4 and sorted(timeline.t_start_ms[oracle_calls].tolist()) == sorted(expected_ms.tolist())

        def rerun_vs_oracle(comparison):  # type: ignore[no-untyped-def]
            result = run_to_end(iter_rerun(n, o, comparison, key, RerunOptions(source="oracle")))
            return result.ops[0].three_way["rerun vs oracle"]

        assert rerun_vs_oracle(automatic).bit_exact, "the oracle's own inputs on its own route give back its bits"
        assert not rerun_vs_oracle(manual).bit_exact, "with the manual pairing the rerun is judged against layer 1's output"
