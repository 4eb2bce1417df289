"""The Diagnosis panel: why the runs part -- local vs inherited ops, and the contract each local op ran.

The work is `backends.diagnosis.run.iter_diagnose`, a plain generator; this panel runs it on a
worker (`viewer.workers.TaskSlots`, newest request wins) with progress and Cancel, then shows
what it returned: the verdict sentence first (the same sentence the CLI, JSON and HTML lead
with), the classified ops, the candidates at the chosen op, and with "every diverged op" the
budget of the final logits. Choosing an op here selects it in the window (tree, tensors
follow); each op's cause is handed to the window's model for the tree's column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from backends.diagnosis.candidates import ErrorFigure
from backends.diagnosis.document import candidate_line, figure, share_text
from backends.diagnosis.run import (
    DiagnoseOptions,
    Diagnosis,
    OpDiagnosis,
    iter_diagnose,
)
from sessions.compare.key import OpKey
from sessions.compare.verdict import Kind
from sessions.progress import Progress
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.theme import locality_colour, status_colour
from viewer.widgets.plain_text import code_text, plain_label, rich_label
from viewer.widgets.progress_bar import show_progress
from viewer.widgets.read_only_table import read_only_table
from viewer.workers import TaskSlots

SCOPES = (("first", "First local op"), ("all", "Every differing op + budget"), ("op", "The selected op"))
OP_COLUMNS = ("op", "cause", "native ran", "error")
""""error", not "local error": the column takes what the others leave, and a header is clipped, never elided ("ocal erro")."""
LOCAL_ERROR_TIP = "Local error: the native's output against the oracle's route computed from the native's own inputs"
CANDIDATE_COLUMNS = ("candidate", "vs native", "vs oracle's route", "what it computes")
NO_PAIR = "Open a native and an oracle capture, let the comparison finish, then diagnose."
NOT_COMPARED = "Diagnose needs this pair's comparison: it can run once the comparison has finished."
READY = (
    "Diagnose reruns the ops whose bits differ through MLX from each side's captured inputs: which arithmetic contract "
    "the native ran, and whether an op is wrong by itself (local) or inherited its error."
)
BUDGET_COLUMNS = ("local op", "share of the final logits error", "local error", "injected")
OPS_ROWS_FITTED = 4
"""A new diagnosis sizes the ops table to this many rows at most; the candidates take the rest."""
CANDIDATES_TITLE, BUDGET_TITLE = "Candidates", "Budget"
"""The detail tabs' titles; a diagnosis names its op and final logits in them, a new pair takes them back."""


