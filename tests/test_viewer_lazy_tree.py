"""A comparison of a real model's size (240,000 op rows) makes its tree rows only when a group opens.

Making every row up front took over a minute for 240,000 pairs. These tests lower the threshold to
the demo pair's size, so the real window, tree and comparison run the large path: groups are made
when opened, Ctrl+J and the filter still reach ops inside groups nobody opened.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from viewer.settings import ViewerSettings
from viewer.tree import alignment_tree
from viewer.tree.alignment_tree import PAIR_ROLE, PLACEHOLDER_ROLE
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

WAIT_MS = 120_000


@pytest.fixture
def lazy_window(qtbot: QtBot, tmp_path: Path, demo_pairs: dict, monkeypatch: pytest.MonkeyPatch) -> MainWindow:
    monkeypatch.setattr(alignment_tree, "LAZY_FROM_ROWS", 10)
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1280, 720)
    win.show()
    win.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    yield win
    win.close()


def _made_op_rows(win: MainWindow) -> int:
    return len(win.tree._items)


def test_only_the_opened_groups_rows_exist_and_opening_a_group_makes_them(lazy_window: MainWindow, qtbot: QtBot) -> None:
    tree = lazy_window.tree
    pairs = lazy_window.model.comparison.comparison.pairs
    made = _made_op_rows(lazy_window)
    assert made < len(pairs), "the rows of unopened groups are not made"
    assert "made when it is opened" in tree.summary.text()
    last_step = tree.proxy.index(tree.proxy.rowCount() - 2, 0)
    unopened = tree.proxy.mapToSource(last_step)
    assert tree.proxy.hasChildren(last_step), "an unopened group still shows it can be opened"
    assert tree.items.rowCount(unopened) == 1 and tree.items.index(0, 0, unopened).data(PLACEHOLDER_ROLE), "only its placeholder row exists"
    tree.view.expand(last_step)
    assert tree.proxy.rowCount(last_step) > 0
    segment = tree.proxy.index(0, 0, last_step)
    tree.view.expand(segment)
    layer = tree.proxy.index(0, 0, segment)
    tree.view.expand(layer)
    assert tree.proxy.mapToSource(tree.proxy.index(0, 0, layer)).data(PAIR_ROLE) is not None
    assert _made_op_rows(lazy_window) > made


def test_ctrl_j_and_the_filter_reach_ops_in_groups_nobody_opened(lazy_window: MainWindow, qtbot: QtBot) -> None:
    first = lazy_window.model.comparison.comparison.verdict.first
    assert first is not None
    qtbot.keyClick(lazy_window, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
    assert lazy_window.model.selected is not None and lazy_window.model.selected.key == first.key
    current = lazy_window.tree.view.currentIndex()
    assert lazy_window.tree.proxy.mapToSource(current.siblingAtColumn(0)).data(PAIR_ROLE) is lazy_window.model.selected

    lazy_window.tree.filter.setText("ffn_down")
    expected = sum(p.key.op == "ffn_down" for p in lazy_window.model.comparison.comparison.pairs)
    shown = min(expected, alignment_tree.FILTER_MADE_MAX)
    assert shown > 1 and lazy_window.tree.visible_leaf_labels() == ["ffn_down"] * shown

    last = lazy_window.model.comparison.comparison.pairs[-1]
    lazy_window.tree.filter.setText(last.key.text())
    assert lazy_window.tree.visible_leaf_labels() == [last.key.op], "a key copied from report's output finds its op"


def test_a_filter_finding_more_ops_than_it_makes_says_so(lazy_window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alignment_tree, "FILTER_MADE_MAX", 3)
    before = lazy_window.tree.summary.text()
    lazy_window.tree.filter.setText("layer_out")
    expected = sum(p.key.op == "layer_out" for p in lazy_window.model.comparison.comparison.pairs)
    assert f"the first 3 of {expected} matching ops are shown" in lazy_window.tree.summary.text()
    assert len(lazy_window.tree.visible_leaf_labels()) >= 3
    lazy_window.tree.filter.clear()
    assert lazy_window.tree.summary.text() == before and "made when it is opened" in before, "no filter's note outlives it"


def test_the_filter_finds_each_matching_pair_once_in_order_and_counts_past_the_limit() -> None:
    from viewer.comparison_view import TreeGroup, TreePlaces, search_lines

    places = TreePlaces(TreeGroup(""), {}, search_lines(["q_proj step 0", "ffn_up ffn step 0", "sdpa step 1", "ffn_down step 1"]))
    assert places.matches("ffn", 10) == ([1, 3], 2)
    assert places.matches("ffn", 1) == ([1], 2)
    assert places.matches("step 1", 10) == ([2, 3], 2)
    assert places.matches("zzz", 10) == ([], 0)
    assert places.matches("step", 1) == ([0], 4) and places.matches("step", 3) == ([0, 1, 2], 4), "counted past the limit at once"
    assert places.matches("ffn", 0) == ([], 2), "a line holding the needle twice counts once"


def test_the_filter_matches_text_beyond_ascii_and_never_across_lines() -> None:
    from viewer.comparison_view import TreeGroup, TreePlaces, search_lines

    places = TreePlaces(TreeGroup(""), {}, search_lines(["café_proj step 0", "cafe step 1", "line\nbreak step 2", "tail\0"]))
    assert places.matches("café", 10) == ([0], 1)
    assert places.matches("é_p", 10) == ([0], 1), "a needle starting inside a multi-byte character's text still matches"
    assert places.matches("cafe", 10) == ([1], 1)
    assert places.matches("line break", 10) == ([2], 1), "a newline in a name reads as a space"
    assert places.matches("0\ncafe", 10) == ([], 0)
    assert places.matches("", 10) == ([], 0)
    assert places.matches("\0", 10) == ([], 0)
    assert TreePlaces(TreeGroup(""), {}, search_lines([])).matches("step", 10) == ([], 0)


def test_a_rebuilt_tree_keeps_its_hidden_columns_and_column_widths(lazy_window: MainWindow) -> None:
    tree = lazy_window.tree
    header = tree.view.header()
    header.resizeSection(2, 123)
    differing = header.sectionSize(3)
    comparison = lazy_window.model.comparison
    lazy_window.model.set_comparison(comparison)
    assert tree.view.isColumnHidden(1) and tree.view.isColumnHidden(alignment_tree.CAUSE_COLUMN)
    assert header.sectionSize(2) == 123 and header.sectionSize(3) == differing
    assert tree.proxy.rowCount() > 0


def test_a_filter_that_matches_group_labels_makes_no_rows_beyond_its_first_matches(lazy_window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the groups the filter lets through made their rows, whose matching groups were
    opened in turn: "l" (it is in "layer", "decode" ...) made a real model's 260,000 rows, 47 s."""
    monkeypatch.setattr(alignment_tree, "FILTER_MADE_MAX", 3)
    made = _made_op_rows(lazy_window)
    lazy_window.tree.filter.setText("l")
    assert _made_op_rows(lazy_window) <= made + 3
    assert lazy_window.tree.filter.text() == "l" and lazy_window.tree.proxy.rowCount() > 0
    lazy_window.tree.filter.clear()
    step = lazy_window.tree.proxy.index(lazy_window.tree.proxy.rowCount() - 2, 0)
    lazy_window.tree.view.expand(step)
    assert lazy_window.tree.proxy.rowCount(step) > 0, "a group the user opens is still made"


