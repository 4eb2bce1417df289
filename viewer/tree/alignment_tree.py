"""The alignment tree: step → segment → layer → op/occurrence, each row with its verdict.

Statuses, first divergence and unaligned reasons all come from the comparison
(viewer.comparison_view reads them); this view arranges them and keeps its selection in
step with the model's. Its context menu lets the user break a pairing or pair two unaligned
records by hand; it only asks (through replaceable callables, so tests answer without a
modal dialog) and emits the request -- the window's session part records the override and
compares again. It also offers a row's raw HDF5 attributes, which the window reads and shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import (
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QObject,
    QPoint,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QBrush, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from sessions.compare.align import UnalignedRecord
from sessions.compare.verdict import SEVERITY, Kind
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.theme import icon, locality_colour, status_colour, status_icon

PAIR_ROLE = Qt.ItemDataRole.UserRole + 1
UNALIGNED_ROLE = Qt.ItemDataRole.UserRole + 3
MANUAL_MARKER = " [manual]"
"""Appended to a hand-made pair's label: visible, and the filter box finds every manual pair."""
ReasonQuestion = Callable[[str], "str | None"]
"""Given what is about to be done, the user's reason, or None (cancelled)."""
PartnerChoice = Callable[[UnalignedRecord, list[UnalignedRecord]], "UnalignedRecord | None"]
"""Given an unaligned record and the other side's unaligned records, the chosen one or None."""
COLUMNS = ("op", "status", "ULP p99", "differing", "cause")
"""The status column is hidden (icon and colour show it) but the filter box matches its text.
"cause" is local / inherited / undetermined once a diagnosis has classified the op."""
CAUSE_COLUMN = 4


def ask_reason(parent: QWidget, what: str) -> str | None:
    text, ok = QInputDialog.getText(parent, "Reason", f"{what}\nWhy? (saved with the session)")
    return text if ok else None


def choose_partner(parent: QWidget, record: UnalignedRecord, candidates: list[UnalignedRecord]) -> UnalignedRecord | None:
    labels = [cv.unaligned_label(c) for c in candidates]
    choice, ok = QInputDialog.getItem(parent, "Pair with…", f"Pair {cv.unaligned_label(record)} with:", labels, 0, False)
    return candidates[labels.index(choice)] if ok and choice in labels else None


