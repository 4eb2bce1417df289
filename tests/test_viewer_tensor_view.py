"""The tensor view, driven for real offscreen: which slice an op opens on, how its curves and
maps draw, which element the inspector names (the one `report` names), and what a slice exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import COMPARED_WITHIN_MS as WAIT_MS
from tests.viewer_windows import (
    click_element,
    small_pair,
    wait_compared,
    wait_idle,
)
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def _three_d_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A [4, 3, 5] q_norm whose only difference is 7 ULP at [2, 1, 3]."""
    oracle = bf16_bits(np.ones((4, 3, 5)))
    native = oracle.copy()
    native[2, 1, 3] += 7
    return (
        write_capture(tmp_path / "n.h5", "native", [T("q_norm", native, dtype="bfloat16", layer=0)]),
        write_capture(tmp_path / "o.h5", "oracle", [T("q_norm", oracle, dtype="bfloat16", layer=0)]),
    )


def test_switching_colour_scales_redraws_the_difference_map(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.open_pair(*small_pair(tmp_path))
    wait_compared(qtbot, window)
    view = window.tensor_view
    assert view.data.request.label.endswith("attn_norm")
    drawn = {}
    for scale in ("absolute", "relative", "ULP"):
        button = next(b for b in view.scale_buttons.buttons() if b.text() == scale)
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        assert window.model.scale == scale and button.isChecked()
        assert scale in view.plots["difference"].titleLabel.text
        drawn[scale] = view.images["difference"].image.copy()
        assert np.array_equal(drawn[scale], view.data.rgba[scale])
        assert view.diff_bar.levels() == pytest.approx(view.data.levels[scale])
    assert not np.array_equal(drawn["ULP"], drawn["absolute"])
    # (1, 2) is one ULP apart: log2(1 + 1) = 1 on the ULP scale; its relative error is |d| / |oracle|.
    maps = view.data.images
    assert maps["ULP"][1, 2] == pytest.approx(1.0)
    oracle_value = float(np.linspace(-2.0, 2.0, 32, dtype=np.float32).reshape(4, 8)[1, 2])
    assert maps["relative"][1, 2] == pytest.approx(maps["absolute"][1, 2] / abs(oracle_value), rel=0.02)
    assert maps["ULP"][0, 0] == 0.0 and maps["absolute"][0, 0] == 0.0


def test_the_inspector_says_when_it_is_pinned_unpins_on_a_second_click_and_copies_the_element(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    native, oracle = small_pair(tmp_path)
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    inspector = window.tensor_view.inspector
    click_element(qtbot, window, "difference", 2, 3)
    assert inspector.title.text().endswith("(pinned)") and inspector.hint.text().startswith("Pinned: hovering does not move")
    inspector.copy_element()
    assert QApplication.clipboard().text() == "0:prefill:0:attn_norm [2, 3]: native 0x8000 (-0.0) oracle 0x0000 (0.0), +0/-0 swap: equal values, the sign bit differs"
    click_element(qtbot, window, "difference", 2, 3)
    assert not inspector.title.text().endswith("(pinned)") and inspector.hint.text().startswith("Hover a heatmap")
    assert window.tensor_view.pinned is None and inspector.current is not None and not inspector.current.pinned


def test_the_shown_slice_exports_either_side_or_the_difference_as_npy_and_csv(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    native, oracle = small_pair(tmp_path)
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    data = window.tensor_view.data
    assert data is not None
    for what, suffix in (("native", ".npy"), ("difference", ".csv")):
        target = tmp_path / f"out-{what}{suffix}"
        window.export_slice(what, suffix, target)
        qtbot.waitUntil(target.exists, timeout=WAIT_MS)
    exported = np.load(tmp_path / "out-native.npy")
    assert exported.dtype == np.float32 and exported.shape == (4, 8)
    assert np.array_equal(exported.view(np.uint32) >> 16, data.native_bits.astype(np.uint32)), "bf16 widened exactly"
    difference = np.loadtxt(tmp_path / "out-difference.csv", delimiter=",")
    assert difference.shape == (4, 8) and np.isnan(difference[3, 4]) and np.flatnonzero(np.nan_to_num(difference)).tolist() == [1 * 8 + 2]


def test_a_one_dimensional_record_draws_as_curves_and_an_empty_one_says_it_holds_nothing(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """A 1-D record raised an uncaught error from pyqtgraph as soon as its pair opened; a [0, 8] one
    showed "Cannot show this pair: ValueError: need at least one array to concatenate"."""
    line = np.linspace(-1, 1, 16).astype(np.float32)
    changed = line.copy()
    changed.view(np.uint32)[3] += 2
    empty = np.zeros((0, 8), np.float32)
    native = write_capture(tmp_path / "n.h5", "native", [T("attn_norm", changed, layer=0), T("layer_out", empty, layer=0)], [(0, 5, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", line, layer=0), T("layer_out", empty, layer=0)], [(0, 5, False)])
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    assert window.tensor_view.data.is_1d and window.tensor_view.title.text().startswith("0:prefill:0:attn_norm")
    QApplication.processEvents()
    assert window.tensor_view.curves["native"].getData()[1].size == 16
    window.model.select(next(p for p in window.model.comparison.comparison.pairs if p.key.op == "layer_out"))
    wait_idle(qtbot, window)
    assert window.tensor_view.title.text() == "0:prefill:0:layer_out: float32 [0, 8] holds no elements, so there is nothing to show"
    assert window.banners.banners("uncaught") == []


def test_a_3d_pair_opens_on_the_slice_holding_the_element_report_names(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """Held at axis 0 = 0, the view said bit-exact beside a report of 7 ULP at [2, 1, 3]."""
    window.open_pair(*_three_d_pair(tmp_path))
    wait_compared(qtbot, window)
    assert window.model.selected.metrics.worst_ulp_at.coord == [2, 1, 3]
    view = window.tensor_view
    assert (view.data.spec.row_axis, view.data.spec.col_axis, view.data.spec.index[0]) == (1, 2, 2)
    assert "bit-exact" not in view.title.text() and view.data.differing == 1
    assert view.inspector.title.text().startswith("Element [2, 1, 3]") and view.inspector.verdict.text() == "7 ULP apart"


def test_an_arrow_click_on_a_held_axis_shows_that_index(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """Only Enter or leaving the box reloaded the slice: after two clicks it read 'axis 0 = 0' shown as 2."""
    window.open_pair(*_three_d_pair(tmp_path))
    wait_compared(qtbot, window)
    window.tensor_view.axes._spins[0].stepDown()
    qtbot.waitUntil(lambda: window.tensor_view.data.spec.index[0] == 1 and not window.tasks.busy, timeout=WAIT_MS)
    assert window.tensor_view.axes._spins[0].value() == 1 and window.tensor_view.data.differing == 0


def test_a_long_1d_tensor_is_drawn_downsampled(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """Every point was drawn: a 65,536-element tensor repainted in 1.2 s, a million held the window over 100 s."""
    oracle = bf16_bits(np.random.default_rng(0).standard_normal(1 << 16))
    native = oracle.copy()
    native[12345] += 3
    window.open_pair(
        write_capture(tmp_path / "n.h5", "native", [T("logits", native, dtype="bfloat16")]),
        write_capture(tmp_path / "o.h5", "oracle", [T("logits", oracle, dtype="bfloat16")]),
    )
    wait_compared(qtbot, window)
    QApplication.processEvents()
    for name, curve in window.tensor_view.curves.items():
        assert curve.opts["autoDownsample"] and curve.opts["clipToView"], name
        shown, _ = curve.getData()
        assert shown is not None and shown.size < 1 << 14, f"{name}: {shown.size if shown is not None else None} points drawn"
    assert not window.tensor_view.plots["native"].vb.yInverted(), "a curve's larger values are up"


def test_the_view_pins_the_element_report_names_when_a_signed_zero_swap_is_as_far(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """+0/-0 is one ULP, as is 1.0 against the next bfloat16: the view pinned the swap, `report` the value that moved."""
    oracle = bf16_bits(np.ones((1, 8), np.float32))
    oracle[0, 0] = 0x0000
    native = oracle.copy()
    native[0, 0], native[0, 5] = 0x8000, oracle[0, 5] + 1
    window.open_pair(
        write_capture(tmp_path / "n.h5", "native", [T("attn_norm", native, dtype="bfloat16", layer=0)]),
        write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", oracle, dtype="bfloat16", layer=0)]),
    )
    wait_compared(qtbot, window)
    assert window.model.selected.metrics.worst_ulp_at.coord == [0, 5]
    assert window.tensor_view.data.worst == (0, 5)
    assert window.tensor_view.inspector.title.text().startswith("Element [0, 5]")


def test_a_scalars_element_is_named_by_the_coordinate_report_gives(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """The inspector said "Element [0]" where `report` says [] (a scalar has no axis)."""
    oracle = np.float32(1.5)
    native = np.nextafter(oracle, np.float32(2))
    window.open_pair(
        write_capture(tmp_path / "n.h5", "native", [T("attn_norm", np.array(native), layer=0)]),
        write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", np.array(oracle), layer=0)]),
    )
    wait_compared(qtbot, window)
    assert window.model.selected.metrics.worst_ulp_at.coord == []
    assert window.tensor_view.inspector.title.text().startswith("Element []")


def test_the_view_and_report_name_the_same_worst_element_across_the_views_chunks(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """The view diffs an 8 MB slice 2 MB at a time: a +0/-0 swap in its first chunk outranked a
    value one ULP away in a later one, which `report` names."""
    oracle = np.ones((2048, 1024), np.float32)
    oracle[0, 0] = 0.0
    native = oracle.copy()
    native[0, 0] = -0.0
    native[1000, 5] = np.nextafter(np.float32(1), np.float32(2))
    window.open_pair(
        write_capture(tmp_path / "n.h5", "native", [T("attn_norm", native, layer=0)]),
        write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", oracle, layer=0)]),
    )
    wait_compared(qtbot, window)
    assert window.model.selected.metrics.worst_ulp_at.coord == [1000, 5]
    assert window.tensor_view.data.worst == (1000, 5)


def test_an_ops_tensors_still_loading_when_no_op_is_selected_are_not_shown(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """Picking a record without a partner while the last op's tensors loaded showed them beside it."""
    window.open_pair(*small_pair(tmp_path))
    wait_compared(qtbot, window)
    other = next(p for p in window.model.comparison.comparison.pairs if p is not window.model.selected)
    window.model.select(other)
    window.model.select(None)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    assert window.tensor_view.data is None and window.tensor_view.title.text() == "Select an op in the alignment tree"
