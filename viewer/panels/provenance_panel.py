"""Both captures' provenance side by side, with the fields the diff engine found different marked.

The values come straight from each capture's metadata (capture_reader); which fields count
as mismatches is the comparison's provenance diff, never decided here.
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from sessions.capture.reader import Capture
from sessions.printable import excerpt, printable
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.widgets.plain_text import plain_label, plain_tip

MISMATCH_BACKGROUND = QColor(214, 69, 65, 70)
CELL_CHARACTERS, TIP_CHARACTERS = 500, 4000
"""A value (the prompt) is shown up to this long in its cell and its tooltip: Qt lays out a cell's
whole text to size its row, and a 60 MB prompt took 90 s and 3.7 GB to open."""


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            _flatten(f"{prefix}.{key}" if prefix else str(key), value[key], out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = str(value)


def provenance_rows(capture: Capture | None) -> dict[str, str]:
    """The capture's metadata as field -> text, provenance JSON flattened with dotted keys."""
    if capture is None:
        return {}
    meta = capture.meta.as_dict()
    rows: dict[str, str] = {}
    for key, value in meta.items():
        if key != "provenance":
            rows[key] = str(value)
    rows["complete"] = "yes" if capture.complete else "NO: the writer did not finish"
    rows["file"] = str(capture.path)
    rows["records"] = str(len(capture.index))
    _flatten("provenance", meta.get("provenance", {}), rows)
    return rows


class ProvenancePanel(QWidget):
    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.summary = plain_label()
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["field", "native", "oracle"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        # Hashes and paths differ at either end: cut at the end, two weights hashes that differ
        # only in their last characters read the same.
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table)
        model.captures_changed.connect(self.refresh)
        model.comparison_changed.connect(self.refresh)
        self.refresh()

    def mismatched_fields(self) -> set[str]:
        return cv.provenance_mismatches(self._model.comparison)

    def refresh(self) -> None:
        native = provenance_rows(self._model.native)
        oracle = provenance_rows(self._model.oracle)
        mismatched = self.mismatched_fields()
        expected = cv.provenance_expected(self._model.comparison)
        keys = list(native) + [k for k in oracle if k not in native]
        muted = QFont()
        muted.setItalic(True)
        self.table.setRowCount(len(keys))
        bold = QFont()
        bold.setBold(True)
        for row, key in enumerate(keys):
            cells = (key, native.get(key, "—"), oracle.get(key, "—"))
            differs = key in mismatched or (key == "complete" and "NO" in cells[1] + cells[2])
            for col, text in enumerate(cells):
                item = QTableWidgetItem(printable(excerpt(text, CELL_CHARACTERS)))  # a zero-width space or U+2028 in a hash or name shows, as in the report
                item.setToolTip(plain_tip(excerpt(text, TIP_CHARACTERS)))
                if differs:
                    item.setBackground(QBrush(MISMATCH_BACKGROUND))
                    item.setFont(bold)
                elif key in expected:
                    item.setFont(muted)
                    item.setToolTip(plain_tip(f"{excerpt(text, TIP_CHARACTERS)}\n(differs by design between a port and its oracle: not a problem)"))
                self.table.setItem(row, col, item)
        viewed = self._model.comparison
        if viewed is None:
            self.summary.setText("Provenance of the open captures")
        else:
            problems = f"  ·  {len(mismatched)} field(s) differ that should not: {', '.join(sorted(mismatched))}" if mismatched else ""
            by_design = "  ·  italic: differs by design between a port and its oracle" if any(k in expected and k not in mismatched for k in keys) else ""
            self.summary.setText(f"{printable(viewed.comparison.provenance.summary)}{problems}{by_design}")
        self.table.setProperty("mismatched_rows", [k for k in keys if k in mismatched])
        self.table.resizeRowsToContents()

