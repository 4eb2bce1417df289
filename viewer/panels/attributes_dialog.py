"""A record's raw HDF5 attributes beside its index row, native and oracle side by side.

When a pairing or a value looks wrong, the user wants what the engine actually wrote next to
the tensor (`ggml_src`, `logical_dtype`, a recorder's own notes), not the viewer's reading of
it. The rows come from `sessions.capture.record_attributes`, read off the UI thread; this
window only lays them out. It is not modal, so the tensors stay in view while it is open.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush
from PySide6.QtWidgets import (
    QDialog,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from sessions.capture.record_attributes import MAX_SHOWN_BYTES, RecordAttributes
from sessions.compare.verdict import Kind
from viewer.theme import status_colour
from viewer.widgets.plain_text import plain_label, plain_tip
from viewer.widgets.read_only_table import read_only_table

ATTRIBUTE_COLUMNS = ("name", "HDF5 type", "shape", "value")


def _fill(table: QTableWidget, rows: list[tuple[str, ...]], problems: list[bool]) -> None:
    table.setRowCount(len(rows))
    for row, (cells, problem) in enumerate(zip(rows, problems)):
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(plain_tip(text))
            if problem:
                item.setForeground(QBrush(status_colour(Kind.SIGNED_ZERO_ONLY)))
            table.setItem(row, col, item)
    header = table.horizontalHeader()
    for col in range(table.columnCount() - 1):
        header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(table.columnCount() - 1, QHeaderView.ResizeMode.Stretch)


class SideAttributes(QWidget):
    """One side: where the record is, its index row, and its dataset's attributes."""

    def __init__(self, shown: RecordAttributes, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.shown = shown
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.heading = QLabel(f"<b>{shown.side}</b>: {escape(shown.file)}<br>dataset <code>{escape(shown.path)}</code>, stored as {escape(shown.stored)}")
        self.heading.setTextFormat(Qt.TextFormat.RichText)
        self.heading.setWordWrap(True)
        self.heading.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.heading)
        layout.addWidget(plain_label("Attributes"))
        self.attributes = read_only_table(ATTRIBUTE_COLUMNS)
        _fill(self.attributes, [(a.name, a.hdf5_type, a.shape, a.value) for a in shown.attributes], [a.problem for a in shown.attributes])
        layout.addWidget(self.attributes, 2)
        layout.addWidget(plain_label("Index row"))
        self.index_row = read_only_table(("field", "value"))
        _fill(self.index_row, list(shown.index_row), [False] * len(shown.index_row))
        layout.addWidget(self.index_row, 3)

    def value_of(self, name: str) -> str | None:
        """The value shown for the attribute called `name` (tests, keyboard checks)."""
        return _cell(self.attributes, name, ATTRIBUTE_COLUMNS.index("value"))

    def index_value(self, field: str) -> str | None:
        """The index row's value of `field` (tests, keyboard checks)."""
        return _cell(self.index_row, field, 1)


def _cell(table: QTableWidget, key: str, col: int) -> str | None:
    """The text in column `col` of the first row whose first cell is `key`."""
    for row in range(table.rowCount()):
        if table.item(row, 0).text() == key:
            return table.item(row, col).text()
    return None


class AttributesDialog(QDialog):
    def __init__(self, title: str, sides: list[RecordAttributes], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"HDF5 attributes — {title}")
        self.resize(1100, 560)
        layout = QVBoxLayout(self)
        note = plain_label(f"As stored in each file. Values over {MAX_SHOWN_BYTES // 1024} KiB, and types the capture format refuses, are listed but not read.")
        note.setWordWrap(True)
        layout.addWidget(note)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        self.sides = {shown.side: SideAttributes(shown) for shown in sides}
        for side in self.sides.values():
            splitter.addWidget(side)
        layout.addWidget(splitter, 1)
