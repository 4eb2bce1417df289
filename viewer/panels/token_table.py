"""Token parity, one row per step: both greedy tokens, how their logits agree, and top-k side by side.

Comparison stops at the shared EOS (the seeds' first fix): the EOS row is marked and every
row after it is greyed and labelled post-EOS, so a difference there never reads as a failure.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
)
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics
from PySide6.QtWidgets import (
    QHeaderView,
    QStyle,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.widgets.plain_text import plain_label
from viewer.widgets.read_only_table import read_only
from viewer.widgets.stale_while_hidden import StaleWhileHidden

COLUMNS = ("step", "native", "oracle", "verdict", "Δlogit", "KL (nats)", "overlap", "native top-k", "oracle top-k")
HEADER_TIPS = {
    1: "The native's greedy token of the step",
    2: "The oracle's greedy token of the step",
    6: "The share of the top-k tokens both runs rank in their top-k",
    7: "The native's top-k tokens of the step, most likely first; a cell's tooltip gives each one's logit",
    8: "The oracle's top-k tokens of the step, most likely first; a cell's tooltip gives each one's logit",
}
"""The headers are short, so the top-k columns keep room for their token ids at 1280 px; what each says is in its tooltip."""
VERDICT_COLOURS = {"match": "#2e9d57", "match, logits differ": "#c9a227", "differ": "#d64541", "EOS": "#4a90d9", "post-EOS": "#7d8694"}
"""The verdict column's colours: a match over different logits is a near miss, in amber."""
MONO_COLUMNS = (1, 2, 4, 5, 6, 7, 8)
LONG_COLUMNS = (7, 8)
"""The top-k columns share the width the others leave, their text elided (whole in a tooltip):
sized to their text, they pushed the table into a sideways scroll at 1280x720, where the short
columns (the verdict's) are what a user reads first."""
VERDICT_COLUMN = 3
POST_EOS = "post-EOS"


class TokenRows(QAbstractTableModel):
    """The steps' rows, each cell made when the view asks for it: a real model's run has
    hundreds of steps, and an item per cell (nine per step) took 40-70 ms to make and its
    columns another 50-60 ms to measure, in one event-loop turn each."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.cells: list[tuple[str, ...]] = []
        """Each step's row as the texts of its cells, in COLUMNS order."""
        self.top_logits: list[tuple[str, str]] = []
        """Each step's (native, oracle) top-k with their logits: the top-k cells' tooltips."""
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        italic = {False: QFont(), True: QFont(mono)}
        for font in italic.values():
            font.setItalic(True)
        bold = QFont()
        bold.setBold(True)
        self._mono, self._italic, self._bold = mono, italic, bold
        self._grey = QBrush(QColor(VERDICT_COLOURS[POST_EOS]))
        self._verdicts = {verdict: QBrush(QColor(colour)) for verdict, colour in VERDICT_COLOURS.items()}
        self._unknown = QBrush(QColor(VERDICT_COLOURS["differ"]))

    def show(self, rows: list[cv.TokenRow]) -> None:
        self.beginResetModel()
        self.cells = [
            (str(r.step), r.native_token, r.oracle_token, r.verdict, r.delta_logit, r.kl, r.top_overlap, r.native_top_ids, r.oracle_top_ids) for r in rows
        ]
        self.top_logits = [(r.native_topk, r.oracle_topk) for r in rows]
        self.endResetModel()

    def widest(self, column: int, plain: QFont) -> int:
        """The widest text of a column, in the fonts its cells are drawn with: a cell's own font
        takes what it does not set (its size) from the view's, `plain`, as the view draws it."""
        own = self._bold if column == VERDICT_COLUMN else self._mono if column in MONO_COLUMNS else plain
        metrics = {False: QFontMetrics(own.resolve(plain)), True: QFontMetrics(self._italic[column in MONO_COLUMNS].resolve(plain))}
        texts = {(cells[column], cells[VERDICT_COLUMN] == POST_EOS) for cells in self.cells}
        return max((metrics[post_eos].horizontalAdvance(text) for text, post_eos in texts), default=0)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.cells)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return HEADER_TIPS.get(section)
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.TextAlignmentRole and section in LONG_COLUMNS:
            return int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)  # over the start of its ids, as its cells are
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        cells, column = self.cells[index.row()], index.column()
        verdict = cells[VERDICT_COLUMN]
        post_eos = verdict == POST_EOS
        if role == Qt.ItemDataRole.DisplayRole:
            return cells[column]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.top_logits[index.row()][LONG_COLUMNS.index(column)] if column in LONG_COLUMNS else None
        if role == Qt.ItemDataRole.ForegroundRole:
            if post_eos:
                return self._grey
            return self._verdicts.get(verdict, self._unknown) if column == VERDICT_COLUMN else None
        if role == Qt.ItemDataRole.FontRole:
            if post_eos:
                return self._italic[column in MONO_COLUMNS]
            if column == VERDICT_COLUMN:
                return self._bold
            return self._mono if column in MONO_COLUMNS else None
        return None


class TokenTable(QWidget):
    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.summary = plain_label("Token parity appears once a pair is compared")
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.rows = TokenRows(self)
        self.table = read_only(QTableView())
        self.table.setModel(self.rows)
        header = self.table.horizontalHeader()
        header.setStretchLastSection(False)
        for column in LONG_COLUMNS:
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table, 1)
        self._refresh = StaleWhileHidden(self, self._rebuild_now)
        model.comparison_changed.connect(self._refresh.request)

    def _rebuild_now(self) -> None:
        comparison = self._model.comparison
        self.show_rows(cv.token_rows(comparison) if comparison is not None else [])
        self.summary.setText(cv.token_summary(comparison) if comparison is not None else "Token parity appears once a pair is compared")

    def show_rows(self, rows: list[cv.TokenRow]) -> None:
        """The rows, with the short columns as wide as their widest text, measured once. Sized by
        Qt's contents mode, a hidden table measured every row's cells, each through the model in
        Python: 370 ms for a real model's hundreds of steps, on every resize."""
        self.rows.show(rows)
        self.table.ensurePolished()  # measured in the font the window's style sheet gives it
        header = self.table.horizontalHeader()
        margin = 2 * (self.table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, self.table) + 1) + 4
        for column in range(len(COLUMNS)):
            if column not in LONG_COLUMNS:
                header.resizeSection(column, max(header.sectionSizeFromContents(column).width(), self.rows.widest(column, self.table.font()) + margin))

    def show_step(self, step: int) -> None:
        """Select and scroll to `step`'s row (Ctrl+J on a token finding)."""
        self._refresh.bring_up_to_date()
        row = next((at for at, cells in enumerate(self.rows.cells) if cells[0] == str(step)), None)
        if row is not None:
            self.table.selectRow(row)
            self.table.scrollTo(self.rows.index(row, 0))

    def verdicts(self) -> list[str]:
        self._refresh.bring_up_to_date()
        return [cells[VERDICT_COLUMN] for cells in self.rows.cells]
