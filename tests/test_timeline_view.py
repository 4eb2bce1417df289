"""The dispatch timeline widget driven like a user: select by clicking, hover, highlights, 10,000 calls."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from backends.dispatch.timeline import PRIMITIVE_CODES, build_timeline
from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.progress import run_to_end
from tests.timeline_captures import write_dispatch_capture
from viewer.panels.timeline_model import TimelineModel
from viewer.panels.timeline_view import BoxesItem, TimelineView, palette

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)


def _view(qtbot, timeline) -> TimelineView:  # type: ignore[no-untyped-def]
    view = TimelineView(TimelineModel(timeline))
    qtbot.addWidget(view)
    view.resize(1440, 900)
    view.show()
    qtbot.waitExposed(view)
    return view


def test_a_hidden_timeline_repaints_a_selection_only_when_it_is_seen(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    with open_capture(demo_pairs["head-chunk"][0]) as n, open_capture(demo_pairs["head-chunk"][1]) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    view = TimelineView(TimelineModel(timeline))
    qtbot.addWidget(view)
    view.resize(1440, 900)
    changed: list[list[object]] = []
    view.plot.scene().changed.connect(lambda rects: changed.append([r for r in rects if not r.isEmpty()]))
    for _ in range(40):  # the hidden plot's own first layout settles first (slower on a loaded machine)
        changed.clear()
        qtbot.wait(50)
        if not any(changed):
            break
    view.show_key(timeline.keys[int(timeline.slot[3])])
    qtbot.wait(100)
    assert view.model.selected == int(np.flatnonzero(timeline.slot == timeline.slot[3])[0])
    assert not any(changed), "a hidden timeline's boxes are not repainted for a selection"
    view.show()
    qtbot.waitExposed(view)
    qtbot.waitUntil(lambda: view.items.painted_rects > 0)
    assert any(changed)


@pytest.mark.slow
def test_clicking_a_call_selects_its_op_and_hovering_describes_it(qtbot, demo_pairs: dict, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    with open_capture(demo_pairs["head-chunk"][0]) as n, open_capture(demo_pairs["head-chunk"][1]) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    view = _view(qtbot, timeline)
    target = int(np.flatnonzero((timeline.side == 1) & timeline.differs & (timeline.head_count == 1))[0])
    widget_pos = view.plot.mapFromScene(view.scene_pos_of(target))
    with qtbot.waitSignal(view.op_selected) as selected:
        qtbot.mouseClick(view.plot.viewport(), Qt.MouseButton.LeftButton, pos=widget_pos)
    key = selected.args[0]
    assert (key.step, key.segment, key.op) == (0, "text-after", "sdpa")
    assert view.model.selected == target
    with qtbot.waitSignal(view.hovered) as hovered:
        view.plot.scene().sigMouseMoved.emit(view.scene_pos_of(target))
    assert hovered.args == [target]
    assert "KV group" in view.hover_text and "heads" in view.hover_text and "Metal: sdpa_vector" in view.hover_text
    assert "differs between sides: calls" in view.hover_text
    assert "1 op(s) dispatch differently" not in view.summary.text() and "dispatch differently" in view.summary.text()
    view.grab().save(str(artifacts_dir / "timeline-head-chunk-1440x900.png"))


@pytest.mark.slow
def test_lane_axis_and_colour_switches_rebuild_the_boxes(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    with open_capture(demo_pairs["head-chunk"][0]) as n, open_capture(demo_pairs["head-chunk"][1]) as o:
        view = _view(qtbot, build_timeline(n, o, run_to_end(iter_compare(n, o))))
    by_group = list(view.model.boxes.lane_labels)
    view.lanes.setCurrentIndex(1)
    assert view.model.lane_mode == "call" and view.model.boxes.lane_labels[0] == "native call 0"
    assert view.model.boxes.lane_labels != by_group
    view.x_axis.setCurrentIndex(1)
    assert view.model.x_mode == "time"
    view.colours.setCurrentIndex(1)
    assert set(view.model.colour_codes().tolist()) == {5}


def test_highlighted_calls_are_outlined_and_selection_follows_the_tree(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=6, heads_per_call=0, q_heads=12, kv_heads=2, device="Apple M3 gpu")
    oracle = write_dispatch_capture(tmp_path / "o.h5", role="oracle", ops=6, heads_per_call=5, q_heads=12, kv_heads=2)
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    view = _view(qtbot, timeline)
    assert timeline.differs.all() and timeline.route_mismatch[timeline.side == 0].all()
    assert "6 call(s) whose recorded primitive disagrees" in view.summary.text()
    key = timeline.keys[3]
    view.show_key(key)
    assert view.model.selected is not None and timeline.keys[int(timeline.slot[view.model.selected])] == key
    view.grab()
    assert view.items.painted_rects == len(view.model.boxes.event)


def test_ten_thousand_calls_are_painted_by_one_item_with_level_of_detail(qtbot, tmp_path: Path, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=420, heads_per_call=2)
    oracle = write_dispatch_capture(tmp_path / "o.h5", role="oracle", ops=420, heads_per_call=0)
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    assert len(timeline) == 420 * 24 + 420 > 10_000
    view = _view(qtbot, timeline)
    started = time.perf_counter()
    image = view.grab()
    paint_s = time.perf_counter() - started
    boxes_items = [item for item in view.plot.getViewBox().addedItems if isinstance(item, BoxesItem)]
    assert len(boxes_items) == 1 and len(view.plot.getViewBox().addedItems) == 3, "the boxes, the sides' divider and the EOS line: no item per call"
    assert 0 < view.items.painted_rects < len(view.model.boxes.event)
    view.plot.setXRange(10, 14, padding=0)
    view.grab()
    assert view.items.painted_rects == int(np.sum((view.model.boxes.x1 >= 10) & (view.model.boxes.x0 <= 14)))
    image.save(str(artifacts_dir / "timeline-10k-1440x900.png"))
    print(f"10,500-call timeline painted in {paint_s * 1000:.0f} ms")


def test_zoomed_out_on_the_time_axis_the_selected_call_is_still_outlined(qtbot, tmp_path: Path, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """Each call under a pixel wide, the selection was outlined only box by box: nothing showed."""
    native = write_dispatch_capture(tmp_path / "n.h5", role="native", ops=420, heads_per_call=2)
    oracle = write_dispatch_capture(tmp_path / "o.h5", role="oracle", ops=420, heads_per_call=0)
    with open_capture(native) as n, open_capture(oracle) as o:
        timeline = build_timeline(n, o, run_to_end(iter_compare(n, o)))
    view = _view(qtbot, timeline)
    view.x_axis.setCurrentIndex(view.x_axis.findData("time"))
    before = view.grab().toImage()
    assert view.items.selection_outlined == 0
    view.select_event(5000)
    after = view.grab().toImage()
    boxes = view.model.boxes
    assert view.items.selection_outlined == int(np.sum(timeline.slot[boxes.event] == timeline.slot[5000])) > 1, "the selected op's calls, each box of them"
    after.save(str(artifacts_dir / "timeline-10k-time-axis-selected-1440x900.png"))
    changed = [x for x in range(after.width()) for y in range(0, after.height(), 2) if after.pixel(x, y) != before.pixel(x, y)]
    assert changed and max(changed) - min(changed) >= 4, "an outline a few pixels wide, not a hairline"
    after.save(str(artifacts_dir / "timeline-10k-time-axis-selected-1440x900.png"))


@pytest.mark.slow
def test_a_llama_cpp_pair_is_coloured_by_what_ran_flash_attention_against_separate_ops(qtbot, llama_tiny_pairs: dict, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp calls have no Metal route to colour by; flash attention and the decomposed
    attention are told apart by colour, and every op dispatches differently."""
    with open_capture(llama_tiny_pairs["f32-flash"][0]) as n, open_capture(llama_tiny_pairs["f32"][0]) as o:
        view = _view(qtbot, build_timeline(n, o, run_to_end(iter_compare(n, o))))
    timeline = view.model.timeline
    assert not timeline.knows_metal_routes()
    assert view.model.colour_by == "executed" and view.colours.currentData() == "executed"
    codes = view.model.colour_codes()
    assert {PRIMITIVE_CODES[c] for c in codes[timeline.side == 0].tolist()} == {"flash_attn_ext"}
    assert {PRIMITIVE_CODES[c] for c in codes[timeline.side == 1].tolist()} == {"fallback"}
    assert "6 op(s) dispatch differently" in view.summary.text()
    with open_capture(llama_tiny_pairs["f32"][0]) as n, open_capture(llama_tiny_pairs["f32"][1]) as o:
        view.model.set_timeline(build_timeline(n, o, run_to_end(iter_compare(n, o))))
    assert view.model.timeline.knows_metal_routes() and view.model.colour_by == "metal", "an MLX side brings the user's choice back"
    view.model.set_timeline(timeline)
    view.resize(1280, 720)
    qtbot.wait(50)
    view.grab().save(str(artifacts_dir / "timeline-llama-flash-vs-separate-ops-1280x720.png"))


