"""The viewer window, driven for real offscreen: opening, navigating, inspecting, cancelling.

Every expectation about numbers is computed independently from the capture files with
sessions helpers (capture_reader, align, element_info), never read back from the widgets'
own sources.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import h5py
import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QEvent, QMimeData, QObject, QPoint, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from sessions.bits.element_info import describe, ulp_between
from sessions.capture.opening import open_capture
from sessions.compare.align import align
from sessions.compare.comparison import PairResult
from sessions.compare.verdict import Kind
from sessions.ctrl_c import ctrl_c_kept
from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import COMPARED_WITHIN_MS as WAIT_MS
from tests.viewer_windows import (
    click_element,
    shown_tip,
    small_pair,
    wait_compared,
    wait_idle,
)
from viewer import comparison_view as cv
from viewer.comparison_view import unaligned_label
from viewer.settings import ViewerSettings
from viewer.tree.alignment_tree import PAIR_ROLE, UNALIGNED_ROLE
from viewer.window.main_window import MainWindow
from viewer.window.terminal_ctrl_c import closing_on_ctrl_c

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def shoot(win: MainWindow, artifacts_dir: Path, name: str) -> Path:
    QApplication.processEvents()
    path = artifacts_dir / f"viewer-{name}.png"
    image = win.grab()
    assert image.width() == 1440 and image.height() == 900
    assert image.save(str(path))
    return path


def expected_element(native_path: Path, oracle_path: Path, native_seq: int, coord: tuple[int, ...]) -> tuple[str, str, str, str, int | None]:
    """(native hex, native decimal, oracle hex, oracle decimal, ULP) read straight from the files."""
    with open_capture(native_path) as native, open_capture(oracle_path) as oracle:
        pairs = align(native.records, oracle.records, resolve_profile_for(native), resolve_profile_for(oracle)).pairs
        pair = next(p for p in pairs if p.native.record.seq == native_seq)
        bits = []
        for capture, mapped in ((native, pair.native), (oracle, pair.oracle)):
            raw = capture.read_bits(mapped.record)
            canonical = mapped.layout.apply(raw) if mapped.layout is not None else raw
            bits.append(canonical[coord])
        dtype = pair.native.record.dtype
        n, o = describe(bits[0], dtype), describe(bits[1], dtype)
        return n.hex, n.decimal, o.hex, o.decimal, ulp_between(bits[0], bits[1], dtype)


def resolve_profile_for(capture: object) -> object:
    from sessions.compare.profiles import detect_profile

    return detect_profile(r.name for r in capture.records)  # type: ignore[attr-defined]


# -- small hand-built pair --------------------------------------------------------------------


def drop(win: MainWindow, paths: list[Path]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    where = QPoint(win.width() // 2, win.height() // 2)
    enter = QDragEnterEvent(where, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(win, enter)
    assert enter.isAccepted()
    event = QDropEvent(where, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(win, event)


# -- tests ------------------------------------------------------------------------------------


def test_empty_window_shows_a_drop_hint_and_no_pair(window: MainWindow, artifacts_dir: Path) -> None:
    assert window.stack.currentWidget() is window.drop_hint
    assert "Drop a native and an oracle capture here" in window.drop_hint.label.text()
    assert window.model.native is None and window.model.oracle is None
    shoot(window, artifacts_dir, "empty")


def test_demo_pair_opens_at_first_divergence_with_the_engines_bits(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path) -> None:
    from backends.demo.generate import DEFAULT_SCENARIO

    native_path, oracle_path = demo_pairs[DEFAULT_SCENARIO]
    window.open_pair(native_path, oracle_path)
    wait_compared(qtbot, window)
    comparison = window.model.comparison.comparison
    assert comparison.first_divergence is not None
    first = comparison.pairs[comparison.first_divergence]

    window.model.select(comparison.pairs[0])
    wait_idle(qtbot, window)
    window.jump_action.trigger()
    wait_idle(qtbot, window)
    assert window.model.selected is first
    assert window.tree.view.currentIndex().data() == first.key.op
    assert window.tensor_view.title.text().startswith(first.key.text())

    shown = window.tensor_view.inspector.current
    assert shown is not None and shown.pinned
    worst = first.metrics.worst_ulp_at
    assert worst is not None
    assert shown.coordinate == tuple(worst.coord)
    assert (shown.native.hex, shown.oracle.hex, shown.ulp) == (worst.native_hex, worst.oracle_hex, worst.ulp)
    n_hex, n_dec, o_hex, o_dec, ulp = expected_element(native_path, oracle_path, first.native_seq, shown.coordinate)
    inspector = window.tensor_view.inspector
    assert inspector.cell_text("hex bits", "native") == n_hex
    assert inspector.cell_text("hex bits", "oracle") == o_hex
    assert inspector.cell_text("decimal", "native") == n_dec
    assert inspector.cell_text("decimal", "oracle") == o_dec
    assert inspector.verdict.text() == f"{ulp} ULP apart"

    banners = " ".join(window.banners.texts())
    assert (f"At <code>{first.key}</code></b> native ran" in banners) == bool(comparison.contracts.findings)
    assert "attn.bf16.single_range" in banners and "attn.f32.tiled64x64" in banners and "Why it matters" in banners
    shoot(window, artifacts_dir, "tensor-diff")
    for index, name in enumerate(("overview", "token-parity", "provenance"), start=1):
        window.show_panel(index)
        shoot(window, artifacts_dir, name)


def test_the_histograms_under_the_maps_always_label_two_ticks_of_their_scale(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """At 1280x720 each small plot is ~80 px wide: one label ("1e-4") said neither the scale nor its direction."""
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    qtbot.waitUntil(lambda: window.model.selected is not None and window.tensor_view.data is not None, timeout=WAIT_MS)
    errors = window.tensor_view.errors
    always = {name: [text for _, text in plot.getAxis("bottom")._tickLevels[0]] for name, plot in (("ulp", errors.ulp_plot), ("abs", errors.abs_plot))}
    assert always == {"ulp": ["1", "2^10"], "abs": ["-8", "0"]}
    assert errors.abs_plot.getAxis("bottom").labelText == "log10"


def test_the_error_plot_of_an_op_that_differs_only_in_signed_zeros_says_so_not_that_nothing_differs(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:

    window.open_pair(*demo_pairs["signed-zero"])
    wait_compared(qtbot, window)
    qtbot.waitUntil(lambda: window.model.selected is not None and window.tensor_view.data is not None, timeout=WAIT_MS)
    assert window.model.selected.key.op == "ffn_act" and window.model.selected.metrics.differing == 21
    texts = [item.textItem.toPlainText() for item in window.tensor_view.errors.abs_plot.items if isinstance(item, pg.TextItem)]
    assert texts == ["|error| 0: signed\nzeros only"]
    # A swap is 1 ULP by bits and no error: red "1 ULP apart", max ULP 1 and a line at 1 over every row read as one.
    for plot in (window.tensor_view.errors.row_plot, window.tensor_view.errors.head_plot):
        assert [item.textItem.toPlainText() for item in plot.items if isinstance(item, pg.TextItem)] in (["+0/-0 swaps\nonly"], ["no head axis"])
    assert window.tensor_view.inspector.verdict.text() == "+0/-0 swap: equal values, the sign bit differs"
    assert cv.pair_max_ulp_text(window.model.selected) == "±0 only"
    window.model.select(next(p for p in window.model.comparison.comparison.pairs if p.key.op == "embed"))
    qtbot.waitUntil(lambda: window.tensor_view.data is not None and window.tensor_view.data.request.metrics.differing == 0, timeout=WAIT_MS)
    rows = [item.textItem.toPlainText() for item in window.tensor_view.errors.row_plot.items if isinstance(item, pg.TextItem)]
    assert rows == ["no differing\nelements"], "a bit-exact [rows, hidden] tensor has a row axis, with nothing differing along it"


def _show_op(qtbot: QtBot, window: MainWindow, pair: PairResult) -> None:
    """Select `pair` and wait for its tensors on show."""
    window.model.select(pair)
    view = window.tensor_view
    qtbot.waitUntil(lambda: view.data is not None and view.data.request.metrics is pair.metrics, timeout=WAIT_MS)


def test_a_float32_slice_counts_differing_bits_and_pins_the_element_the_report_names_as_worst(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """Values were compared: a +0/-0 swap was not counted and an identical NaN was ("bit-exact"
    beside an inspector showing 0x00000000 vs 0x80000000), and a NaN, whose ULP distance the
    report leaves undefined, was pinned as the worst in place of the report's +inf vs -inf."""
    rng = np.random.default_rng(0)
    swapped = rng.standard_normal((5, 384)).astype(np.float32)
    swaps = swapped.copy()
    swapped[0, 3], swaps[0, 3] = 0.0, -0.0
    swapped[1, 7], swaps[1, 7] = -0.0, 0.0
    swapped[2, 5] = swaps[2, 5] = np.array([0x7FC00001], np.uint32).view(np.float32)[0]  # one NaN, bit for bit on both sides
    apart = rng.standard_normal((5, 384)).astype(np.float32)
    other = apart.copy()
    apart.view(np.uint32)[0, 0] += 1
    apart[4, 1], other[4, 1] = (np.array([bits], np.uint32).view(np.float32)[0] for bits in (0x7FC00002, 0x7FC00003))
    apart[4, 2], other[4, 2] = np.inf, -np.inf
    native = write_capture(tmp_path / "n.h5", "native", [T("attn_norm-0", swapped, layer=0), T("ffn_norm-0", apart, layer=0)], [(0, 1, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm-0", swaps, layer=0), T("ffn_norm-0", other, layer=0)], [(0, 1, False)])
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    view = window.tensor_view
    for op, title, worst in (("attn_norm", "2 of 1,920 shown elements differ", None), ("ffn_norm", "3 of 1,920 shown elements differ", (4, 2))):
        pair = next(p for p in window.model.comparison.comparison.pairs if p.key.op == op)
        _show_op(qtbot, window, pair)
        assert view.title.text().endswith(title) and pair.metrics.differing == int(title.split()[0])
        if worst is not None:
            assert pair.metrics.worst_ulp_at is not None and tuple(pair.metrics.worst_ulp_at.coord) == worst == view.pinned
    wait_idle(qtbot, window)


def test_the_max_ulp_per_row_plot_of_a_one_row_op_shows_its_one_row(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """Every decode step's op is one row: drawn as a line of one point, the plot was blank beside a tooltip saying 1 of 1 rows differ."""

    window.open_pair(*demo_pairs["swiglu-order"])
    wait_compared(qtbot, window)
    pair = next(p for p in window.model.comparison.comparison.pairs if p.key.text() == "2:decode:1:ffn_act")
    assert pair.metrics.shape[0] == 1 and pair.metrics.differing > pair.metrics.signed_zero_only
    view = window.tensor_view
    _show_op(qtbot, window, pair)
    (line,) = [item for item in view.errors.row_plot.items if isinstance(item, pg.PlotDataItem)]
    x, y = line.getData()
    assert (x.tolist(), y.tolist(), line.opts["symbol"]) == ([0.0], [float(pair.metrics.max_ulp)], "o")
    wait_idle(qtbot, window)


def test_esc_while_an_ops_tensors_load_says_the_load_was_cancelled_not_the_last_ops_tensors(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """The last op's heatmaps stayed under "Loading <the new op> ...", read as the new op's."""
    window.open_pair(*demo_pairs["signed-zero"])
    wait_compared(qtbot, window)
    pairs = window.model.comparison.comparison.pairs
    view = window.tensor_view
    _show_op(qtbot, window, pairs[0])
    window.model.select(pairs[1])
    window.cancel_work()
    qtbot.waitUntil(lambda: view.data is None, timeout=WAIT_MS)
    assert view.title.text() == f"Loading {pairs[1].key.text()} was cancelled: choose another op and come back to load it."
    wait_idle(qtbot, window)
    assert view.data is None


def test_post_eos_steps_are_marked_and_greyed_in_token_parity(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path) -> None:
    window.open_pair(*demo_pairs["post-eos"])
    wait_compared(qtbot, window)
    parity = window.model.comparison.comparison.tokens
    assert parity.shared_eos_step is not None
    verdicts = window.token_table.verdicts()
    assert verdicts[parity.shared_eos_step] == "EOS"
    post = verdicts[parity.shared_eos_step + 1 :]
    assert post and set(post) == {"post-EOS"}
    grey = window.token_table.rows.index(parity.shared_eos_step + 1, 1).data(Qt.ItemDataRole.ForegroundRole).color().name()
    assert grey == "#7d8694"
    window.show_panel(2)
    shoot(window, artifacts_dir, "token-parity-post-eos")
    post_eos = window.model.comparison.comparison.post_eos_unaligned
    assert post_eos and window.tree.summary.text().startswith("222 aligned (222 bit-exact); 0 unaligned;"), "the count report's ops line gives"
    assert f"; {len(post_eos)} post-EOS without a partner (invalid, not failures);" in window.tree.summary.text(), "there, though no finding"
    branch = window.tree.row_index(f"Post-EOS records without a partner ({len(post_eos)}: invalid, not failures)")
    assert branch.isValid() and branch.siblingAtColumn(1).data() == Kind.POST_EOS
    assert not window.tree.view.isExpanded(branch), "closed on arrival: its records are never failures, and open they filled the tree"
    window.tree.view.expand(branch)
    first = window.tree.row_index(unaligned_label(post_eos[0]))
    assert first.isValid() and first.siblingAtColumn(1).data() == Kind.POST_EOS
    why = f"no partner: no oracle record for step {parity.shared_eos_step + 1} decode embed"
    assert (first.siblingAtColumn(3).data(), shown_tip(first.data(Qt.ItemDataRole.ToolTipRole))) == (why, why), "the reason in words, not its code no_partner"
    # Selected, it leaves Tensor diff saying why nothing is shown, not "Select an op".
    window.tree.view.setCurrentIndex(first)
    assert window.tensor_view.title.text() == f"{unaligned_label(post_eos[0])} has no partner, so nothing to compare: {post_eos[0].why()}"
    labels = [unaligned_label(u) for u in post_eos]
    assert len(set(labels)) == len(labels), "llama.cpp's Qcur-0 is q_proj and q_rope: each row's label names its op"


def test_dropping_two_files_takes_roles_from_their_hints_and_swap_flips_them(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    native, oracle = small_pair(tmp_path)
    drop(window, [oracle, native])
    wait_compared(qtbot, window)
    assert window.model.native.path == native
    assert window.model.oracle.path == oracle
    assert "native: small.native.h5" in window.role_label.text()
    window.swap_action.trigger()
    wait_compared(qtbot, window)
    assert window.model.native.path == oracle and window.model.oracle.path == native
    assert str(native.resolve()) in window.settings.recent_files()


def test_dropping_one_file_fills_the_role_its_hint_names(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    native, oracle = small_pair(tmp_path)
    drop(window, [oracle])
    wait_idle(qtbot, window)
    assert window.model.oracle.path == oracle and window.model.native is None
    assert window.stack.currentWidget() is window.tabs
    drop(window, [native])
    wait_compared(qtbot, window)
    assert window.model.native.path == native and window.model.oracle.path == oracle


@pytest.mark.parametrize("kind", ["external-link", "garbage"])
def test_a_hostile_file_is_a_message_in_the_window_and_the_open_pair_stays(qtbot: QtBot, window: MainWindow, tmp_path: Path, artifacts_dir: Path, kind: str) -> None:
    native, oracle = small_pair(tmp_path)
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    before = window.model.comparison
    hostile = tmp_path / f"hostile-{kind}.h5"
    if kind == "external-link":
        (tmp_path / "secret.h5").write_bytes(b"")
        with h5py.File(native, "r", locking=False) as src, h5py.File(hostile, "w") as dst:
            for name, value in src.attrs.items():
                dst.attrs[name] = value
            dst["index"] = h5py.ExternalLink("/etc/hostname", "/")
    else:
        hostile.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    drop(window, [hostile])
    wait_idle(qtbot, window)
    messages = window.banners.texts("open")
    assert len(messages) == 1
    assert str(hostile) in messages[0]
    if kind == "external-link":
        assert "external link" in messages[0].lower()
    assert window.model.comparison is before
    assert window.model.native.path == native
    window.model.select(before.comparison.pairs[-1])
    wait_idle(qtbot, window)
    assert window.tensor_view.data is not None and window.tensor_view.data.request.label == before.comparison.pairs[-1].key.text()
    shoot(window, artifacts_dir, f"hostile-{kind}")


def test_a_pair_whose_file_is_no_capture_is_unusable_in_the_verdict_strip_as_report_says(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The strip said "No pair open" where `report` exits 2 with "unusable input".
    native, _ = small_pair(tmp_path)
    text = tmp_path / "notes.h5"
    text.write_text("not a capture\n")
    window.open_pair(native, text)
    wait_idle(qtbot, window)
    assert window.verdict_strip.word.text() == "UNUSABLE"
    assert str(text) in window.verdict_strip.detail.text() and str(text) in window.banners.texts("open")[0]
    from viewer.cli import main

    assert main(["report", str(native), str(text)]) == 2
    assert str(text) in capsys.readouterr().err


def test_clicking_an_element_shows_both_sides_bits_and_flags(qtbot: QtBot, window: MainWindow, tmp_path: Path, artifacts_dir: Path) -> None:
    native, oracle = small_pair(tmp_path)
    window.open_pair(native, oracle)
    wait_compared(qtbot, window)
    view = window.tensor_view
    inspector = view.inspector

    click_element(qtbot, window, "difference", 2, 3)
    assert inspector.current.coordinate == (2, 3)
    assert inspector.cell_text("hex bits", "native") == "0x8000"
    assert inspector.cell_text("hex bits", "oracle") == "0x0000"
    assert inspector.cell_text("flags", "native") == "signed zero (−0)"
    assert inspector.cell_text("flags", "oracle") == "+0"
    assert inspector.verdict.text() == "+0/-0 swap: equal values, the sign bit differs", "one ULP by bits, and no error"

    click_element(qtbot, window, "native", 3, 4)
    assert inspector.current.coordinate == (3, 4)
    assert inspector.cell_text("flags", "native") == "NaN payload 0x43"
    assert inspector.cell_text("flags", "oracle") == "NaN payload 0x41"
    assert "undefined" in inspector.verdict.text()

    click_element(qtbot, window, "oracle", 1, 2)
    n_hex, n_dec, o_hex, o_dec, ulp = expected_element(native, oracle, window.model.selected.native_seq, (1, 2))
    assert (inspector.cell_text("hex bits", "native"), inspector.cell_text("decimal", "native")) == (n_hex, n_dec)
    assert (inspector.cell_text("hex bits", "oracle"), inspector.cell_text("decimal", "oracle")) == (o_hex, o_dec)
    assert ulp == 1 and inspector.verdict.text() == "1 ULP apart"
    shoot(window, artifacts_dir, "inspector-small-pair")


def test_filter_box_narrows_the_tree_and_keeps_matching_ops(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.open_pair(*small_pair(tmp_path))
    wait_compared(qtbot, window)
    assert set(window.tree.visible_leaf_labels()) == {"attn_norm", "layer_out"}
    qtbot.keyClicks(window.tree.filter, "layer_o")
    assert window.tree.visible_leaf_labels() == ["layer_out"]
    window.tree.filter.clear()
    qtbot.keyClicks(window.tree.filter, "diverged")
    assert window.tree.visible_leaf_labels() == ["attn_norm"]
    counts = window.model.comparison.summary
    assert window.tree.summary.text() == counts
    qtbot.keyClicks(window.tree.filter, "zzz")
    assert window.tree.visible_leaf_labels() == [] and window.tree.summary.text().startswith("No row matches “divergedzzz”: the filter reads")
    window.tree.filter.clear()
    assert window.tree.summary.text() == counts, "the counts come back with the rows"


@pytest.mark.slow
def test_a_filter_naming_a_layer_or_a_step_shows_the_ops_under_it_and_a_kind_only_the_ops_of_that_kind(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    # "layer 1" showed nine empty "layer 1" groups: their ops name no layer.
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    pairs = window.model.comparison.comparison.pairs
    window.tree.filter.setText("layer 1")
    assert sorted(window.tree.visible_leaf_labels()) == sorted(p.key.op for p in pairs if p.key.layer == 1)
    window.tree.filter.setText("step 3")
    assert sorted(window.tree.visible_leaf_labels()) == sorted(p.key.op for p in pairs if p.key.step == 3)
    window.tree.filter.setText("diverged")
    assert len(window.tree.visible_leaf_labels()) == sum(1 for p in pairs if str(p.verdict) == "diverged")


def test_the_filter_never_changes_the_selected_op_and_clearing_it_shows_that_op_again(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.open_pair(*small_pair(tmp_path))
    wait_compared(qtbot, window)
    layer_out = next(p for p in window.model.comparison.comparison.pairs if p.key.op == "layer_out")
    window.model.select(layer_out)
    qtbot.keyClicks(window.tree.filter, "attn")
    assert window.tree.visible_leaf_labels() == ["attn_norm"]
    assert window.model.selected is layer_out, "the row the view fell back on is not the user's choice"
    assert not window.tree.view.selectionModel().hasSelection()
    window.tree.filter.clear()
    assert window.model.selected is layer_out
    current = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0))
    assert current.data(PAIR_ROLE) is layer_out
    qtbot.keyClicks(window.tree.filter, "layer")
    assert window.model.selected is layer_out and window.tree.view.currentIndex().isValid()


def _ffn_norm_without_partner(tmp_path: Path, finished: bool = False) -> tuple[Path, Path]:
    """attn_norm on both sides, bit-exact; the native's capture (unfinished unless `finished`)
    also holds ffn_norm, which the oracle lacks: the first finding is that record, and the
    weights hashes differ."""
    from sessions.capture.meta import CaptureMeta
    from sessions.capture.writer import CaptureWriter

    bits = bf16_bits(np.arange(8, dtype=np.float32).reshape(2, 4))
    oracle = write_capture(tmp_path / "w.oracle.h5", "oracle", [T("attn_norm", bits, layer=0, dtype="bfloat16")], weights_hash="sha256:aa")
    native = tmp_path / "w.native.h5"
    writer = CaptureWriter(native, CaptureMeta(role="native", engine_name="hand-native", model_id="hand-model", weights_hash="sha256:bb", prompt="p"))
    writer.add_tensor("attn_norm", bits, step=0, segment="prefill", layer=0, dtype="bfloat16")
    writer.add_tensor("ffn_norm", bits, step=0, segment="prefill", layer=0, dtype="bfloat16")
    writer.end_step()
    if finished:
        writer.close()
    else:
        writer.abandon()
    return native, oracle


def test_arriving_on_a_record_without_a_partner_keeps_the_users_filter(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.open_pair(*_ffn_norm_without_partner(tmp_path))
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy and window.tree.view.currentIndex().isValid(), timeout=WAIT_MS)
    window.tree.filter.setText("attn_norm")
    first = window.model.comparison
    window.start_compare()
    qtbot.waitUntil(lambda: window.model.comparison not in (None, first) and not window.tasks.busy, timeout=WAIT_MS)
    qtbot.wait(50)  # the arrival runs on a timer of its own
    assert window.tree.filter.text() == "attn_norm", "the window arriving by itself leaves the typed filter alone"
    assert window.tree.visible_leaf_labels() == ["attn_norm"]
    assert not window.tree.view.currentIndex().isValid() and window.model.selected is None
    qtbot.keyClick(window, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
    current = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0))
    assert window.tree.filter.text() == "" and current.data(UNALIGNED_ROLE).name == "ffn_norm", "Ctrl+J, the user's own ask, shows it under any filter"


def test_the_html_export_puts_the_tree_back_on_the_record_without_a_partner_it_found(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """With no op selected, the tree was left on the last bookmark's op."""
    window.open_pair(*_ffn_norm_without_partner(tmp_path, finished=True))
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy and window.tree.view.currentIndex().isValid(), timeout=WAIT_MS)
    record = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0)).data(UNALIGNED_ROLE)
    window.model.select(window.model.comparison.comparison.pairs[0])
    wait_compared(qtbot, window)
    assert window.session_sync.add_bookmark("attn_norm") is not None
    window.tree.reveal_unaligned(record)
    assert window.model.selected is None

    with qtbot.waitSignal(window.report_export.exported, timeout=WAIT_MS):
        assert window.report_export.export_html(tmp_path / "report.html")
    wait_idle(qtbot, window)

    current = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0))
    assert current.data(UNALIGNED_ROLE) == record and window.model.selected is None


def test_weights_mismatch_incomplete_capture_and_unaligned_records_are_shown(qtbot: QtBot, window: MainWindow, tmp_path: Path, artifacts_dir: Path) -> None:
    window.open_pair(*_ffn_norm_without_partner(tmp_path))
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy and window.tree.view.currentIndex().isValid(), timeout=WAIT_MS)
    texts = window.banners.texts()
    assert any("WEIGHTS HASH MISMATCH" in t and "sha256:bb" in t for t in texts)
    assert any("incomplete: the writer did not finish" in t and "w.native.h5" in t for t in texts)
    branch = window.tree.items.item(window.tree.items.rowCount() - 1, 0)
    assert branch.text() == "Unaligned records (1)"
    assert branch.child(0, 0).text().startswith("native: ffn_norm")
    assert window.tree.items.itemFromIndex(branch.child(0, 3).index()).text() == "no partner: no oracle record for step 0 prefill layer 0 ffn_norm"
    strip = window.verdict_strip
    assert strip.word.text() == "UNUSABLE", "a verdict on a capture whose writer did not finish, where report exits 2"
    assert strip.detail.text() == "native w.native.h5 is incomplete (its writer did not finish): no verdict, as report gives none; what it holds is compared below"
    assert not window.report_export.export_html(tmp_path / "r.html") and not (tmp_path / "r.html").exists(), "its page said the verdict report does not give"
    said = "No HTML report of this pair: native w.native.h5 is incomplete (its writer did not finish), and report gives no verdict on it."
    qtbot.waitUntil(lambda: said in window.banners.texts("session"))
    current = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0))
    assert current.data(UNALIGNED_ROLE).name == "ffn_norm" and window.model.selected is None, "the window arrives on the first finding, not on a bit-exact op"
    layer = window.tree.items.item(0, 0).child(0, 0).child(0, 0)
    status = Qt.ItemDataRole.UserRole + 2
    assert (layer.text(), layer.data(status), branch.data(status)) == ("layer 0", Kind.UNALIGNED, Kind.UNALIGNED), "the DIVERGENCE is not a green tree"
    assert "weights_hash" in window.provenance.mismatched_fields()
    window.show_panel(3)
    table = window.provenance.table
    assert table.textElideMode() == Qt.TextElideMode.ElideMiddle, "two hashes that differ at their end must not read alike"
    assert "italic: differs by design between a port and its oracle" in window.provenance.summary.text()
    shoot(window, artifacts_dir, "provenance-weights-mismatch")


def test_light_theme_renders_the_tensor_view(qtbot: QtBot, window: MainWindow, tmp_path: Path, artifacts_dir: Path) -> None:
    window.open_pair(*small_pair(tmp_path))
    wait_compared(qtbot, window)
    window.toggle_theme()
    assert window.settings.theme() == "light"
    assert "#f5f6f8" in QApplication.instance().styleSheet()
    shoot(window, artifacts_dir, "light-theme")
    window.toggle_theme()


@pytest.mark.slow
def test_the_light_theme_recolours_the_overviews_label_backing(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path
) -> None:
    # The Overview's first-finding label kept the dark theme's black backing (the timeline's
    # selected call, outlined in white on a white plot, is in the screenshot).
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    window.show_panel(1)
    window.toggle_theme()
    try:
        assert window.overview.first_label.fill.color().name() == "#ffffff"
        window.show_panel(4)
        QApplication.processEvents()
        shoot(window, artifacts_dir, "light-theme-dispatch-timeline")
    finally:
        window.toggle_theme()
    assert window.overview.first_label.fill.color().name() == "#161a20"


def test_command_line_files_open_as_native_then_oracle(qtbot: QtBot, tmp_path: Path) -> None:
    from viewer.app import create_window
    from viewer.viewer_request import build_parser

    native, oracle = small_pair(tmp_path)
    args = build_parser().parse_args([str(oracle), str(native), "--settings", str(tmp_path / "cli.ini")])
    win = create_window(args.files, ViewerSettings(args.settings))
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    # Positional order wins over the files' role hints: the user said which is which.
    assert (win.model.native.path, win.model.oracle.path) == (oracle, native)
    win.close()


def test_a_failed_read_offers_a_deep_check_that_names_the_damaged_chunk(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    import zlib

    from tests.test_capture_hostile_reads import ELEMENTS, pair_with_raw_chunk

    corrupt = bytearray(zlib.compress(np.ones(ELEMENTS, np.float32).tobytes()))
    corrupt[len(corrupt) // 2] ^= 0xFF
    hostile, twin = pair_with_raw_chunk(tmp_path, bytes(corrupt))
    window.open_pair(hostile, twin)
    qtbot.waitUntil(lambda: any("Check both files deeply" in b.buttons for b in window.banners.banners("comparison")), timeout=WAIT_MS)
    offer = next(b for b in window.banners.banners("comparison") if "Check both files deeply" in b.buttons)
    assert offer.text.startswith("The comparison failed:")
    offer.buttons["Check both files deeply"].click()
    qtbot.waitUntil(lambda: len(window.banners.texts("deep-check")) == 2, timeout=WAIT_MS)
    texts = window.banners.texts("deep-check")
    assert any(t.startswith(f"{hostile.name}: ") and "chunk at (0,)" in t for t in texts), texts
    assert any(t.startswith(f"{twin.name}: every tensor reads back") for t in texts)


class _WindowsShown(QObject):
    """Every widget shown as a window of its own, the main window excepted."""

    def __init__(self, main: QWidget) -> None:
        super().__init__()
        self.main = main
        self.shown: list[str] = []

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Show and isinstance(watched, QWidget) and watched.isWindow() and watched is not self.main:
            self.shown.append(type(watched).__name__)
        return False


def test_a_banner_with_details_opens_no_window_of_its_own_and_the_window_keeps_the_keyboard(qtbot: QtBot, tmp_path: Path) -> None:
    """A parentless widget made visible is a window of its own: the contract card's Details
    toggle and text flashed as windows and took the keyboard focus, so Ctrl+J did nothing until
    the user clicked the window again."""
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win)
    spy = _WindowsShown(win)
    QApplication.instance().installEventFilter(spy)
    try:
        win.banners.show_message("comparison", "error", "At 0:visual:0:sdpa native ran attn.bf16", details="the contract's details", expanded=True)
        win.banners.show_message("captures", "warning", "a card shown folded", details="more", expanded=False)
        qtbot.wait(50)
    finally:
        QApplication.instance().removeEventFilter(spy)
    assert spy.shown == []
    assert QApplication.activeWindow() is win
    qtbot.keyClick(win, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
    assert win.statusBar().currentMessage() == "Open a pair first.", "Ctrl+J reached the window"
    win.close()


def test_the_window_fits_a_1024_by_768_screen_with_every_panel(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path
) -> None:
    window = MainWindow(ViewerSettings(tmp_path / "small.ini"))
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    for panel in range(window.tabs.count()):
        window.show_panel(panel)
        QApplication.processEvents()
        least = window.minimumSizeHint()
        assert least.width() <= 1024 and least.height() <= 700, (window.tabs.tabText(panel), least)
    window.show_panel(0)
    QApplication.processEvents()
    assert (window.width(), window.height()) == (1024, 700)
    assert window.grab().save(str(artifacts_dir / "viewer-1024x700.png"))
    window.close()


def test_shrunk_with_the_contract_card_open_the_inspector_scrolls_rather_than_draw_rows_over_each_other(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    window.open_pair(*demo_pairs["attention-contract"])
    wait_compared(qtbot, window)
    window.resize(1024, 700)
    QApplication.processEvents()
    cells = list(window.tensor_view.inspector._cells.values())
    assert cells and all(cell.height() >= cell.minimumSizeHint().height() for cell in cells)


@pytest.mark.parametrize(("signum", "from_a_command"), [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGTERM, True)])
def test_ctrl_c_or_sigterm_closes_the_window_as_its_close_button_does(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, python_ctrl_c: None, signum: int, from_a_command: bool
) -> None:
    """Qt's event loop runs no Python while it waits, so Ctrl-C surfaced in the next slot (an
    autosave tick) as an "uncaught error", and the viewer kept running; `kill` of `parity-xray
    demo`'s window did the same. The signal here comes from another thread while the window
    waits, as a terminal's does."""
    outside = signal.signal(signal.SIGTERM, signal.SIG_DFL if from_a_command else lambda *_: None)  # what `demo` finds, or a catch if the window does not take it
    try:
        with ctrl_c_kept() if from_a_command else contextlib.nullcontext(), closing_on_ctrl_c(window):
            threading.Timer(0.2, os.kill, (os.getpid(), signum)).start()
            qtbot.waitUntil(lambda: not window.isVisible(), timeout=10_000)
    finally:
        signal.signal(signal.SIGTERM, outside)
    assert window.banners.banners("uncaught") == []
    assert (tmp_path / "viewer.ini").exists(), "closed as its close button closes it: the layout is saved"


def test_the_html_report_is_rendered_and_written_off_the_ui_thread(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """Rendering a 240,000-pair report held the window 0.3-0.45 s: export_html now returns at once
    and `exported` says when the page is there."""
    window.open_pair(*demo_pairs["swiglu-order"])
    wait_compared(qtbot, window)
    exported: list[Path] = []
    window.report_export.exported.connect(exported.append)
    page = tmp_path / "report.html"
    with qtbot.waitSignal(window.report_export.exported, timeout=WAIT_MS):
        assert window.report_export.export_html(page)
        assert exported == [], "export_html returned before the page was written"
    assert exported == [page] and "swiglu" in page.read_text(encoding="utf-8").lower()
