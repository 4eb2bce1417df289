"""The worst ops, as a sortable table: the same ranking `report` and the HTML print, one click from the tensors.

Rows are the pre-EOS ops whose bits differ (the worst WORST_OPS_SHOWN of them), ranked like
`worst_ops` (`WORST_ORDER`);
a header click re-sorts by any column, and selecting a row selects that op everywhere.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QHeaderView,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from sessions.compare.comparison import WORST_ORDER
from sessions.compare.verdict import Finding
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.theme import STATUS_COLOURS
from viewer.widgets.plain_text import plain_label
from viewer.widgets.read_only_table import read_only_table
from viewer.widgets.stale_while_hidden import StaleWhileHidden

COLUMNS = ("#", "op", "kind", "NMSE", "ULP p99", "max ULP", "differing", "1 − cos")
"""Short headers, the tree's where it has the column: as wide as their contents, the long ones
("ULP steps max") pushed the differing column past the edge at 1280x720. The cosine's distance
from 1 (3.8e-05), not the cosine (0.999961800): of near-parallel tensors the digits that matter,
in a column that fits where the cosine's eleven characters were cut at 1280x720."""
PAIR_ROLE = Qt.ItemDataRole.UserRole + 1
WIDTH_FROM_ROWS = 100
"""Columns take the width of their first rows' contents (and the rows in view): measured over
all 1,000 rows of a diverged run, every paint of the table took 50-70 ms."""


class NumberItem(QTableWidgetItem):
    """Sorts by its number, not its text (1e-05 after 2e-06)."""

    def __init__(self, text: str, value: float) -> None:
        super().__init__(text)
        self.value = value
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        return self.value < other.value if isinstance(other, NumberItem) else super().__lt__(other)


class WorstOpsTable(QWidget):
    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 8, 4, 8)  # 8 px a side more and the last column went behind a scroll at 1280x720
        self.summary = plain_label("The worst ops appear once a pair is compared")
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)  # a long summary wraps: one line of it set the window's least width
        layout.addWidget(self.summary)
        self.table = read_only_table(COLUMNS)
        header = self.table.horizontalHeader()
        # Every column as wide as its contents, the op key whole: a narrow window scrolls
        # sideways rather than cut the key to "0:visua…".
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setResizeContentsPrecision(WIDTH_FROM_ROWS)
        header.setStretchLastSection(False)
        header.setSortIndicator(0, Qt.SortOrder.AscendingOrder)
        self.table.itemSelectionChanged.connect(self._selected)
        # A click on the row already highlighted selects its op again (after Ctrl+J went elsewhere).
        self.table.cellClicked.connect(lambda *_: self._selected())
        layout.addWidget(self.table, 1)
        self._refresh = StaleWhileHidden(self, self._rebuild_now)
        model.comparison_changed.connect(self._refresh.request)
        model.selection_changed.connect(self._follow)

    def _rebuild_now(self) -> None:
        viewed = self._model.comparison
        self.table.setSortingEnabled(False)
        rows = viewed.worst if viewed is not None else []
        self.table.setRowCount(len(rows))
        for r, pair in enumerate(rows):
            m = pair.metrics
            key = QTableWidgetItem(pair.key.text())
            key.setData(PAIR_ROLE, pair)
            kind = QTableWidgetItem(str(pair.verdict))
            kind.setForeground(QBrush(QColor(STATUS_COLOURS[pair.verdict])))
            cells = (
                NumberItem(str(r + 1), float(r)),
                key,
                kind,
                NumberItem(f"{m.nmse:.3e}", m.nmse),
                NumberItem(cv.pair_ulp_error_text(pair), m.p99_ulp_error or 0.0),
                NumberItem(cv.pair_max_ulp_text(pair), float(m.max_ulp or 0)),
                NumberItem(cv.pair_differing_text(pair), float(m.differing)),
                NumberItem(cosine_distance_text(m.cosine), 1.0 - m.cosine),
            )
            for c, item in enumerate(cells):
                self.table.setItem(r, c, item)
        self.table.setSortingEnabled(True)
        self._follow(self._model.selected)
        if viewed is None:
            self.summary.setText("The worst ops appear once a pair is compared")
        else:
            self.summary.setText(worst_ops_summary(viewed.differing, len(rows), viewed.comparison.verdict.first))

    def keys(self) -> list[str]:
        """The op keys in the order shown (tests)."""
        self._refresh.bring_up_to_date()
        return [self.table.item(r, 1).text() for r in range(self.table.rowCount())]

    def _follow(self, pair: Any) -> None:
        """The window chose an op: its row is highlighted, or none when it is not listed (the
        table kept highlighting the op clicked last, beside another in the tree and the maps).
        A table waiting to be rebuilt takes the selection when it is (`_rebuild_now`)."""
        if self._refresh.stale:
            return
        rows = [r for r in range(self.table.rowCount()) if self.table.item(r, 1).data(PAIR_ROLE) is pair] if pair is not None else []
        self.table.blockSignals(True)
        try:
            if rows:
                self.table.selectRow(rows[0])
            else:
                self.table.clearSelection()
        finally:
            self.table.blockSignals(False)
        self.table.viewport().update()

    def _selected(self) -> None:
        items = self.table.selectedItems()
        pair: Any = self.table.item(items[0].row(), 1).data(PAIR_ROLE) if items else None
        if pair is not None and pair is not self._model.selected:
            self._model.select(pair)


def cosine_distance_text(cosine: float) -> str:
    distance = 1.0 - cosine
    return "0" if distance == 0 else f"{distance:.2g}" if abs(distance) >= 1e-2 else f"{distance:.1e}"


def worst_ops_summary(differing: int, shown: int, first: Finding | None) -> str:
    """The line above the table. With no op's bits differing, a failing verdict's first finding is
    elsewhere (a dispatch difference, a contract, a record without a partner, a token step): say
    where, not just "0" (it named the Dispatch tab for a token step's finding)."""
    if differing == 0:
        where = "" if first is None else f"; the first finding, {first.kind} at {first.key}, is {cv.finding_place(first)} (Ctrl+J)"
        return f"No op's bits differ before any shared EOS{where}"
    worst = f"the worst {shown:,} of " if shown < differing else ""
    return f"{worst}{differing:,} op(s) differ before any shared EOS, worst first ({WORST_ORDER}); click a header to re-sort"
