"""The live-rerun panel: pick an op or segment and options, run it in the background, read the verdict.

The rerun itself is `backends.rerun.segment.iter_rerun`, a plain generator; this panel only collects
the options, runs it on a worker (`viewer.workers.TaskSlots`, newest request wins), shows
progress and a Cancel button, and renders the three-way table and the float64 verdict. On a
CPU it says plainly that every SDPA call took MLX's decomposed fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QStringListModel, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from backends.diagnosis.candidates import metrics_cell
from backends.engines.mlx_device import gpu_available
from backends.kernels.head_chunk import DEFAULT_CHUNK_LIMIT
from backends.rerun import ops as rerun_ops
from backends.rerun.capture_out import save_rerun
from backends.rerun.inputs import why_not_rerunnable
from backends.rerun.segment import (
    SEGMENTS,
    SIDES,
    OpRerun,
    RerunOptions,
    RerunResult,
    iter_rerun,
    rerun_target,
)
from sessions.capture.reader import Capture
from sessions.compare.comparison import Comparison
from sessions.compare.key import OpKey
from sessions.progress import Progress
from viewer.comparison_view import ViewedComparison
from viewer.widgets.plain_text import plain_label
from viewer.widgets.progress_bar import show_progress
from viewer.workers import TaskSlots

SaveChooser = Callable[[QWidget, str], "Path | None"]
"""Asks where to save a rerun capture (a file dialog; tests inject a path)."""


def ask_save_path(parent: QWidget, suggested: str) -> Path | None:
    name, _ = QFileDialog.getSaveFileName(parent, "Save rerun as capture", suggested, "Captures (*.h5)")
    return Path(name) if name else None


COLUMNS = ("op", "route that ran", "native vs oracle", "rerun vs native", "rerun vs oracle", "closer to exact\nRMSE n / o / rerun")
"""The last title and its cells on two lines: on one, at 1280x720, both were cut to ":o exact (RMSE n / o /" and "tie 6.83e-04 / …"."""


CHOOSE = "Choose an op or a segment, then run it."
READY_PREFIX = "Run reruns "


def ready(key: str) -> str:
    """The status line of an op chosen and not yet run."""
    return f"{READY_PREFIX}{key} with the options above."
"""What the panel says until an op is chosen."""

class RerunPanelModel(QObject):
    """The two captures a rerun reads, the comparison whose alignment it follows, the keys it can
    rerun, and the last result."""

    captures_changed = Signal()
    result_changed = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.native: Capture | None = None
        self.oracle: Capture | None = None
        self.comparison: Comparison | None = None
        self.keys: list[str] = []
        self.result: RerunResult | None = None

    def set_pair(self, native: Capture | None, oracle: Capture | None, viewed: ViewedComparison | None) -> None:
        """Keys come from the comparison's pairs (found off the UI thread,
        `ViewedComparison.rerunnable`): until a pair is compared there is nothing to rerun."""
        self.native, self.oracle = native, oracle
        self.comparison = viewed.comparison if viewed is not None else None
        self.keys = viewed.rerunnable if viewed is not None else []
        self.set_result(None)
        self.captures_changed.emit()

    def set_result(self, result: RerunResult | None) -> None:
        self.result = result
        self.result_changed.emit(result)


def _closer(op: OpRerun) -> str:
    rmse = " / ".join(f"{op.exact[s].rmse:.2e}" if s in op.exact else "—" for s in ("native", "oracle", "rerun"))
    caveat = " (inputs differ)" if op.inputs_agree is False else ""
    return f"{op.closer}{caveat}\n{rmse}"


class RerunPanel(QWidget):
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    saved = Signal(object)
    """The Path the finished rerun was saved to, by Save as capture: the window records it in the
    session and offers to open it beside either side."""

    def __init__(self, model: RerunPanelModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.tasks = TaskSlots(self)
        self.choose_save_path: SaveChooser = ask_save_path
        self.key = QComboBox()
        self.key.setEditable(True)
        self.key.setMinimumContentsLength(24)
        # As wide as 24 characters, not as its longest key: measuring a real run's 260,000 keys
        # for the width held the window for a second the first time the panel showed.
        self.key.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.source = QComboBox()
        self.source.addItems(["oracle", "native"])
        self.route_from = QComboBox()
        self.route_from.addItem("the same side", None)
        for side in SIDES:
            self.route_from.addItem(side, side)
        self.head_chunk = QComboBox()
        self.head_chunk.setToolTip("Split SDPA by the MTPLX head-chunk rule: as the route side's recorded calls, or on or off")
        for text, value in (("head-chunk: as recorded", None), ("head-chunk: on", True), ("head-chunk: off", False)):
            self.head_chunk.addItem(text, value)
        self.chunk_limit = QSpinBox()
        self.chunk_limit.setRange(1, 4096)
        self.chunk_limit.setValue(DEFAULT_CHUNK_LIMIT)
        self.dtype = QComboBox()
        self.dtype.addItem("as captured", None)
        for name in rerun_ops.DTYPES:
            self.dtype.addItem(name, name)
        self.device = QComboBox()
        self.device.addItem("cpu", "cpu")
        self.device.addItem("gpu", "gpu")
        if not gpu_available():
            self.device.model().item(1).setEnabled(False)  # type: ignore[attr-defined]
            self.device.setToolTip("This MLX build has no GPU; reruns run on the CPU.")
        self.run_button = QPushButton("Run rerun")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.save_button = QPushButton("Save as capture…")
        self.save_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.status = plain_label(CHOOSE)
        self.status.setWordWrap(True)
        self.device_note = plain_label()
        self.device_note.setWordWrap(True)
        self.device_note.setStyleSheet("color: #c9a227;")
        self.calls = plain_label()
        self.calls.setWordWrap(True)
        self.verdict = plain_label()
        self.verdict.setWordWrap(True)
        self.verdict.setStyleSheet("font-weight: bold;")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # Not stretched: a stretched last column took only the room left, 100 px, and cut its title and figures.
        self.table.horizontalHeader().setStretchLastSection(False)
        self._layout()
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(lambda: self.tasks.cancel_lane("rerun"))
        self.save_button.clicked.connect(self._ask_save)
        self.tasks.progressed.connect(self._progressed)
        self.tasks.busy_changed.connect(self._busy)
        self._keys_shown = False
        self._refusal: str | None = None
        """The status line `set_key` last wrote to refuse an op, until another op is chosen."""
        self._pair: tuple[Capture | None, Capture | None] = (model.native, model.oracle)
        """The pair the keys are of: another pair drops a rerun still running."""
        model.captures_changed.connect(self._captures_changed)
        model.result_changed.connect(self._show)

    def _layout(self) -> None:
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow("Op or segment", self.key)
        self.key.setToolTip("An op key, STEP:SEGMENT:LAYER:OP (e.g. 0:visual:0:sdpa), or a segment in the op's place (attention_block, decoder_layer)")
        sides = QHBoxLayout()
        for label, widget in (("inputs from", self.source), ("route from", self.route_from)):
            sides.addWidget(plain_label(label))
            sides.addWidget(widget)
        sides.addStretch(1)
        form.addRow("Sides", sides)
        for title, widgets in (
            ("Attention", (self.head_chunk, plain_label("chunk limit"), self.chunk_limit)),
            ("Compute", (plain_label("dtype"), self.dtype, plain_label("device"), self.device)),
        ):
            row = QHBoxLayout()
            for widget in widgets:
                row.addWidget(widget)
            row.addStretch(1)
            form.addRow(title, row)
        buttons = QHBoxLayout()
        for widget in (self.run_button, self.cancel_button, self.progress, self.save_button):
            buttons.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.device_note)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.calls)
        layout.addWidget(self.verdict)

    def set_key(self, key: str) -> None:
        """Preselect an op (e.g. the op selected in the alignment tree or the timeline). One no
        rerun computes (embed, an attention stage) leaves the choice as it was and says why: the
        window's first selection, a clean pair's embed, made Run fail with an error."""
        op = OpKey.parse(key).op
        why = None if op in SEGMENTS else why_not_rerunnable(op)
        chosen = self.key.currentText()
        # It said only that this op cannot be rerun, over another op still chosen, which Run then reran.
        still = f" Run reruns {chosen}, still chosen." if chosen else ""
        refusal = None if why is None else f"{key} cannot be rerun: {why}.{still}"
        if refusal is not None or self.status.text() in (self._refusal, CHOOSE) or self.status.text().startswith(READY_PREFIX):
            self.status.setText(refusal or ready(key))  # a refusal stays only while its op is the one chosen
        self._refusal = refusal
        if refusal is None:
            self.key.setCurrentText(key)
            shown = self.model.result
            if shown is not None and shown.target.text() != key:
                # Another op's table and verdict read as this one's, and "done" as its run's (no run
                # is in flight while a result is shown: a run takes the result down as it starts).
                self.model.set_result(None)
                self._end_progress("")

    def options(self) -> RerunOptions:
        return RerunOptions(
            source=self.source.currentText(),
            route_from=self.route_from.currentData(),
            head_chunk=self.head_chunk.currentData(),
            chunk_limit=self.chunk_limit.value(),
            dtype=self.dtype.currentData(),
            device=self.device.currentData(),
        )

    def run(self) -> None:
        native, oracle, comparison = self.model.native, self.model.oracle, self.model.comparison
        # Whatever this run ends in, the last run's table, verdict and Save no longer stand for what is asked.
        self.model.set_result(None)
        self._end_progress("")
        if native is None or oracle is None or comparison is None:
            self.status.setText("Open a native and an oracle capture first, and let the comparison finish.")
            return
        try:
            key, options = rerun_target(self.key.currentText()), self.options()
        except ValueError as exc:
            self._failed(str(exc))
            return
        self.status.setText(f"Rerunning {key.text()}…")
        self.tasks.submit("rerun", lambda: iter_rerun(native, oracle, comparison, key, options), self._succeeded, self._failed, self._cancelled)

    def _succeeded(self, result: RerunResult) -> None:
        """A run that ends after another op was chosen shows its own op again: its table stood
        under the op chosen meanwhile, and Save recorded it against that op."""
        self.progress.setValue(self.progress.maximum())
        self.progress.setFormat("done")
        if self.key.currentText() != result.target.text():
            self.key.setCurrentText(result.target.text())
        self.model.set_result(result)
        self.finished.emit(result)

    def _failed(self, message: str) -> None:
        message = message.removeprefix("RerunInputError: ")
        self._end_progress("failed")
        self.status.setText(f"The rerun could not run: {message}")
        self.failed.emit(message)

    def _cancelled(self) -> None:
        self._end_progress("cancelled")
        self.status.setText("Rerun cancelled.")
        self.cancelled.emit()

    def _end_progress(self, text: str) -> None:
        """The bar emptied, saying how the run ended: it kept the label of a step it never finished."""
        self.progress.setValue(self.progress.minimum())
        self.progress.setFormat(text)

    def _progressed(self, progress: Progress) -> None:
        show_progress(self.progress, progress, progress.label[:60])

    def _busy(self, busy: bool) -> None:
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)

    def _captures_changed(self) -> None:
        """The key list follows the comparison when the panel is shown: a real model's hundreds
        of thousands of keys take 25-110 ms to hand to Qt, which the comparison's arrival must
        not wait for while the panel is hidden."""
        self._keys_shown = False
        pair = (self.model.native, self.model.oracle)
        if pair != self._pair:  # a rerun of another pair: its answer is not of this one, nor its words
            self.tasks.drop_lane("rerun")
            self._end_progress("")
            self._refusal = None
            self.status.setText(CHOOSE)
        self._pair = pair
        if self.isVisible():
            self._show_keys()

    def _show_keys(self) -> None:
        current = self.key.currentText()
        # One model reset: adding a real model's hundreds of thousands of keys one by one took seconds.
        self.key.setModel(QStringListModel(self.model.keys, self.key))
        self._keys_shown = True
        if current:
            self.key.setCurrentText(current)

    def showEvent(self, event: QShowEvent) -> None:
        if not self._keys_shown:
            self._show_keys()
        super().showEvent(event)

    def _show(self, result: RerunResult | None) -> None:
        self.save_button.setEnabled(result is not None)
        self.table.setRowCount(0)
        if result is None:
            for label in (self.verdict, self.device_note, self.calls):
                label.setText("")
            # "Ran on cpu ... Route: swiglu ..." stood beside the next op chosen, over an empty table;
            # then "Choose an op" beside the op chosen, and "done" of the run whose table went.
            chosen = self.key.currentText()
            self.status.setText(self._refusal or (ready(chosen) if chosen else CHOOSE))
            return
        self.table.setRowCount(len(result.ops))
        for row, op in enumerate(result.ops):
            # Each cell on two lines, as its title: on one, the columns ran past a 1280x720 window's tab.
            figures = (metrics_cell(op.three_way[pair]).replace(" · ", "\n") for pair in ("native vs oracle", "rerun vs native", "rerun vs oracle"))
            cells = (op.key.op, op.route.replace(", ", "\n", 1), *figures, _closer(op))
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if op.calls and column == 1:
                    item.setToolTip("\n".join(
                        f"KV group {c.call.kv_group}, heads {c.call.head_start}..{c.call.head_start + c.call.head_count - 1}: "
                        f"{c.primitive} here, Metal would take {c.metal_primitive}" for c in op.calls))
                self.table.setItem(row, column, item)
        self.table.resizeRowsToContents()
        self.status.setText(f"Ran on {result.device} (MLX {result.mlx_version}). Route: {result.route_text()}.")
        self.device_note.setText(" ".join(result.notes))
        self.calls.setText("\n".join(
            f"SDPA call {n}: {'all KV groups' if c.call.kv_group == -1 else f'KV group {c.call.kv_group}'}, heads "
            f"{c.call.head_start}..{c.call.head_start + c.call.head_count - 1}, {c.call.q_rows} rows × {c.call.kv_len} kv, "
            f"mask {op.mask_kind} → {c.primitive} here; Metal would take {c.metal_primitive}"
            for op in result.ops for n, c in enumerate(op.calls)))
        self.verdict.setText(result.verdict())
        self.layout().activate()

    def save_to(self, path: str | Path) -> Path:
        assert self.model.result is not None
        saved = save_rerun(self.model.result, path)
        self.status.setText(f"Saved as {saved} (role rerun); open it beside the others.")
        self.saved.emit(saved)
        return saved

    def _ask_save(self) -> None:
        assert self.model.result is not None
        path = self.choose_save_path(self, f"rerun-{self.model.result.target.text().replace(':', '_')}.h5")
        if path is None:
            return
        try:
            self.save_to(path)
        except OSError as exc:  # a full disk, a folder that refuses the file
            self.status.setText(f"Could not save the rerun to {path}: {exc.strerror or exc}")

    def shutdown(self) -> None:
        self.tasks.shutdown()