def test_a_key_copied_from_report_finds_a_record_without_a_partner(qtbot: QtBot, tmp_path: Path, demo_pairs: dict) -> None:
    """The filter matched keys only on rows holding a pair: `report`'s key of a record without a
    partner found "No row matches"."""
    from sessions.compare.comparison import unaligned_key
    from tests.viewer_windows import window_on
    from viewer import comparison_view as cv

    win = window_on(qtbot, tmp_path, *demo_pairs["post-eos"])
    record = win.model.comparison.comparison.post_eos_unaligned[-1]
    win.tree.filter.setText(unaligned_key(record).text())
    assert cv.unaligned_label(record) in win.tree.visible_leaf_labels()
    assert not win.tree.summary.text().startswith("No row matches")
    win.close()


def test_many_records_without_a_partner_are_grouped_by_step_and_the_lazy_filter_finds_them(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the branch of a real run's 40,000 records without a partner made them all (1.5 s),
    and the lazy tree's filter searched only pairs: `l_out`, 40,000 such records, found "No row"."""
    from sessions.compare.comparison import unaligned_key
    from tests.viewer_windows import window_on
    from viewer import comparison_view as cv

    monkeypatch.setattr(alignment_tree, "LAZY_FROM_ROWS", 10)
    monkeypatch.setattr(cv, "RECORDS_BY_STEP_FROM", 10)
    win = window_on(qtbot, tmp_path, *demo_pairs["post-eos"])
    tree, comparison = win.tree, win.model.comparison
    records = comparison.comparison.post_eos_unaligned
    assert len(records) > 10
    branch = tree.proxy.index(tree.proxy.rowCount() - 1, 0)
    assert str(branch.data()).startswith("Post-EOS records without a partner")
    tree.view.expand(branch)
    steps = sorted({r.step for r in records})
    assert [tree.proxy.index(r, 0, branch).data() for r in range(tree.proxy.rowCount(branch))] == [f"step {s}" for s in steps]
    assert not any(id(r) in tree._unaligned_items for r in records), "no record's row is made before its step is opened"
    record = records[-1]
    tree.filter.setText(unaligned_key(record).text())
    assert cv.unaligned_label(record) in tree.visible_leaf_labels()
    assert not tree.summary.text().startswith("No row matches")
    win.close()