def _item(text: str, tip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if tip:
        item.setToolTip(code_text(tip))
    return item


def _short(value: ErrorFigure | None) -> str:
    return "—" if value is None else value.short()


def _table(columns: tuple[str, ...]) -> QTableWidget:
    table = read_only_table(columns)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    header.setStretchLastSection(True)
    return table


def _fit_columns(table: QTableWidget) -> None:
    """Each column to its contents, except one that stretches over what is left (and elides)."""
    header = table.horizontalHeader()
    for column in range(table.columnCount()):
        if header.sectionResizeMode(column) != QHeaderView.ResizeMode.Stretch:
            table.resizeColumnToContents(column)


WEIGHTS_NAME_SHOWN = 20
"""Characters of the chosen weights file's name on its button (the tooltip has the whole path)."""
WEIGHTS_TIP = (
    "The safetensors or GGUF weights the reruns read, as `diagnose --weights FILE` does; by default each capture's own "
    "(the file its provenance names, beside it)."
)


class DiagnosisPanel(QWidget):
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.tasks = TaskSlots(self)
        self.diagnosis: Diagnosis | None = None
        self.listed: list[OpDiagnosis] = []
        """The ops the table shows, row by row."""
        self.words: dict[OpKey, str] = {}
        """Each listed op's word (`Diagnosis.locality`): what every surface calls it."""
        self.weights_path: str | None = None
        """The weights file the reruns read (`diagnose --weights`), when the user chose one."""
        self.weights_button = QPushButton("Weights…")
        self.weights_button.setToolTip(WEIGHTS_TIP)
        self.scope = QComboBox()
        for value, label in SCOPES:
            self.scope.addItem(label, value)
        # Its longest scope whole where there is room; as narrow as 12 characters only in a narrow
        # window: the panel's controls set the window's least width.
        self.scope.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.scope.setMinimumContentsLength(12)
        self.scope.setMinimumWidth(self.scope.minimumSizeHint().width())
        self.scope.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.run_button = QPushButton("Diagnose")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.show_inherited = QCheckBox("list inherited ops too")
        self.show_inherited.setToolTip("Inherited ops did what the oracle's route does with their inputs; the local ones are where to look.")
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setMinimumWidth(40)  # it stretches over the row's free width; narrow only in a narrow window
        self.verdict = rich_label()
        self.verdict.setObjectName("diagnosisVerdict")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict.setStyleSheet("font-weight: bold; padding: 6px; border-left: 4px solid #4a90d9;")
        self.summary = rich_label()
        self.summary.setWordWrap(True)
        self.ops = _table(OP_COLUMNS)
        # The local error fills what is left and is elided (its tooltip has it whole): sized to
        # its text it pushed the table into a sideways scroll at 1280x720.
        self.ops.horizontalHeader().setStretchLastSection(False)
        self.ops.horizontalHeader().setSectionResizeMode(len(OP_COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.ops.horizontalHeaderItem(len(OP_COLUMNS) - 1).setToolTip(LOCAL_ERROR_TIP)
        self.why = rich_label()
        self.why.setWordWrap(True)
        self.why.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.candidates = _table(CANDIDATE_COLUMNS)
        # What a candidate computes fills what is left and is elided (its tooltip has it whole).
        self.candidates.horizontalHeader().setStretchLastSection(False)
        self.candidates.horizontalHeader().setSectionResizeMode(len(CANDIDATE_COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.budget = _table(BUDGET_COLUMNS)
        self.details = QTabWidget()
        self.split = QSplitter(Qt.Orientation.Vertical)
        self._layout()
        self.run_button.clicked.connect(self.run)
        self.weights_button.clicked.connect(self._choose_weights)
        self.cancel_button.clicked.connect(lambda: self.tasks.cancel_lane("diagnose"))
        self.ops.currentCellChanged.connect(lambda row, *_: self._op_chosen(row))
        self.show_inherited.toggled.connect(self._refill)
        self.tasks.progressed.connect(lambda p: show_progress(self.progress, p, p.label[:60]))
        self.tasks.busy_changed.connect(self._busy)
        model.captures_changed.connect(lambda: self.use_weights(None))
        model.captures_changed.connect(self._reset)
        model.comparison_changed.connect(self._reset)
        model.selection_changed.connect(self._follow_selection)
        self._show_readiness()

    def _layout(self) -> None:
        controls = QHBoxLayout()
        controls.addWidget(plain_label("Diagnose"))
        for widget in (self.scope, self.run_button, self.cancel_button, self.weights_button, self.show_inherited):
            controls.addWidget(widget)
        controls.addWidget(self.progress, 1)
        candidates_page = QWidget()
        page = QVBoxLayout(candidates_page)
        page.setContentsMargins(0, 4, 0, 0)
        page.addWidget(self.why)
        page.addWidget(self.candidates, 1)
        self.details.addTab(candidates_page, CANDIDATES_TITLE)
        self.details.addTab(self.budget, BUDGET_TITLE)
        # The ops above their candidates, each the panel's whole width: side by side, even at
        # 1440x900 the candidates showed two of their four columns, cut, behind a sideways scroll.
        # The ops listed are few (the local ones) unless the user lists the inherited ones too.
        split = self.split
        split.addWidget(self.ops)
        split.addWidget(self.details)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 3)
        split.setSizes([100, 300])
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(self.verdict)
        layout.addWidget(self.summary)
        layout.addWidget(split, 1)

    # -- running ---------------------------------------------------------------------------

    def options(self) -> DiagnoseOptions:
        scope = self.scope.currentData()
        if scope == "op":
            pair = self.model.selected
            if pair is None:
                raise ValueError("Select an op in the alignment tree first, or choose another scope.")
            return DiagnoseOptions(mode="op", key=pair.key, weights_path=self.weights_path)
        return DiagnoseOptions(mode=scope, weights_path=self.weights_path)

    def use_weights(self, path: str | None) -> None:
        """Rerun with the weights file at `path` (None: the file each capture references), as
        `diagnose --weights` does: a pair moved away from its weights left most ops undetermined,
        and the verdict asked for a file the window had no way to name."""
        self.weights_path = path
        name = "" if path is None else Path(path).name
        shown = name if len(name) <= WEIGHTS_NAME_SHOWN else f"{name[: WEIGHTS_NAME_SHOWN - 1]}…"  # the controls share one row at 1280x720
        self.weights_button.setText("Weights…" if path is None else f"Weights: {shown}")
        self.weights_button.setToolTip(WEIGHTS_TIP if path is None else f"{path}\n\n{WEIGHTS_TIP}")

    def _choose_weights(self) -> None:
        start = self.weights_path or (str(self.model.native.path.parent) if self.model.native is not None else "")
        chosen, _ = QFileDialog.getOpenFileName(self, "Weights for the reruns", start, "Weights (*.safetensors *.gguf);;All files (*)")
        if chosen:
            self.use_weights(chosen)

    def run(self) -> None:
        native, oracle, viewed = self.model.native, self.model.oracle, self.model.comparison
        if native is None or oracle is None or viewed is None:
            self._show_readiness()
            return
        try:
            options = self.options()
        except ValueError as exc:
            self._say(str(exc))
            return
        comparison = viewed.comparison
        self._say("Diagnosing…")
        self.tasks.submit("diagnose", lambda: iter_diagnose(native, oracle, comparison, options), self._succeeded, self._failed, self._cancelled)

    def _succeeded(self, diagnosis: Diagnosis) -> None:
        show_progress(self.progress, Progress(1, 1), "done")
        self.show_diagnosis(diagnosis)
        self.model.set_locality(diagnosis.locality())
        self.finished.emit(diagnosis)

    def _failed(self, message: str) -> None:
        self._say(f"The diagnosis could not run: {message}")
        self.failed.emit(message)

    def _cancelled(self) -> None:
        self._say("Diagnosis cancelled.")
        self.cancelled.emit()

    def _busy(self, busy: bool) -> None:
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)

    def _reset(self) -> None:
        self.tasks.cancel_lane("diagnose")
        self.diagnosis = None
        self.listed = []
        for table in (self.ops, self.candidates, self.budget):
            table.setRowCount(0)
            _fit_columns(table)  # to its headers: a default width cut "vs oracle's route"
        self.summary.setText("")
        self.why.setText("")
        self.progress.reset()
        self.details.setTabText(0, CANDIDATES_TITLE)
        self.details.setTabText(1, BUDGET_TITLE)
        self._show_readiness()

    def _say(self, sentence: str) -> None:
        """The panel's lead sentence: the diagnosis's verdict marks contract ids as code."""
        self.verdict.setText(code_text(sentence))

    def _show_readiness(self) -> None:
        """What Diagnose would do now: an earlier pair's verdict must not stay beside a new comparison."""
        if not self.model.has_pair:
            self._say(NO_PAIR)
        elif self.model.comparison is None:
            self._say(NOT_COMPARED)
        else:
            self._say(READY)

    # -- showing -----------------------------------------------------------------------------

    def show_diagnosis(self, diagnosis: Diagnosis) -> None:
        self.diagnosis = diagnosis
        self._say(diagnosis.verdict)
        contracts = ", ".join(f"{name or 'no exact candidate'} ×{n}" for name, n in diagnosis.contracts().items())
        parts = [diagnosis.counts_text()]
        if contracts:
            parts.append(f"local ops explained by {contracts}")
        parts += diagnosis.notes
        parts.append(f"{diagnosis.seconds:.1f} s on {diagnosis.device} (MLX {diagnosis.mlx_version})")
        self.summary.setText(code_text(" · ".join(parts)))
        self._fill_ops(diagnosis)
        self._fit_ops_height()
        self._show_budget(diagnosis)
        self.layout().activate()
        if not diagnosis.ops:
            lines = [f"{n.key}: reproducing the bits here: {', '.join(n.reproducing) or 'none'}" for n in diagnosis.dispatch]
            lines += [f"{n.key}: {n.declared_text('native')}; {n.declared_text('oracle')}" for n in diagnosis.contract_only]
            self.why.setText(code_text("\n".join(lines)))

    def _fit_ops_height(self) -> None:
        """The ops table as tall as its rows, up to OPS_ROWS_FITTED of them and half the split: a
        fixed share cut the second of two local ops in half at 1280x720."""
        total = sum(self.split.sizes())
        if total <= 0:
            return
        rows = min(max(self.ops.rowCount(), 1), OPS_ROWS_FITTED)
        wanted = self.ops.horizontalHeader().sizeHint().height() + rows * self.ops.verticalHeader().defaultSectionSize() + 2 * self.ops.frameWidth()
        ops_height = min(wanted, total // 2)
        self.split.setSizes([ops_height, total - ops_height])

    def _refill(self) -> None:
        if self.diagnosis is not None:
            self._fill_ops(self.diagnosis)

    def _fill_ops(self, diagnosis: Diagnosis) -> None:
        """The classified ops (local and undetermined ones, or all), the first local one chosen."""
        everything = self.show_inherited.isChecked()
        self.words = diagnosis.locality()
        self.listed = [op for op in diagnosis.ops if everything or str(op.classification.locality) != "inherited"]
        self.ops.setRowCount(len(self.listed))
        for row, op in enumerate(self.listed):
            found = op.classification
            ran = op.native_ran or (f"closest: {op.closest}" if op.closest else "—")
            tip = f"{found.why}\ntotal error: {found.total.text()}\nlocal error: {figure(found.local)}"
            cells = (_item(found.key.text(), tip), _item(self.words[op.key], tip), _item(ran, tip), _item(_short(found.local), tip))
            cells[1].setForeground(locality_colour(self.words[op.key]))
            for column, cell in enumerate(cells):
                self.ops.setItem(row, column, cell)
        _fit_columns(self.ops)
        first = next((n for n, op in enumerate(self.listed) if str(op.classification.locality) == "local"), 0 if self.listed else None)
        if first is not None:
            self.ops.setCurrentCell(first, 0)

    def _show_budget(self, diagnosis: Diagnosis) -> None:
        budget = diagnosis.budget
        rows = [] if budget is None else sorted(budget.rows, key=lambda r: -(r.share or 0.0))
        self.budget.setRowCount(len(rows))
        for row, entry in enumerate(rows):
            for column, text in enumerate((entry.key.text(), share_text(entry), _short(entry.local), entry.injected)):
                self.budget.setItem(row, column, _item(text))
        _fit_columns(self.budget)
        title = BUDGET_TITLE if budget is None or budget.final_logits is None else f"Budget of {budget.final_logits}"
        self.details.setTabText(1, title)

    def _op_chosen(self, row: int) -> None:
        if not 0 <= row < len(self.listed):
            return
        op = self.listed[row]
        self._show_candidates(op)
        pair = cv.find_pair(self.model.comparison, op.key)
        if pair is not None:
            self.model.select(pair)

    def _show_candidates(self, op: OpDiagnosis) -> None:
        found = op.classification
        route = "; ".join(found.oracle_route) or "—"
        self.why.setText(code_text(f"{found.key} is {self.words.get(found.key, str(found.locality))}: {found.why}."))
        self.why.setToolTip(code_text(f"Oracle's route: {route}.\nCloser to exact (float64): {found.closer_to_exact}."))
        self.layout().activate()
        self.candidates.setRowCount(len(op.candidates))
        for row, result in enumerate(op.candidates):
            native = _short(result.vs_native) if result.skipped is None else "not run"
            tip = f"{candidate_line(result)}\n{result.description}\nsource: {result.source}"
            cells = (_item(result.id, tip), _item(native, tip), _item(_short(result.vs_oracle_route), tip), _item(result.description, tip))
            if result.vs_native is not None and result.vs_native.bit_exact:
                cells[0].setForeground(status_colour(Kind.BIT_EXACT))
            for column, cell in enumerate(cells):
                self.candidates.setItem(row, column, cell)
        _fit_columns(self.candidates)
        self.details.setTabText(0, f"{CANDIDATES_TITLE} at {found.key}")

    def _follow_selection(self, pair: Any) -> None:
        """The window chose an op: show its row here when it was diagnosed."""
        if pair is None or self.diagnosis is None:
            return
        rows = [n for n, op in enumerate(self.listed) if op.key == pair.key]
        if rows and self.ops.currentRow() != rows[0]:
            self.ops.setCurrentCell(rows[0], 0)

    def shutdown(self) -> None:
        self.tasks.shutdown()
