"""A click in the alignment tree highlights the row clicked, and that row's op is the one shown.

The tree used to re-centre itself on every selection, including the one the mouse press made;
the rows then moved under the pointer and the highlight could land on another op than the one
shown. A row far down a long, fully expanded tree is where that showed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtWidgets import QAbstractItemView
from pytestqt.qtbot import QtBot

from viewer.settings import ViewerSettings
from viewer.tree.alignment_tree import PAIR_ROLE, AlignmentTree
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

WAIT_MS = 120_000


def op_rows(tree: AlignmentTree) -> list[QModelIndex]:
    """Every op row of the tree (proxy indices, column 0), top to bottom."""
    rows: list[QModelIndex] = []

    def walk(parent: QModelIndex) -> None:
        for r in range(tree.proxy.rowCount(parent)):
            index = tree.proxy.index(r, 0, parent)
            if tree.proxy.mapToSource(index).data(PAIR_ROLE) is not None:
                rows.append(index)
            walk(index)

    walk(QModelIndex())
    return rows


def pair_of(tree: AlignmentTree, index: QModelIndex) -> object:
    return tree.proxy.mapToSource(index.siblingAtColumn(0)).data(PAIR_ROLE)


@pytest.mark.parametrize("column", [0, 3], ids=["op-column", "differing-column"])
def test_clicking_a_row_far_down_the_tree_highlights_and_shows_that_row(qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], column: int) -> None:
    from backends.demo.generate import DEFAULT_SCENARIO

    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1440, 900)
    win.show()
    qtbot.waitExposed(win)
    win.open_pair(*demo_pairs[DEFAULT_SCENARIO])
    qtbot.waitUntil(lambda: win.model.comparison is not None and win.tensor_view.data is not None and not win.tasks.busy, timeout=WAIT_MS)
    tree = win.tree
    tree.view.expandAll()
    rows = op_rows(tree)
    assert len(rows) > 100, "a tree long enough to scroll"
    target = rows[len(rows) * 9 // 10]
    assert pair_of(tree, target) is not win.model.selected
    tree.view.scrollTo(target, QAbstractItemView.ScrollHint.PositionAtBottom)
    cell = target.siblingAtColumn(column)
    where = tree.view.visualRect(cell).center()
    assert tree.view.indexAt(where) == cell, "the row is on screen, under the pointer"

    qtbot.mouseClick(tree.view.viewport(), Qt.MouseButton.LeftButton, pos=where)
    qtbot.waitUntil(lambda: not win.tasks.busy, timeout=WAIT_MS)

    clicked = pair_of(tree, target)
    assert win.model.selected is clicked
    assert tree.view.currentIndex().siblingAtColumn(0) == target
    assert tree.view.selectionModel().selectedRows() == [target], "the highlighted row is the clicked one, and only it"
    assert tree.view.indexAt(where).siblingAtColumn(0) == target, "the tree did not scroll another row under the pointer"
    assert tree.view.viewport().rect().contains(tree.view.visualRect(target)), "the row stays in view"
    assert win.tensor_view.data is not None and win.tensor_view.data.request.label == clicked.key.text()
    win.close()