class AlignmentTree(QWidget):
    jump_requested = Signal()
    break_requested = Signal(object, str)
    """(PairResult, reason): the user broke this pairing."""
    pair_requested = Signal(object, object, str)
    """(native UnalignedRecord, oracle UnalignedRecord, reason): the user paired them by hand."""
    attributes_requested = Signal(object)
    """(PairResult or UnalignedRecord): the user asked for the row's records' HDF5 attributes."""

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self._items: dict[int, QStandardItem] = {}
        self._unaligned_items: dict[int, QStandardItem] = {}
        self.ask_reason: ReasonQuestion = lambda what: ask_reason(self, what)
        self.choose_partner: PartnerChoice = lambda record, candidates: choose_partner(self, record, candidates)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter ops (name, layer, status)…")
        self.filter.setClearButtonEnabled(True)
        top.addWidget(self.filter, 1)
        self.jump_button = QPushButton(icon("jump-divergence.svg"), "First finding")
        self.jump_button.setToolTip("Jump to the first finding (Ctrl+J); next/previous op that is not bit-exact: F8 / Shift+F8")
        self.jump_button.clicked.connect(self.jump_requested)
        top.addWidget(self.jump_button)
        layout.addLayout(top)
        self.summary = QLabel("No comparison yet")
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.items = QStandardItemModel(0, len(COLUMNS), self)
        self.items.setHorizontalHeaderLabels(list(COLUMNS))
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.items)
        self.proxy.setRecursiveFilteringEnabled(True)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(-1)
        self.filter.textChanged.connect(self._filter_changed)
        self.view = QTreeView()
        self.view.setModel(self.proxy)
        self.view.setUniformRowHeights(True)
        self.view.setIndentation(14)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col, width in ((2, 84), (3, 100), (CAUSE_COLUMN, 64)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            header.resizeSection(col, width)
        self.view.selectionModel().currentChanged.connect(self._current_changed)
        self.view.setColumnHidden(1, True)
        self.view.setColumnHidden(CAUSE_COLUMN, True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._show_menu)
        self.view.viewport().installEventFilter(self)
        layout.addWidget(self.view, 1)
        model.comparison_changed.connect(self.rebuild)
        model.selection_changed.connect(self._show_selection)
        model.diagnosis_changed.connect(self._show_causes)

    def _filter_changed(self, text: str) -> None:
        self.proxy.setFilterFixedString(text)
        if text:
            self.view.expandAll()

    # -- building ----------------------------------------------------------------------------

    def rebuild(self) -> None:
        self.items.removeRows(0, self.items.rowCount())
        self._items = {}
        self._unaligned_items = {}
        comparison = self._model.comparison
        if comparison is None:
            self.summary.setText("Comparing…" if self._model.has_pair else "Open a native and an oracle capture")
            return
        self.summary.setText(cv.summary_line(comparison))
        groups: dict[tuple[Any, ...], QStandardItem] = {}
        layered: set[tuple[int, str]] = set()
        root = self.items.invisibleRootItem()
        for pair in cv.pairs(comparison):
            step, segment, layer = pair.key.step, pair.key.segment, pair.key.layer
            parent = root
            path: tuple[Any, ...] = ()
            if layer >= 0:
                layered.add((step, segment))
                place: tuple[str, Any] = (f"layer {layer}", layer)
            else:
                # Model-level ops sit where they ran, before or after the layers, so the tree
                # reads top to bottom in execution order, like every other surface.
                place = ("after layers", "after") if (step, segment) in layered else ("before layers", "before")
            for label, part in ((f"step {step}", step), (segment, segment), place):
                path = (*path, part)
                if path not in groups:
                    row = _row(label)
                    parent.appendRow(row)
                    groups[path] = row[0]
                parent = groups[path]
            status = pair.verdict
            manual = pair.manual_reason is not None
            label = cv.pair_op_label(pair) + (MANUAL_MARKER if manual else "")
            row = _row(label, status, cv.pair_ulp_error_text(pair), cv.pair_differing_text(pair))
            row[0].setData(pair, PAIR_ROLE)
            tooltip = cv.pair_tooltip(pair, comparison)
            row[0].setToolTip(f"{tooltip}\npaired by hand: {pair.manual_reason}" if manual else tooltip)
            parent.appendRow(row)
            self._items[id(pair)] = row[0]
            _worsen(groups, path, status)
        unaligned = cv.unaligned(comparison)
        if unaligned:
            branch = _row(f"Unaligned records ({len(unaligned)})", Kind.UNALIGNED)
            root.appendRow(branch)
            for record in unaligned:
                row = _row(cv.unaligned_label(record), Kind.UNALIGNED, "", cv.unaligned_reason(record))
                row[0].setData(record, UNALIGNED_ROLE)
                self._unaligned_items[id(record)] = row[0]
                row[0].setToolTip(cv.unaligned_reason(record))
                branch[0].appendRow(row)
        self.view.collapseAll()
        for r in range(self.proxy.rowCount()):
            self.view.expand(self.proxy.index(r, 0))

    def _show_causes(self) -> None:
        """Each diagnosed op's cause in its row: local ops are where a person looks first."""
        comparison = self._model.comparison
        self.view.setColumnHidden(CAUSE_COLUMN, not self._model.locality)
        if comparison is None:
            return
        for pair in cv.pairs(comparison):
            item = self._items.get(id(pair))
            if item is None:
                continue
            parent = item.parent() or self.items.invisibleRootItem()
            cell = parent.child(item.row(), CAUSE_COLUMN)
            cause = self._model.locality.get(pair.key, "")
            cell.setText(cause)
            cell.setForeground(QBrush(locality_colour(cause)))

    def cause_of(self, pair: Any) -> str:
        """The cause column's text on a pair's row (tests, keyboard checks)."""
        item = self._items.get(id(pair))
        if item is None:
            return ""
        return str(self.items.index(item.row(), CAUSE_COLUMN, item.parent().index() if item.parent() else self.items.invisibleRootItem().index()).data() or "")

    # -- manual alignment --------------------------------------------------------------------

    def _show_menu(self, position: QPoint) -> None:
        actions = self.actions_at(self.view.indexAt(position))
        if actions:
            menu = QMenu(self)
            menu.addActions(actions)
            menu.exec(self.view.viewport().mapToGlobal(position))

    def actions_at(self, index: QModelIndex) -> list[QAction]:
        """The context menu's actions for a row (a proxy index): break a pair, or pair an unaligned
        record; and for any row naming records, their HDF5 attributes."""
        source = self.proxy.mapToSource(index.siblingAtColumn(0))
        pair, record = source.data(PAIR_ROLE), source.data(UNALIGNED_ROLE)
        actions: list[QAction] = []
        if pair is not None:
            actions.append(self._menu_action("Break this pairing…", lambda: self.break_pairing(pair)))
        if record is not None and record.seq >= 0 and self._partners(record):
            actions.append(self._menu_action("Pair with…", lambda: self.pair_unaligned(record)))
        row = pair if pair is not None else record if record is not None and record.seq >= 0 else None
        if row is not None:
            actions.append(self._menu_action("HDF5 attributes…", lambda: self.attributes_requested.emit(row)))
        return actions

    def _menu_action(self, text: str, slot: Callable[[], None]) -> QAction:
        action = QAction(text, self)
        action.triggered.connect(slot)
        return action

    def _partners(self, record: UnalignedRecord) -> list[UnalignedRecord]:
        """Real records of the other side in the unaligned branch (rows for stale overrides have seq -1)."""
        comparison = self._model.comparison
        if comparison is None:
            return []
        return [u for u in cv.unaligned(comparison) if u.side != record.side and u.seq >= 0]

    def break_pairing(self, pair: Any) -> None:
        reason = self.ask_reason(f"Break the pairing {pair.label}: native {pair.native_name!r}, oracle {pair.oracle_name!r}.")
        if reason and reason.strip():
            self.break_requested.emit(pair, reason.strip())

    def pair_unaligned(self, record: UnalignedRecord) -> None:
        partner = self.choose_partner(record, self._partners(record))
        if partner is None:
            return
        native, oracle = (record, partner) if record.side == "native" else (partner, record)
        reason = self.ask_reason(f"Pair native {native.name!r} (seq {native.seq}) with oracle {oracle.name!r} (seq {oracle.seq}).")
        if reason and reason.strip():
            self.pair_requested.emit(native, oracle, reason.strip())

    def row_index(self, label: str) -> QModelIndex:
        """The proxy index of the first row whose label is `label` (tests, keyboard checks)."""
        matches = self.proxy.match(self.proxy.index(0, 0), Qt.ItemDataRole.DisplayRole, label, 1, Qt.MatchFlag.MatchExactly | Qt.MatchFlag.MatchRecursive)
        return matches[0] if matches else QModelIndex()

    # -- selection ---------------------------------------------------------------------------

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        pair = self.proxy.mapToSource(current.siblingAtColumn(0)).data(PAIR_ROLE)
        if pair is not None:
            self._model.select(pair)

    def _show_selection(self, pair: Any) -> None:
        item = self._items.get(id(pair)) if pair is not None else None
        if item is None:
            return
        self._make_current(item)

    def reveal_unaligned(self, record: UnalignedRecord) -> None:
        """Select an unaligned record's row (Ctrl+J when the first finding is a record without a partner)."""
        item = self._unaligned_items.get(id(record))
        if item is not None:
            self._make_current(item)

    def _make_current(self, item: QStandardItem) -> None:
        index = self.proxy.mapFromSource(item.index())
        if not index.isValid():
            self.filter.clear()
            index = self.proxy.mapFromSource(item.index())
        if self.view.currentIndex() == index:
            return  # picked in the tree itself: scrolling now would move another row under the pointer
        self.view.scrollTo(index, QAbstractItemView.ScrollHint.EnsureVisible)
        self.view.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
        )

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize and watched is self.view.viewport():
            QTimer.singleShot(0, self, self._keep_current_whole)
        return super().eventFilter(watched, event)

    def _keep_current_whole(self) -> None:
        """The view shrank after the highlighted row was scrolled into it (the summary wrapped, a
        scroll bar appeared): bring the row back whole. A row the user scrolled away from stays away."""
        current = self.view.currentIndex()
        row, area = self.view.visualRect(current), self.view.viewport().rect()
        cut = row.top() < area.top() or row.bottom() > area.bottom()
        if current.isValid() and cut and row.bottom() >= area.top() and row.top() <= area.bottom():
            self.view.scrollTo(current, QAbstractItemView.ScrollHint.EnsureVisible)

    def visible_leaf_labels(self) -> list[str]:
        """Op rows the filter lets through, in tree order (for tests and keyboard checks)."""
        out: list[str] = []

        def walk(parent: QModelIndex) -> None:
            for r in range(self.proxy.rowCount(parent)):
                index = self.proxy.index(r, 0, parent)
                if self.proxy.rowCount(index) == 0:
                    out.append(str(index.data()))
                walk(index)

        walk(QModelIndex())
        return out


