"""The dispatch timeline's findings, computed without Qt: shared slots, differences, route checks, lanes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.dispatch.timeline import (
    PRIMITIVE_CODES,
    build_timeline,
    describe_event,
    hit,
    layout,
    timeline_summary,
)
from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.compare.options import CompareOptions
from sessions.compare.verdict import PARITY
from sessions.progress import run_to_end
from tests.hand_captures import T, write_capture
from tests.timeline_captures import write_dispatch_capture


@pytest.mark.slow
def test_head_chunk_scenario_flags_exactly_the_text_after_ops_as_dispatching_differently(demo_pairs: dict) -> None:
    native, oracle = demo_pairs["head-chunk"]
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    differing = {timeline.keys[s].segment for s in np.unique(timeline.slot[timeline.differs]).tolist()}
    assert differing == {"text-after"}
    text_after = [i for i, k in enumerate(timeline.keys) if k is not None and k.segment == "text-after"]
    oracle_calls = (timeline.side == 1) & np.isin(timeline.slot, text_after)
    assert sorted(timeline.head_count[oracle_calls].tolist()) == [1, 1, 1, 1, 5, 5, 5, 5]
    assert not timeline.route_mismatch.any()
    assert "calls" in timeline.difference_fields[text_after[0]]


@pytest.mark.slow
def test_each_call_carries_its_records_contract_and_the_ops_with_a_contract_finding_are_marked(demo_pairs: dict) -> None:
    """attention-contract: the same primitives on both sides, but the oracle's visual prefill ran
    another arithmetic contract; only the contract tells those calls apart."""
    native, oracle = demo_pairs["attention-contract"]
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    ran = {(int(side), str(timeline.keys[slot])): timeline.contracts[code] for side, slot, code in zip(timeline.side, timeline.slot, timeline.contract)}
    assert ran[(0, "0:visual:0:sdpa")] == "attn.bf16.single_range" and ran[(1, "0:visual:0:sdpa")] == "attn.f32.tiled64x64"
    assert ran[(0, "1:decode:1:sdpa")] == ran[(1, "1:decode:1:sdpa")] == "attn.bf16.single_range"
    marked = {str(timeline.keys[slot]) for slot in np.unique(timeline.slot[timeline.contract_differs]).tolist()}
    assert marked == {"0:visual:0:sdpa", "0:visual:1:sdpa"}
    assert not timeline.differs.any()
    first = int(np.flatnonzero(timeline.contract_differs & (timeline.side == 1))[0])
    described = describe_event(timeline, first).splitlines()
    assert "contract: attn.f32.tiled64x64" in described and described[-1] == "its op's contract differs between the sides (a contract finding)"



def test_calls_whose_sides_were_not_compared_keep_their_contract_mark(tmp_path: Path) -> None:
    """Calls not compared across the sides (the oracle records none) have slots of their own per
    side; the mark was looked up by the pair's key among them and never found."""
    call = dict(kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=4, kv_len=4, head_dim=8, primitive="fallback")
    bits = np.zeros((4, 8), dtype=np.float32)
    native = write_capture(tmp_path / "n.h5", "native", [T("sdpa", bits, layer=0, dispatch=[call], kernel_id="sdpa", contract_id="attn.a", effective_contract_id="attn.a")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("sdpa", bits, layer=0, kernel_id="sdpa", contract_id="attn.b", effective_contract_id="attn.b")])
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(native_profile="canonical", oracle_profile="canonical")))
        timeline = build_timeline(n, o, comparison)
    assert comparison.dispatch_not_compared and len(comparison.contracts.findings) == 1
    assert timeline.contract_differs.tolist() == [True] and timeline.contracts == ["attn.a"]


@pytest.mark.slow
def test_calls_of_records_after_the_shared_eos_are_not_dispatch_differences_of_a_parity_pair(demo_pairs: dict) -> None:
    native, oracle = demo_pairs["post-eos"]
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
        timeline = build_timeline(n, o, comparison)
    assert comparison.verdict.word == PARITY and comparison.dispatch_differences == []
    assert not timeline.differs.any() and timeline.one_sided.any()
    assert (timeline.side[timeline.one_sided] == 0).all(), "only the native decoded past the stop"
    assert timeline_summary(timeline) == (
        "42 calls in 18 attention ops; 0 op(s) dispatch differently; 6 op(s) after the shared EOS (step 3), one-sided by design; "
        "0 call(s) whose recorded primitive disagrees with the route predictor"
    ), "they were '6 op(s) of records without a partner', where report says post-EOS records are invalid, not failures"
    alone = int(np.flatnonzero(timeline.one_sided)[0])
    described = describe_event(timeline, alone).splitlines()
    assert described[0] == "native — step 4 decode layer 0 sdpa, without a partner, call 0", "it read 'unaligned op': which op was lost"
    assert described[-1] == "no call on the other side to compare: after the shared EOS (step 3), where one run stopped"
    assert [timeline.place(s).text() for s in sorted({int(s) for s in timeline.slot[timeline.one_sided].tolist()})][:2] == [
        "4:decode:0:sdpa", "4:decode:1:sdpa",
    ], "the axis names their step and segment too"
    assert layout(timeline, "group").lane_labels[0].startswith("native L0 "), "a lane names the record's layer, paired or not"


