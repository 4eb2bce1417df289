"""The read-only table every panel lists things in: headers, whole-row selection, no editing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from PySide6.QtWidgets import QAbstractItemView, QTableView, QTableWidget

View = TypeVar("View", bound=QTableView)


def read_only(view: View) -> View:
    """A table view set up as every panel's list: also for a view over a model of its own."""
    view.verticalHeader().setVisible(False)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    return view


def read_only_table(columns: Sequence[str], rows: int = 0) -> QTableWidget:
    table = QTableWidget(rows, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    return read_only(table)