def test_coloured_by_contract_the_calls_that_ran_another_arithmetic_stand_out(qtbot, demo_pairs: dict, artifacts_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """attention-contract: the same primitive on both sides everywhere; by contract, the
    oracle's visual prefill calls take another colour and are outlined as a contract finding."""
    with open_capture(demo_pairs["attention-contract"][0]) as n, open_capture(demo_pairs["attention-contract"][1]) as o:
        view = _view(qtbot, build_timeline(n, o, run_to_end(iter_compare(n, o))))
    view.resize(1280, 720)
    view.colours.setCurrentIndex(view.colours.findData("contract"))
    qtbot.waitUntil(lambda: "contract differs between sides" in view.legend.text())
    timeline, colours = view.model.timeline, palette(view.model)
    shown = {(int(side), str(timeline.keys[slot])): colours[code] for side, slot, code in zip(timeline.side, timeline.slot, view.model.colour_codes())}
    assert shown[(0, "0:visual:0:sdpa")] == shown[(1, "1:decode:0:sdpa")] != shown[(1, "0:visual:0:sdpa")]
    assert "attn.bf16.single_range" in view.legend.text() and "attn.f32.tiled64x64" in view.legend.text()
    view.items.update()
    qtbot.waitUntil(lambda: view.items.painted_rects > 0)
    view.grab().save(str(artifacts_dir / "timeline-attention-contract-by-contract-1280x720.png"))
    view.colours.setCurrentIndex(view.colours.findData("metal"))
    assert "contract differs between sides" in view.legend.text() and view.model.contract_marked().any(), (
        "outlined under every colouring: by Metal primitive a CONTRACT MISMATCH's calls looked like any others"
    )
    assert "2 op(s) whose contract differs (outlined)" in view.summary.text()


def test_by_call_the_axis_leaves_room_for_the_first_segments_label(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    with open_capture(demo_pairs["attention-contract"][0]) as n, open_capture(demo_pairs["attention-contract"][1]) as o:
        view = _view(qtbot, build_timeline(n, o, run_to_end(iter_compare(n, o))))
    first_box = float(view.model.boxes.x0.min())
    assert view.model.x_mode == "call" and view.plot.viewRange()[0][0] <= first_box - 0.5


def test_the_calls_after_the_shared_eos_stand_past_a_line_that_says_so_in_call_order(qtbot, demo_pairs: dict) -> None:  # type: ignore[no-untyped-def]
    """post-eos: the native's calls of steps 4-6 looked exactly like compared ones; only a text line said why."""
    with open_capture(demo_pairs["post-eos"][0]) as n, open_capture(demo_pairs["post-eos"][1]) as o:
        view = _view(qtbot, build_timeline(n, o, run_to_end(iter_compare(n, o))))
    timeline = view.model.timeline
    first = next(slot for slot in range(len(timeline.keys)) if timeline.place(slot).step == 4)
    assert view.eos_line.isVisible() and view.eos_line.value() == first and timeline.shared_eos == 3
    view.x_axis.setCurrentIndex(view.x_axis.findData("time"))
    assert not view.eos_line.isVisible(), "by time each side ends at its own moment: no one line is the EOS"