def _row(label: str, status: str | None = None, ulp: str = "", differing: str = "") -> list[QStandardItem]:
    cells = [QStandardItem(label), QStandardItem(status or ""), QStandardItem(ulp), QStandardItem(differing), QStandardItem("")]
    for cell in cells:
        cell.setEditable(False)
    if status is not None:
        _paint(cells, status)
    return cells


def _paint(cells: list[QStandardItem], status: str) -> None:
    cells[0].setIcon(status_icon(status))
    cells[0].setData(status, Qt.ItemDataRole.UserRole + 2)
    cells[1].setText(status)
    brush = QBrush(status_colour(status))
    for cell in cells[1:]:
        cell.setForeground(brush)
    if status != Kind.BIT_EXACT:
        cells[0].setForeground(brush)


def _worsen(groups: dict[tuple[Any, ...], QStandardItem], path: tuple[Any, ...], status: str) -> None:
    """A group shows the worst verdict below it, so a collapsed tree still points at the problem."""
    for depth in range(1, len(path) + 1):
        item = groups[path[:depth]]
        current = item.data(Qt.ItemDataRole.UserRole + 2)
        if current is None or SEVERITY[status] > SEVERITY[current]:
            parent = item.parent() or item.model().invisibleRootItem()
            cells = [parent.child(item.row(), c) for c in range(len(COLUMNS))]
            _paint(cells, status)
