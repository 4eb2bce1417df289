"""Token parity, one row per step: both greedy tokens, how their logits agree, and top-k side by side.

Comparison stops at the shared EOS (the seeds' first fix): the EOS row is marked and every
row after it is greyed and labelled post-EOS, so a difference there never reads as a failure.
"""

from __future__ import annotations

from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.widgets.read_only_table import read_only_table
from viewer.widgets.stale_while_hidden import StaleWhileHidden

COLUMNS = ("step", "native token", "oracle token", "verdict", "Δlogit", "KL (nats)", "top-k overlap", "native top-k (id: logit)", "oracle top-k (id: logit)")
VERDICT_COLOURS = {"match": "#2e9d57", "match, logits differ": "#c9a227", "differ": "#d64541", "EOS": "#4a90d9", "post-EOS": "#7d8694"}
"""The verdict column's colours: a match over different logits is a near miss, in amber."""
MONO_COLUMNS = (1, 2, 4, 5, 6, 7, 8)
LONG_COLUMNS = (7, 8)
"""The top-k columns, cut short by the view's width: their whole text is in a tooltip."""


class TokenTable(QWidget):
    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.summary = QLabel("Token parity appears once a pair is compared")
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.table = read_only_table(COLUMNS)
        header = self.table.horizontalHeader()
        for col in range(7):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(7, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(8, QHeaderView.ResizeMode.Stretch)
        # Columns fit the rows on screen: measuring all of a real model's hundreds of steps on
        # each resize took 30 ms, four times over when the hidden tab was painted.
        header.setResizeContentsPrecision(0)
        layout.addWidget(self.table, 1)
        self._refresh = StaleWhileHidden(self, self._rebuild_now)
        model.comparison_changed.connect(self._refresh.request)

    def _rebuild_now(self) -> None:
        comparison = self._model.comparison
        rows = cv.token_rows(comparison) if comparison is not None else []
        self.table.setRowCount(len(rows))
        self.summary.setText(cv.token_summary(comparison) if comparison is not None else "Token parity appears once a pair is compared")
        # Fonts and brushes made once: a real model's run has hundreds of steps, nine cells each.
        plain, mono = QFont(), QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        italic = {False: QFont(plain), True: QFont(mono)}
        for font in italic.values():
            font.setItalic(True)
        bold = QFont(plain)
        bold.setBold(True)
        grey = QBrush(QColor("#7d8694"))
        verdict_brushes = {verdict: QBrush(QColor(colour)) for verdict, colour in VERDICT_COLOURS.items()}
        for r, row in enumerate(rows):
            cells = (str(row.step), row.native_token, row.oracle_token, row.verdict, row.delta_logit, row.kl, row.top_overlap, row.native_topk, row.oracle_topk)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c in LONG_COLUMNS:
                    item.setToolTip(text)
                if row.verdict == "post-EOS":
                    item.setForeground(grey)
                    item.setFont(italic[c in MONO_COLUMNS])
                elif c == 3:
                    item.setForeground(verdict_brushes.get(row.verdict) or QBrush(QColor("#d64541")))
                    item.setFont(bold)
                elif c in MONO_COLUMNS:
                    item.setFont(mono)
                self.table.setItem(r, c, item)

    def verdicts(self) -> list[str]:
        self._refresh.bring_up_to_date()
        return [self.table.item(r, 3).text() for r in range(self.table.rowCount())]
