"""Markup in a capture's names shows as text in the window, never as markup.

Segments, record names, engine names, kernel and contract ids and file names come from other
people's engines; Qt reads a label or tooltip that looks like markup as rich text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import shown_tip, window_on
from viewer.tree.alignment_tree import PAIR_ROLE, UNALIGNED_ROLE
from viewer.widgets.plain_text import code_text

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

SEGMENT = "<h1>SEG</h1>"
STRAY = "<h1>REC</h1><img src=x>"
HOSTILE = ("<h1>", "<img", "<u>", "<font", "<i>", "<s>", "<b>c</b>")


def _hostile_pair(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    norm = bf16_bits(rng.standard_normal((4, 8)))
    flipped = norm.copy()
    flipped[0, 1] ^= 1
    contract = dict(kernel_id="<font size=7>KERNEL</font>", contract_id="<b>c</b>")

    def tensors(out: np.ndarray, effective: str, stray: bool) -> list[T]:
        made = [T("attn_norm", norm, layer=0, segment=SEGMENT, dtype="bfloat16"), T("layer_out", out, layer=0, segment=SEGMENT, dtype="bfloat16", effective_contract_id=effective, **contract)]
        return made + ([T(STRAY, norm, layer=0, segment=SEGMENT, dtype="bfloat16")] if stray else [])

    native = write_capture(tmp_path / "<i>n.h5", "native", tensors(flipped, "<u>e1</u>", True), [(0, 5, False)], engine_name="<h1>ENGINE</h1>", device="<i>dev</i>")
    oracle = write_capture(tmp_path / "o.h5", "oracle", tensors(norm, "<u>e2</u>", False), [(0, 5, False)], engine_name="<s>oracle</s>")
    return native, oracle


def _items(model, parent=None):  # type: ignore[no-untyped-def]
    parent = parent if parent is not None else model.invisibleRootItem()
    for row in range(parent.rowCount()):
        item = parent.child(row, 0)
        yield item
        yield from _items(model, item)


def test_names_holding_markup_show_as_text_in_labels_banners_and_tooltips(tmp_path: Path, qtbot: QtBot) -> None:
    win = window_on(qtbot, tmp_path, *_hostile_pair(tmp_path))
    assert win.verdict_strip.word.text() == "CONTRACT MISMATCH"
    assert f"at 0:{SEGMENT}:0:layer_out" in win.verdict_strip.detail.text()
    [card] = [banner for banner in win.banners.banners("comparison") if banner.label.textFormat() == Qt.TextFormat.RichText]
    assert card.label.text() == (
        "<b>At <code>0:&lt;h1&gt;SEG&lt;/h1&gt;:0:layer_out</code></b> native ran <code>&lt;u&gt;e1&lt;/u&gt;</code>, oracle <code>&lt;u&gt;e2&lt;/u&gt;</code>"
    ), "the contract card is markup, its names escaped"
    assert "&lt;font size=7&gt;KERNEL&lt;/font&gt;" in card.details.text() and "<font" not in card.details.text()
    holding = [label for label in win.findChildren(QLabel) if any(raw in label.text() for raw in HOSTILE)]
    assert win.verdict_strip.detail in holding and win.role_label in holding
    assert [label.text() for label in holding if label.textFormat() != Qt.TextFormat.PlainText] == []
    assert "<i>n.h5" in win.role_label.text()
    tips = {}
    for item in _items(win.tree.items):
        pair, record = item.data(PAIR_ROLE), item.data(UNALIGNED_ROLE)
        if pair is not None or record is not None:
            tips[item.text()] = item.toolTip()
    stray_tip = next(tip for text, tip in tips.items() if STRAY in text)
    assert STRAY in shown_tip(stray_tip) and "<img" not in stray_tip
    assert all("<h1>" not in tip for tip in tips.values())
    assert SEGMENT in shown_tip(win.verdict_strip.detail.toolTip()) and SEGMENT not in win.verdict_strip.detail.toolTip()
    win.close()


def test_a_domain_sentence_shows_its_code_spans_as_code_and_any_markup_in_it_as_text(qtbot: QtBot) -> None:
    sentence = "the native ran `<b>c</b>` on <h1>SEG</h1>\nthen `rerun --weights FILE`"
    rich = code_text(sentence)
    assert rich == "<qt>the native ran <code>&lt;b&gt;c&lt;/b&gt;</code> on &lt;h1&gt;SEG&lt;/h1&gt;<br>then <code>rerun --weights FILE</code></qt>"
    assert shown_tip(rich) == "the native ran <b>c</b> on <h1>SEG</h1>\nthen rerun --weights FILE"
    assert code_text("") == ""


def test_a_prompt_of_megabytes_shows_its_start_and_length_in_the_provenance_table(tmp_path: Path, qtbot: QtBot) -> None:
    """Qt laid out a cell's whole text to size its row: two 60 MB prompts took 90 s and 3.7 GB to open."""
    prompt = "ab\n" * 1_000_000
    pair = [write_capture(tmp_path / f"{role}.h5", role, [T("attn_norm", np.zeros(4, np.float32), layer=0)], prompt=prompt) for role in ("native", "oracle")]
    win = window_on(qtbot, tmp_path, *pair)
    table = win.provenance.table
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "prompt")
    for col in (1, 2):
        item = table.item(row, col)
        assert item.text() == "ab\\n" * 166 + "ab… (3,000,000 characters in all)"
        assert shown_tip(item.toolTip()) == "ab\n" * 1333 + "a… (3,000,000 characters in all)"
