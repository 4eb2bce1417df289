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
    QPersistentModelIndex,
    QPoint,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QAction,
    QBrush,
    QIcon,
    QKeyEvent,
    QShowEvent,
    QStandardItem,
    QStandardItemModel,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLineEdit,
    QMenu,
    QPushButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from sessions.compare.comparison import unaligned_key
from sessions.compare.unaligned import MANUAL_BREAK, UnalignedRecord
from sessions.compare.verdict import Kind
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.theme import icon, locality_colour, status_colour, status_icon
from viewer.widgets.plain_text import plain_label, plain_tip

PAIR_ROLE = Qt.ItemDataRole.UserRole + 1
UNALIGNED_ROLE = Qt.ItemDataRole.UserRole + 3
GROUP_ROLE = Qt.ItemDataRole.UserRole + 4
PLACEHOLDER_ROLE = Qt.ItemDataRole.UserRole + 5
LAZY_FROM_ROWS = 20_000
"""A comparison with more op rows than this (a real model: 240,000) makes a group's rows when it
is opened: making every row takes about 0.3 ms each, over a minute for a real model."""
FILTER_MADE_MAX = 15
"""In a lazy tree, the filter makes the rows of this many matching ops (and their groups' rows):
a screenful, as each match comes with its layer's row (the tree shows about 25 rows at 1440x900).
Each costs about 1.5 ms of the keystroke: a real model's first filter took 67-84 ms at 30 and
51-55 ms at 15, and its next paint 26-30 against 11 ms."""
ReasonQuestion = Callable[[str], "str | None"]
"""Given what is about to be done, the user's reason, or None (cancelled)."""
PartnerChoice = Callable[[UnalignedRecord, list[UnalignedRecord]], "UnalignedRecord | None"]
"""Given an unaligned record and the other side's unaligned records, the chosen one or None."""
COLUMNS = ("op", "status", "ULP p99", "differing", "cause", "key")
"""The status column is hidden (icon and colour show it) but the filter box matches its text.
"cause" is local / inherited / undetermined once a diagnosis has classified the op. "key" is
hidden too: the row's key as `report` prints it (0:visual:3:sdpa), so a key copied from a
terminal finds its op, or its record without a partner, in Qt's own filter. Matched by a Python
override of the filter instead, every keystroke cost 1-2.8 s over a real model's 260,000 rows."""
CAUSE_COLUMN = 4
KEY_COLUMN = 5
COLUMN_SAMPLES = {2: "30,000", 3: "27,961 (51%)", CAUSE_COLUMN: "inherited"}
"""Each figure column is as wide as its header or this typical cell, whichever is wider, measured
once in the view's font: the op column stretches over the rest, so op names stay whole beside
the cause column at 1280x720. Sizing to contents would read every row of a 240,000-row model."""
CELL_PADDING = 16
"""A cell's margins and a little air, in pixels, beyond its text."""


def ask_reason(parent: QWidget, what: str) -> str | None:
    text, ok = QInputDialog.getText(parent, "Reason", f"{what}\nWhy? (saved with the session)")
    return text if ok else None


def choose_partner(parent: QWidget, record: UnalignedRecord, candidates: list[UnalignedRecord]) -> UnalignedRecord | None:
    labels = [cv.unaligned_label(c) for c in candidates]
    choice, ok = QInputDialog.getItem(parent, "Pair with…", f"Pair {cv.unaligned_label(record)} with:", labels, 0, False)
    return candidates[labels.index(choice)] if ok and choice in labels else None


class TreeFilter(QSortFilterProxyModel):
    """The rows that match, the groups above them, and every row under a group whose name
    matches: "layer 1" or "step 3" showed nine empty groups, whose ops named no layer. Only a
    group's name counts, not its kind: "diverged" keeps only the diverged ops of a diverged layer."""

    def filterAcceptsRow(self, source_row: int, source_parent: QModelIndex | QPersistentModelIndex) -> bool:
        if super().filterAcceptsRow(source_row, source_parent):
            return True
        pattern = self.filterRegularExpression()
        group = QModelIndex(source_parent)
        while group.isValid():
            if group.data(GROUP_ROLE) is not None and pattern.match(str(group.siblingAtColumn(0).data())).hasMatch():
                return True
            group = group.parent()
        return False