@pytest.mark.slow
def test_runs_cut_alike_paired_by_position_share_their_calls_slots_and_show_the_same_differences_as_paired_by_calls(demo_pairs: dict) -> None:
    native, oracle = demo_pairs["head-chunk"]
    with open_capture(native) as n, open_capture(oracle) as o:
        by_calls = build_timeline(n, o, run_to_end(iter_compare(n, o)))
        by_position = build_timeline(n, o, run_to_end(iter_compare(n, o, CompareOptions(alignment="positions"))))
    assert by_position.differs.any() and np.array_equal(by_position.differs, by_calls.differs)
    assert np.array_equal(by_position.slot, by_calls.slot) and not by_position.one_sided.any()
    assert timeline_summary(by_position) == timeline_summary(by_calls)
    assert "not compared" not in timeline_summary(by_position)


def test_a_capture_without_dispatch_keeps_the_others_calls_apart_and_says_they_were_not_compared(tmp_path: Path) -> None:
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=4, heads_per_call=0, q_heads=8, kv_heads=2, primitive="fallback", device="cpu")
    with open_capture(native) as n:
        oracle = write_capture(tmp_path / "o.h5", "oracle", [T(r.name, n.read_values(r), layer=r.layer, step=r.step, segment=r.segment) for r in n.records])
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    assert len(timeline) and not timeline.differs.any() and not timeline.one_sided.any()
    assert "; dispatch not compared: the oracle capture records no attention calls" in timeline_summary(timeline)


def test_a_recorded_primitive_the_predictor_disagrees_with_is_flagged(tmp_path: Path) -> None:
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=4, heads_per_call=0, q_heads=8, kv_heads=2,
                                    primitive="fallback", device="Apple M2 gpu")
    oracle = write_dispatch_capture(tmp_path / "o.h5", role="oracle", ops=4, heads_per_call=0, q_heads=8, kv_heads=2,
                                    primitive="fallback", device="cpu")
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    assert timeline.route_mismatch[timeline.side == 0].all()
    assert not timeline.route_mismatch[timeline.side == 1].any()
    assert PRIMITIVE_CODES[timeline.predicted[0]] == "sdpa_vector"
    assert "disagrees with the route predictor" in describe_event(timeline, 0)
    assert not timeline.differs.any()


def test_lanes_put_native_above_oracle_and_boxes_span_their_head_range(tmp_path: Path) -> None:
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=2, heads_per_call=0, q_heads=12, kv_heads=2)
    oracle = write_dispatch_capture(tmp_path / "o.h5", role="oracle", ops=2, heads_per_call=5, q_heads=12, kv_heads=2)
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    boxes = layout(timeline, "group")
    assert boxes.lane_labels == ["native L0 g0", "native L0 g1", "native L1 g0", "native L1 g1",
                                 "oracle L0 g0", "oracle L0 g1", "oracle L1 g0", "oracle L1 g1"]
    assert boxes.native_lanes == 4
    native_boxes = timeline.side[boxes.event] == 0
    assert native_boxes.sum() == 4 and np.allclose(boxes.y1[native_boxes] - boxes.y0[native_boxes], 0.8)
    chunk = np.flatnonzero((timeline.side[boxes.event] == 1) & (timeline.head_count[boxes.event] == 1))[0]
    assert boxes.y1[chunk] - boxes.y0[chunk] == pytest.approx(0.8 / 6)
    assert timeline.differs.all()
    per_call = layout(timeline, "call")
    assert per_call.lane_labels == ["native call 0", "oracle call 0", "oracle call 1", "oracle call 2", "oracle call 3"]
    x = (per_call.x0[0] + per_call.x1[0]) / 2
    assert hit(per_call, x, (per_call.y0[0] + per_call.y1[0]) / 2) == int(per_call.event[0])
    assert hit(per_call, x, 0.02) is None
    timed = layout(timeline, "group", "time")
    assert timed.x0.min() == 0.0