class AlignmentTree(QWidget):
    jump_requested = Signal()
    break_requested = Signal(object, str)
    """(PairResult, reason): the user broke this pairing."""
    pair_requested = Signal(object, object, str)
    """(native UnalignedRecord, oracle UnalignedRecord, reason): the user paired them by hand."""
    attributes_requested = Signal(object)
    unaligned_chosen = Signal(object)
    """A record without a partner became the current row (Tensor diff says why it shows nothing)."""
    """(PairResult or UnalignedRecord): the user asked for the row's records' HDF5 attributes."""
    undo_requested = Signal(str, int)
    """(side, seq): the user took back their manual pairing or break of this record."""

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self._items: dict[int, QStandardItem] = {}
        """Rows made so far, by id of their pair (all of them unless the comparison is lazy)."""
        self._unaligned_items: dict[int, QStandardItem] = {}
        self._paths: dict[int, tuple[Any, ...]] = {}
        """Each pair's group path (step, segment, layer place), by id of the pair."""
        self._looks: dict[str, tuple[QIcon, QBrush]] = {}
        self._root = cv.TreeGroup("")
        self._rows: dict[tuple[Any, ...], QPersistentModelIndex] = {}
        """Each group's row once made, by its path (the root's is invalid): an index, not the
        item, which the model deletes with its rows while a Python handle on it would stay."""
        self._built: set[tuple[Any, ...]] = set()
        """Paths of the groups whose rows are made."""
        self._lazy = False
        self._filtering = False
        """While the filter changes, the rows it hides move the view's current row: that is no choice of the user's."""
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
        self.summary = plain_label("No comparison yet")
        self.summary.setObjectName("sectionTitle")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.items = QStandardItemModel(0, len(COLUMNS), self)
        self.items.setHorizontalHeaderLabels(list(COLUMNS))
        self.proxy = TreeFilter(self)
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
        for col in COLUMN_SAMPLES:
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
        self._columns_fitted = False
        self.view.selectionModel().currentChanged.connect(self._current_changed)
        self.view.setColumnHidden(1, True)
        self.view.setColumnHidden(CAUSE_COLUMN, True)
        self.view.setColumnHidden(KEY_COLUMN, True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._show_menu)
        self.view.viewport().installEventFilter(self)
        self.filter.installEventFilter(self)
        self.view.expanded.connect(self._expanded)
        layout.addWidget(self.view, 1)
        model.comparison_changed.connect(self.rebuild)
        model.selection_changed.connect(self.reveal)
        model.diagnosis_changed.connect(self._show_causes)

    def showEvent(self, event: QShowEvent) -> None:
        """Fit the figure columns once, when the style sheet (a bold header) has been applied: measured any earlier, "ULP p99" was cut."""
        super().showEvent(event)
        if self._columns_fitted:
            return
        self._columns_fitted = True
        header = self.view.header()
        for col, sample in COLUMN_SAMPLES.items():
            header.resizeSection(col, max(header.sectionSizeFromContents(col).width(), self.view.fontMetrics().horizontalAdvance(sample) + CELL_PADDING))

    def _filter_changed(self, text: str) -> None:
        """Filter the rows, keeping the selected op: typing "f" over a selected sdpa selected
        ffn_norm (the row the view fell back on) and loaded its tensors."""
        made, more = self._materialize_matches(text) if text and self._lazy else ([], "")
        self._filtering = True
        try:
            self.proxy.setFilterFixedString(text)
            if text and self._lazy:
                self._expand_to(made)
            elif text:
                self.view.expandAll()
            self._show_selected()
        finally:
            self._filtering = False
        comparison = self._model.comparison
        if comparison is None:
            return
        if text and not self.proxy.rowCount():
            self.summary.setText(f"No row matches “{text}”: the filter reads op names, layers, keys (0:visual:3:sdpa) and kinds (diverged, bit-exact, …)")
        else:
            self.summary.setText(comparison.summary + more if text else self._counts_line())

    def _show_selected(self) -> None:
        """The selected op's row current and in view when the filter lets it through; else no row current."""
        pair = self._model.selected
        item = self._item_for(pair) if pair is not None else None
        index = self.proxy.mapFromSource(item.index()) if item is not None else QModelIndex()
        if not index.isValid():
            self.view.selectionModel().clear()
            return
        self._select_row(index)

    # -- building ----------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Show the comparison's groups (found on the worker thread: step, segment, layer, worst
        kind below each); rows are made when a group is expanded, or all at once for a
        comparison small enough to show whole."""
        # Python's handles on the old rows go first, while the rows still exist.
        self._items = {}
        self._unaligned_items = {}
        self._paths = {}
        self._root = cv.TreeGroup("")
        self._rows = {}
        self._built = set()
        self.items.removeRows(0, self.items.rowCount())
        comparison = self._model.comparison
        if comparison is None:
            self.summary.setText(self._model.waiting() if self._model.has_pair else self._model.missing_side_text() or "Open a native and an oracle capture")
            return
        self._paths = comparison.tree.path_of
        self._root = comparison.tree.root
        self._lazy = len(cv.pairs(comparison)) + len(cv.unaligned(comparison)) > LAZY_FROM_ROWS
        self.summary.setText(self._counts_line())
        self._rows[()] = QPersistentModelIndex()
        # Made with the filter model detached, which then maps the rows once: told of each row
        # as it came, it made a real model's rebuild 72 instead of 48 ms (under the profiler).
        # Detached, the view has no columns for a moment: its header's hidden columns and widths
        # are put back.
        header = self.view.header().saveState()
        self.proxy.setSourceModel(None)
        try:
            self._populate(self._root)
            if not self._lazy:
                self._populate_all(self._root)
        finally:
            self.proxy.setSourceModel(self.items)
            self.view.header().restoreState(header)
        post_eos = self._rows.get((cv.POST_EOS_BRANCH,))
        for r in range(1 if self._lazy else self.proxy.rowCount()):
            index = self.proxy.index(r, 0)
            # Closed: its records are invalid, never failures, and open they filled the tree with cut names.
            if post_eos is None or self.proxy.mapToSource(index) != QModelIndex(post_eos):
                self.view.expand(index)

    def _populate(self, group: cv.TreeGroup) -> None:
        """Make a group's rows (once): its sub-groups (each made when it is opened), then its ops."""
        row_index = self._rows.get(group.path)
        if group.path in self._built or row_index is None:
            return
        self._built.add(group.path)
        parent = self.items.itemFromIndex(row_index) if group.path else self.items.invisibleRootItem()
        if parent is None:
            return
        comparison = self._model.comparison
        if parent.rowCount() and parent.child(0).data(PLACEHOLDER_ROLE):
            parent.removeRow(0)
        for child in group.children.values():
            row = self._row(child.label, child.status)
            row[0].setData(child.path, GROUP_ROLE)
            if self._lazy:
                row[0].appendRow(_placeholder())
            parent.appendRow(row)
            self._rows[child.path] = QPersistentModelIndex(row[0].index())
        for pair in group.pairs:
            manual = pair.manual_reason is not None
            label = cv.pair_op_label(pair) + (cv.MANUAL_MARKER if manual else "")
            row = self._row(label, pair.verdict, cv.pair_ulp_error_text(pair), cv.pair_differing_text(pair), pair.key.text())
            row[0].setData(pair, PAIR_ROLE)
            tooltip = cv.pair_tooltip(pair, comparison) if comparison is not None else ""
            row[0].setToolTip(plain_tip(f"{tooltip}\npaired by hand: {pair.manual_reason}" if manual else tooltip))
            cause = self._model.locality.get(pair.key, "")
            if cause:
                row[CAUSE_COLUMN].setText(cause)
                row[CAUSE_COLUMN].setForeground(QBrush(locality_colour(cause)))
            parent.appendRow(row)
            self._items[id(pair)] = row[0]
        for record in group.records:
            row = self._row(cv.unaligned_label(record), group.record_status(record), "", record.why(), unaligned_key(record).text())
            row[0].setData(record, UNALIGNED_ROLE)
            row[0].setToolTip(plain_tip(record.why()))
            self._unaligned_items[id(record)] = row[0]
            parent.appendRow(row)

    def _row(self, label: str, status: str | None = None, ulp: str = "", differing: str = "", key: str = "") -> list[QStandardItem]:
        # Not editable through the view (NoEditTriggers): a flag per cell cost a fifth of a row.
        cells = [QStandardItem(label), QStandardItem(status or ""), QStandardItem(ulp), QStandardItem(differing), QStandardItem(""), QStandardItem(key)]
        if status is not None:
            self._paint(cells, status)
        return cells

    def _paint(self, cells: list[QStandardItem], status: str) -> None:
        if status not in self._looks:
            # One icon and brush per verdict kind for the tree's life: loading the SVG took most of a row's cost.
            self._looks[status] = status_icon(status), QBrush(status_colour(status))
        look, brush = self._looks[status]
        cells[0].setIcon(look)
        cells[0].setData(status, Qt.ItemDataRole.UserRole + 2)
        cells[1].setText(status)
        for cell in cells[1:]:
            cell.setForeground(brush)
        if status != Kind.BIT_EXACT:
            cells[0].setForeground(brush)

    def _populate_all(self, group: cv.TreeGroup) -> None:
        self._populate(group)
        for child in group.children.values():
            self._populate_all(child)

    def _expanded(self, index: QModelIndex) -> None:
        """A group opened: make its rows in place of its placeholder. A group row made before its
        rows holds one empty row, so the view draws it as openable without asking Python (a
        `hasChildren` override is called hundreds of times per layout, each call waiting for the
        interpreter lock while a worker thread runs). Not while the filter opens the groups it
        lets through: their rows made, the new groups that match opened too, and one keystroke
        ("l") made all of a real model's 260,000 rows (47 s)."""
        if self._filtering:
            return
        path = self.proxy.mapToSource(index.siblingAtColumn(0)).data(GROUP_ROLE)
        group = self._root.find(path) if isinstance(path, tuple) else None
        if group is not None:
            self._populate(group)

    def _item_for(self, pair: Any) -> QStandardItem | None:
        """A pair's row, making the rows of the groups on its path first."""
        path = self._paths.get(id(pair))
        if path is None:
            return None
        self._make_path(path)
        return self._items.get(id(pair))

    def _unaligned_item_for(self, record: UnalignedRecord) -> QStandardItem | None:
        """A record's row, making the rows of the groups on its path first."""
        comparison = self._model.comparison
        path = comparison.tree.record_path_of.get(id(record)) if comparison is not None else None
        if path is None:
            return None
        self._make_path(path)
        return self._unaligned_items.get(id(record))

    def _make_path(self, path: tuple[Any, ...]) -> None:
        """Make the rows of every group from the root down to the one at `path`."""
        group = self._root
        self._populate(group)
        for part in path:
            group = group.children[part]
            self._populate(group)

    def _counts_line(self) -> str:
        """The line above the unfiltered tree: the comparison's counts."""
        comparison = self._model.comparison
        assert comparison is not None
        return comparison.summary + (" (a group's rows are made when it is opened)" if self._lazy else "")

    def _materialize_matches(self, text: str) -> tuple[list[QStandardItem], str]:
        """Make the rows of the first pairs, and of the first records without a partner, the
        filter text finds, so the filter can show them: those rows, and what the summary adds
        when there are more than are shown."""
        comparison = self._model.comparison
        if comparison is None:
            return [], ""
        shown, found = comparison.tree.matches(text.lower(), FILTER_MADE_MAX)
        pairs = cv.pairs(comparison)
        made = [self._item_for(pairs[position]) for position in shown]
        shown_records, found_records = comparison.tree.record_matches(text.lower(), FILTER_MADE_MAX)
        made += [self._unaligned_item_for(comparison.tree.records[position]) for position in shown_records]
        more = [f"{FILTER_MADE_MAX:,} of {count:,} matching {what}" for count, what in ((found, "ops"), (found_records, "records without a partner")) if count > FILTER_MADE_MAX]
        return [item for item in made if item is not None], f"; the first {' and '.join(more)} are shown, narrow the filter for the rest" if more else ""

    def _expand_to(self, items: list[QStandardItem]) -> None:
        """Open the groups above these rows, and no others: opening every group the filter let
        through (all a real run's steps match "l", by their status "unaligned") took half a second."""
        for item in items:
            parent = self.proxy.mapFromSource(item.index()).parent()
            while parent.isValid():
                self.view.expand(parent)
                parent = parent.parent()

    def _show_causes(self) -> None:
        """Each diagnosed op's cause in its row: local ops are where a person looks first."""
        comparison = self._model.comparison
        self.view.setColumnHidden(CAUSE_COLUMN, not self._model.locality)
        if comparison is None:
            return
        for key in self._model.locality:
            pair = cv.find_pair(comparison, key)
            item = self._item_for(pair) if pair is not None else None
            if item is None:
                continue
            parent = item.parent() or self.items.invisibleRootItem()
            cell = parent.child(item.row(), CAUSE_COLUMN)
            cause = self._model.locality.get(pair.key, "")
            cell.setText(cause)
            cell.setForeground(QBrush(locality_colour(cause)))

    def shows(self, pair: Any) -> bool:
        """Whether the filter lets the pair's row through (its row made if need be)."""
        item = self._item_for(pair)
        return item is not None and self.proxy.mapFromSource(item.index()).isValid()

    def cause_of(self, pair: Any) -> str:
        """The cause column's text on a pair's row (tests, keyboard checks)."""
        item = self._item_for(pair)
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
        record, or undo either where the user made it; and for any row naming records, their HDF5 attributes."""
        source = self.proxy.mapToSource(index.siblingAtColumn(0))
        pair, record = source.data(PAIR_ROLE), source.data(UNALIGNED_ROLE)
        actions: list[QAction] = []
        if pair is not None and pair.manual_reason is not None:
            actions.append(self._menu_action("Undo this manual pairing", lambda: self.undo_requested.emit("native", pair.native_seq)))
        elif pair is not None:
            actions.append(self._menu_action("Break this pairing…", lambda: self.break_pairing(pair)))
        if record is not None and record.reason == MANUAL_BREAK and record.seq >= 0:
            actions.append(self._menu_action("Undo this break", lambda: self.undo_requested.emit(record.side, record.seq)))
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
        comparison = self._model.comparison
        shared = sum(p.native_seq == pair.native_seq for p in comparison.comparison.pairs) if comparison is not None else 1
        whole = f" A break names the whole native record: it unpairs all {shared} position pairs it is part of." if shared > 1 else ""
        reason = self.ask_reason(f"Break the pairing {pair.label}: native {pair.native_name!r}, oracle {pair.oracle_name!r}.{whole}")
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
        if self._filtering:
            return
        source = self.proxy.mapToSource(current.siblingAtColumn(0))
        pair = source.data(PAIR_ROLE)
        if pair is not None:
            self._model.select(pair)
        elif source.data(UNALIGNED_ROLE) is not None:
            self._model.select(None)  # a record without a partner: no pair's tensors stay on show beside its row
            self.unaligned_chosen.emit(source.data(UNALIGNED_ROLE))

    def reveal(self, pair: Any) -> None:
        """Make a pair's row current and visible, clearing a filter that hides it (Ctrl+J on the pair already selected)."""
        item = self._item_for(pair) if pair is not None else None
        if item is None:
            return
        self._make_current(item)

    def reveal_unaligned(self, record: UnalignedRecord, *, past_filter: bool = True) -> None:
        """Select an unaligned record's row (Ctrl+J when the first finding is a record without a
        partner). Without `past_filter`, a row the filter hides stays hidden: the window arriving
        on a new comparison by itself must not undo the filter the user typed."""
        item = self._unaligned_item_for(record)
        if item is not None:
            self._make_current(item, past_filter)

    def _make_current(self, item: QStandardItem, past_filter: bool = True) -> None:
        index = self.proxy.mapFromSource(item.index())
        if not index.isValid():
            if not past_filter:
                return
            self.filter.clear()
            index = self.proxy.mapFromSource(item.index())
        if self.view.currentIndex() == index:
            return  # picked in the tree itself: scrolling now would move another row under the pointer
        self._select_row(index)

    def _select_row(self, index: QModelIndex) -> None:
        """Make a visible row (a filter index) the current, selected one, scrolled into view."""
        self.view.scrollTo(index, QAbstractItemView.ScrollHint.EnsureVisible)
        self.view.selectionModel().setCurrentIndex(index, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize and watched is self.view.viewport():
            QTimer.singleShot(0, self, self._keep_current_whole)
        if watched is self.filter and self.filter.text() and event.type() in (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress):
            if isinstance(event, QKeyEvent) and event.key() == Qt.Key.Key_Escape:
                # Esc in a filter with text clears it, as in every search box; an empty one leaves
                # Esc to the window (it cancels the running read).
                event.accept()
                if event.type() == QEvent.Type.KeyPress:
                    self.filter.clear()
                return True
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
                if self.proxy.rowCount(index) == 0 and not index.data(PLACEHOLDER_ROLE):
                    out.append(str(index.data()))
                walk(index)

        walk(QModelIndex())
        return out


def _placeholder() -> QStandardItem:
    """The one empty cell of a group whose rows are not made yet (the filter never matches it)."""
    cell = QStandardItem()
    cell.setData(True, PLACEHOLDER_ROLE)
    return cell

