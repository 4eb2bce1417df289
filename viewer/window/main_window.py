"""The Parity X-ray window: opening files, running the comparison, and wiring the panels together.

All file reads and diff work go through `TaskSlots` lanes (open, compare, tensor), so the
UI thread only ever receives finished results; a newer request in a lane cancels the older
one. Problems with a file end as a banner in the window; what was open stays open.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QObject, Qt, QUrl
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QKeySequence,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from sessions.capture.pair_opening import assign_roles, iter_open_captures
from sessions.capture.reader import Capture
from sessions.capture.record_attributes import RecordAttributes
from sessions.compare.options import CompareOptions
from sessions.compare.tolerance_policy import PolicyError
from sessions.progress import Progress
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.panels.attributes_dialog import AttributesDialog
from viewer.panels.bookmarks_panel import BookmarksPanel
from viewer.panels.diagnosis_panel import DiagnosisPanel
from viewer.panels.dispatch_tabs import DispatchTabs
from viewer.panels.overview_plot import OverviewPlot
from viewer.panels.provenance_panel import ProvenancePanel
from viewer.panels.token_table import TokenTable
from viewer.panels.worst_ops_table import WorstOpsTable
from viewer.settings import ViewerSettings
from viewer.tensor.tensor_loader import (
    SliceSpec,
    TensorSlice,
    iter_prepare,
    iter_prepare_detail,
)
from viewer.tensor.tensor_view import TensorView
from viewer.theme import apply_theme, icon, restyle_plots
from viewer.tree.alignment_tree import AlignmentTree
from viewer.widgets.banner import BannerArea
from viewer.widgets.filling_stack import FillingStack
from viewer.widgets.plain_text import plain_label
from viewer.widgets.progress_bar import show_progress
from viewer.window.bookmark_camera import BookmarkCamera
from viewer.window.deep_check import DeepCheck
from viewer.window.drop_hint import DropHint
from viewer.window.finding_steps import FindingSteps
from viewer.window.help_dialog import HelpDialog
from viewer.window.pairing_menu import PairingMenu
from viewer.window.panel_tabs import PanelTabs
from viewer.window.report_export import ReportExporter
from viewer.window.session_captures import SessionCaptures
from viewer.window.session_file import SessionFile
from viewer.window.session_sync import MISSING_OP, SessionSync, WindowView
from viewer.window.slice_export import SliceExport
from viewer.window.tolerance import ToleranceDialog, ToleranceIndicator
from viewer.window.uncaught_errors import show_uncaught_errors_in
from viewer.window.verdict_strip import VerdictStrip
from viewer.workers import TaskSlots

TABS = ("Tensor diff", "Overview", "Token parity", "Provenance", "Dispatch timeline", "Rerun", "Diagnosis", "Worst ops")

TREE_WIDTH = 420
"""The alignment tree's width when the window opens: its op, ULP and differing columns whole."""
TREE_WIDTH_WITH_CAUSES = 450
"""The tree's least width while a diagnosis's cause column shows: the op names of a layer's rows
stay whole beside it. Only then: the tensor maps keep their width until a diagnosis."""
TREE_MIN_WIDTH = 260
"""As narrow as a user may make it, so the window fits a 1024-pixel screen or half of a wide one."""
GIL_SWITCH_INTERVAL_S = 0.001
"""Painting runs hundreds of short Python callbacks; with a worker thread busy, each one may wait
a whole switch interval for the interpreter lock (5 ms by default), which adds up to visible
stalls. A 1 ms interval keeps them short (measured in benchmarks/bench_ui_stall.py)."""


CARD_EXPANDED_FROM_HEIGHT = 900
"""Window height from which the contract card opens with its details shown. Below it the card is
one line (which op, what each side ran) with a Details toggle: at 1280x720 the full card took
~100 px of height and left each of the three tensor maps 11 px of data (now about 44)."""

OLD_PAIR_LANES = ("open", "compare", "tensor", "detail", "identity", "attributes")
"""The window's task lanes that read the open pair: dropped when a session's pair replaces it."""
PAIR_BANNERS = ("open", "roles", "captures", "comparison", "captures-check", "session", MISSING_OP, "timeline", "rerun", "attributes")
"""Banner groups about the pair on show and its session: a new pair or another session clears them."""


@dataclass(frozen=True)
class GateJudged:
    """A gate case's pair, the options the gate judged it by, and the gate's judgment in words."""

    paths: tuple[Path, Path]
    options: CompareOptions
    judgment: str


class MainWindow(QMainWindow):
    def __init__(self, settings: ViewerSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.settings = settings or ViewerSettings()
        self.setObjectName("ParityXrayMainWindow")
        self.setWindowTitle("Parity X-ray")
        self.setWindowIcon(icon("app-icon.svg"))
        self.setAcceptDrops(True)
        self.model = PairModel(self)
        self.tasks = TaskSlots(self)
        self.judged_by_gate: GateJudged | None = None
        """A gate case this window was opened on (viewer.gate.gate_window): its pair is compared
        with the options the gate judged it by, unless the session chooses its own."""
        self._retired: list[Capture] = []
        self._beside: list[MainWindow] = []
        self.attributes_dialog: AttributesDialog | None = None
        self._build_central()
        self._build_tree_dock()
        self.findings = FindingSteps(
            self, self.model, self.tree, self.token_table, lambda name: self.show_panel(TABS.index(name)), lambda: TABS[self.tabs.currentIndex()]
        )
        self.verdict_strip.go_requested.connect(self.findings.jump_to_first)
        self.tree.jump_requested.connect(self.findings.jump_to_first)
        self._build_bookmarks_dock()
        self._build_status_bar()
        self._connect_model()
        self._build_session()
        self._build_actions()
        self._restore_layout()
        self._warm_up_panels()
        self._update_roles()
        show_uncaught_errors_in(self.banners)
        self.session_file.offer_recovery()

    # -- construction ------------------------------------------------------------------------

    def _build_central(self) -> None:
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.verdict_strip = VerdictStrip(self.model)
        layout.addWidget(self.verdict_strip)
        self.banners = BannerArea()
        layout.addWidget(self.banners)
        self.deep_check = DeepCheck(lambda: (self.model.native, self.model.oracle), self.tasks, self.banners)
        self.stack = FillingStack()
        self.drop_hint = DropHint()
        self.drop_hint.open_requested.connect(self.open_dialog)
        self.tabs = PanelTabs()
        self.tasks.busy_changed.connect(self.tabs.work_changed)
        self.tabs.setDocumentMode(True)
        self.tensor_view = TensorView(self.model)
        self.overview = OverviewPlot(self.model)
        self.token_table = TokenTable(self.model)
        self.provenance = ProvenancePanel(self.model)
        self.dispatch = DispatchTabs(self.model, self.tasks, self.banners, self)
        self.dispatch.open_pair_requested.connect(self.open_beside)
        self.diagnosis = DiagnosisPanel(self.model)
        self.worst_ops = WorstOpsTable(self.model)
        panels = (self.tensor_view, self.overview, self.token_table, self.provenance, self.dispatch.timeline, self.dispatch.rerun, self.diagnosis, self.worst_ops)
        for name, widget in zip(TABS, panels):
            self.tabs.addTab(widget, name)
        self.stack.addWidget(self.drop_hint)
        self.stack.addWidget(self.tabs)
        self.stack.installEventFilter(self)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.tensor_view.slice_requested.connect(self.load_slice)
        self.tensor_view.detail_requested.connect(self.load_detail)
        self.export_slice = SliceExport(self.tensor_view, lambda: self.model.native, self.tasks, self.banners, self.statusBar().showMessage, self).export
        self.tensor_view.export_requested.connect(self.export_slice)

    def _build_tree_dock(self) -> None:
        self.tree = AlignmentTree(self.model)
        self.tree.unaligned_chosen.connect(lambda record: self.tensor_view.clear(cv.unaligned_explanation(record)))
        self.tree.attributes_requested.connect(self.show_attributes)
        dock = QDockWidget("Alignment", self)
        dock.setObjectName("alignmentDock")
        dock.setWidget(self.tree)
        self.tree.setMinimumWidth(TREE_MIN_WIDTH)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
        self.tree_dock = dock
        self.resizeDocks([dock], [TREE_WIDTH], Qt.Orientation.Horizontal)
        self.model.diagnosis_changed.connect(self._widen_tree_for_causes)

    def _widen_tree_for_causes(self) -> None:
        if self.model.locality and self.tree_dock.width() < TREE_WIDTH_WITH_CAUSES:
            self.resizeDocks([self.tree_dock], [TREE_WIDTH_WITH_CAUSES], Qt.Orientation.Horizontal)

    def _build_bookmarks_dock(self) -> None:
        self.bookmarks = BookmarksPanel()
        dock = QDockWidget("Bookmarks", self)
        dock.setObjectName("bookmarksDock")
        dock.setWidget(self.bookmarks)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
        self.bookmarks_dock = dock
        self.resizeDocks([self.tree_dock, dock], [640, 220], Qt.Orientation.Vertical)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.role_label = plain_label()
        self.role_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        bar.addWidget(self.role_label, 1)
        self.tolerance_indicator = ToleranceIndicator(self.model)
        self.tolerance_indicator.clicked.connect(self.edit_tolerance)
        bar.addPermanentWidget(self.tolerance_indicator)
        self.progress = QProgressBar()
        self.progress.setFixedWidth(260)
        self.progress.setVisible(False)
        bar.addPermanentWidget(self.progress)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setVisible(False)
        self.cancel_button.setToolTip("Stop the running read or comparison (Esc)")
        self.cancel_button.clicked.connect(self.cancel_work)
        bar.addPermanentWidget(self.cancel_button)
        self.tasks.progressed.connect(self._show_progress)
        self.tasks.busy_changed.connect(self._busy_changed)

    def _action(self, text: str, slot: Any, shortcut: QKeySequence | str | None = None, icon_name: str | None = None, tip: str = "") -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if icon_name:
            action.setIcon(icon(icon_name))
        if tip:
            action.setToolTip(tip)
            action.setStatusTip(tip)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        self.open_action = self._action("&Open captures…", self.open_dialog, QKeySequence.StandardKey.Open, "open-file.svg", "Open one or two capture files (Ctrl+O)")
        self.swap_action = self._action("&Swap roles", self.swap_roles, "Ctrl+Shift+S", "swap-roles.svg", "Swap native and oracle (Ctrl+Shift+S)")
        self.jump_action = self._action("Jump to &first finding", self.findings.jump_to_first, "Ctrl+J", "jump-divergence.svg", "Go to the verdict's first finding, the place `report` names (Ctrl+J)")
        self.next_action = self._action("&Next divergence", lambda: self.findings.step(+1), "F8", tip="Next op that is not bit-exact (F8)")
        self.prev_action = self._action("&Previous divergence", lambda: self.findings.step(-1), "Shift+F8", tip="Previous op that is not bit-exact (Shift+F8)")
        self.cancel_action = self._action("&Cancel work", self.cancel_work, "Esc", tip="Cancel the running read or comparison")
        self.quit_action = self._action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.theme_action = self._action("Switch to &light theme", self.toggle_theme, "Ctrl+Shift+T")
        self.tolerance_action = self._action("&Tolerance…", self.edit_tolerance, "Ctrl+T", tip="Set atol, rtol, max ULP error or a per-op policy file, and compare again (Ctrl+T)")
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for action in (self.open_action, self.swap_action, self.jump_action, self.prev_action, self.next_action):
            toolbar.addAction(action)
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        file_menu.addAction(self.open_action)
        self.recent_menu = file_menu.addMenu("Open &recent")
        file_menu.addAction(self.swap_action)
        file_menu.addSeparator()
        self.open_session_action = self._action("Open &session…", self.session_file.open_dialog, "Ctrl+Shift+O", tip="Open a saved investigation (.xray)")
        self.save_session_action = self._action("&Save session", self.session_file.save, QKeySequence.StandardKey.Save, tip="Save the investigation (Ctrl+S)")
        self.save_session_as_action = self._action("Save session &as…", self.session_file.save_as, "Ctrl+Alt+S", tip="Save the investigation to a new file")
        for action in (self.open_session_action, self.save_session_action, self.save_session_as_action):
            file_menu.addAction(action)
        self.recent_sessions_menu = file_menu.addMenu("Recent sessio&ns")
        export = file_menu.addMenu("&Export")
        self.export_md_action = self._action("Bookmarks and notes as &Markdown…", lambda: self.report_export.export_markdown())
        self.export_html_action = self._action("&HTML report…", lambda: self.report_export.export_html())
        export.addAction(self.export_md_action)
        export.addAction(self.export_html_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        navigate = menu.addMenu("&Navigate")
        for action in (self.jump_action, self.next_action, self.prev_action, self.cancel_action):
            navigate.addAction(action)
        compare = menu.addMenu("&Compare")
        compare.addAction(self.tolerance_action)
        self.alignment_actions = PairingMenu(compare, self.session_sync.set_alignment_mode, self)
        self.alignment_actions.show_mode(self.session_file.session.alignment_mode)
        view = menu.addMenu("&View")
        focus_tree = self._action("Alignment &tree", self._focus_tree, "Ctrl+0")
        view.addAction(focus_tree)
        self.tab_actions = []
        for i, name in enumerate(TABS):
            action = self._action(name, lambda _=False, i=i: self.show_panel(i), f"Ctrl+{i + 1}")
            view.addAction(action)
            self.tab_actions.append(action)
        view.addSeparator()
        self.bookmark_action = self._action("&Bookmark this op", lambda: self.session_sync.add_bookmark(), "Ctrl+B", tip="Bookmark the selected op and its view (Ctrl+B)")
        navigate.addAction(self.bookmark_action)
        bookmarks_toggle = self.bookmarks_dock.toggleViewAction()
        bookmarks_toggle.setShortcut(QKeySequence("Ctrl+Shift+B"))
        view.addAction(bookmarks_toggle)
        view.addAction(self.theme_action)
        help_menu = menu.addMenu("&Help")
        self.help_action = self._action("Parity X-ray &help", self.show_help, QKeySequence.StandardKey.HelpContents, tip="Shortcuts, glossary, colour legend and documents (F1)")
        help_menu.addAction(self.help_action)
        self._rebuild_recent_menu()
        self.rebuild_recent_sessions()

    def show_help(self) -> HelpDialog:
        dialog = HelpDialog(self.actions(), self)
        dialog.show()
        return dialog

    def edit_tolerance(self) -> ToleranceDialog:
        """The tolerance and policy in force, to change; accepting records them in the session and compares again."""
        dialog = ToleranceDialog(*self.session_sync.tolerance_in_force(self._base_options()), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.chosen.connect(self.session_sync.set_tolerance)
        dialog.open()
        return dialog

    def show_attributes(self, row: Any) -> None:
        """A tree row's records with their raw HDF5 attributes, read off the UI thread, in a window of their own."""
        native, oracle = self.model.native, self.model.oracle
        if native is None or oracle is None:
            return
        self.tasks.submit(
            "attributes",
            lambda: cv.iter_row_attributes(native, oracle, row),
            on_success=lambda sides: self._attributes_ready(cv.row_title(row), sides),
            on_failure=lambda message: self.banners.show_message("attributes", "error", f"The attributes cannot be read: {message}"),
        )

    def _attributes_ready(self, title: str, sides: list[RecordAttributes]) -> None:
        if self.attributes_dialog is not None:
            self.attributes_dialog.close()
            self.attributes_dialog.deleteLater()
        self.attributes_dialog = AttributesDialog(title, sides, self)
        self.attributes_dialog.show()

    def _connect_model(self) -> None:
        self.model.captures_changed.connect(self._update_roles)
        self.model.comparison_changed.connect(self._comparison_changed)
        self.model.selection_changed.connect(self._selection_changed)
        self.overview.op_clicked.connect(self.model.select)

    def _build_session(self) -> None:
        """The investigation's parts, each given what it needs of the window; built after the
        window's own model handlers, so a restored selection wins over the first-finding jump."""
        status = self.statusBar().showMessage
        self.session_file = SessionFile(self.settings, self.banners, status, self)
        self.session_captures = SessionCaptures(self.tasks, self.banners, self.show_session_pair, self)
        view = WindowView(
            panel=self.tabs.currentIndex,
            show_panel=self.show_panel,
            shown_slice=lambda: None if self.tensor_view.data is None else self.tensor_view.data.spec,
            load_slice=self.load_slice,
            save_layout=lambda: bytes(self.saveState()),
            restore_layout=lambda state: self.restoreState(QByteArray(state)),
        )
        self.session_sync = SessionSync(lambda: self.session_file.session, self.model, self.tasks, self.banners, view, self.start_compare, status, self)
        camera = BookmarkCamera(self.model, self.tasks, self.tensor_view.size, self.session_sync.say_missing, self)
        self.report_export = ReportExporter(lambda: self.session_file.session, self.model, camera, self.banners, status, self.tasks, self)
        self.session_file.document_changed.connect(self._update_roles)
        self.session_file.recent_changed.connect(self.rebuild_recent_sessions)
        self.session_file.replaced.connect(self._session_replaced)
        self.session_file.about_to_save.connect(self._before_save)
        self.session_file.captures_wanted.connect(self._check_session_pair)
        self.session_captures.pair_opening.connect(self.session_sync.expect_restore)
        self.session_captures.pair_refused.connect(self.session_sync.restore_refused)
        self.session_sync.bookmark_added.connect(self._reveal_bookmark)
        self.tabs.currentChanged.connect(lambda _i: self.session_sync.record_view())
        self.tensor_view.slice_shown.connect(self.session_sync.record_view)
        self.bookmarks.add_requested.connect(self.session_sync.add_bookmark)
        self.bookmarks.jump_requested.connect(self.session_sync.show_bookmark)
        self.dispatch.rerun_saved.connect(self.session_sync.record_rerun)
        self.tree.break_requested.connect(self.session_sync.break_pairing)
        self.tree.pair_requested.connect(self.session_sync.pair_records)
        self.tree.undo_requested.connect(self.session_sync.undo_override)
        self.bookmarks.set_session(self.session_file.session)

    def _session_replaced(self, session: Any) -> None:
        """Another investigation took the old one's place: nothing of the old one may stay live."""
        for group in PAIR_BANNERS:
            self.banners.clear(group)
        self.bookmarks.set_session(session)
        self.alignment_actions.show_mode(session.alignment_mode)

    def _check_session_pair(self) -> None:
        """An opened or recovered session's pair is checked, then shown; meanwhile nothing of the
        old pair stays on screen. A session whose capture was missing or changed left the old pair
        and its verdict under its name, where a bookmark landed on the wrong captures. The old
        pair's comparison still running is dropped, not cancelled: its "Comparison cancelled"
        would stand under the new session, and end its restore; so are its other reads (a
        previous session's opening, a tensor, a detail, the captures' identities), whose answers
        put the old pair or its tensor back on screen. (A pair opened by hand replaces the old
        one itself, so a new session leaves the pair alone.)"""
        for lane in OLD_PAIR_LANES:
            self.tasks.drop_lane(lane)
        self.tensor_view.clear("Select an op in the alignment tree")
        self._retired.extend(self.model.set_captures(None, None))
        self._close_retired()
        self.session_captures.check(self.session_file.session, self.session_file.folder)

    def _reveal_bookmark(self, bookmark: Any) -> None:
        self.bookmarks.select_bookmark(bookmark.id)
        self.bookmarks_dock.show()
        self.bookmarks.note.setFocus()

    def _restore_layout(self) -> None:
        geometry, state = self.settings.window_geometry(), self.settings.window_state()
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1440, 900)
        if state is not None:
            self.restoreState(state)
        self._apply_theme(self.settings.theme())

    def _warm_up_panels(self) -> None:
        """Lay out and paint the hidden panels once before the window shows.

        Their first layout, style polish and paint (pyqtgraph axes, fonts) takes ~100 ms; done
        here it is part of start-up instead of a freeze at the moment a user drops a file.
        """
        self.tabs.resize(self.size())
        for index in range(self.tabs.count()):
            self.tabs.setCurrentIndex(index)
            self.tabs.grab()
        self.tabs.setCurrentIndex(0)

    # -- opening -----------------------------------------------------------------------------

    def open_dialog(self) -> None:
        start = str(self.model.native.path.parent) if self.model.native is not None else ""
        names, _ = QFileDialog.getOpenFileNames(self, "Open one or two captures", start, "Captures (*.h5 *.hdf5 *.capture);;All files (*)")
        if names:
            self.open_files([Path(n) for n in names[:2]])

    def open_files(self, paths: list[Path]) -> None:
        """Open one or two files; roles come from each file's role hint."""
        paths = [Path(p) for p in paths][:2]
        if not paths:
            return
        self._run_open(paths, explicit=False)

    def open_pair(self, native: str | Path, oracle: str | Path) -> None:
        """Open NATIVE and ORACLE in those roles (the command line and `parity-xray demo`)."""
        self._run_open([Path(native), Path(oracle)], explicit=True)

    def _run_open(self, paths: list[Path], explicit: bool) -> None:
        if not self._may_leave_session_pair(paths):
            return
        self.banners.clear("open")
        self.tasks.submit(
            "open",
            lambda: iter_open_captures(paths),
            on_success=lambda captures: self._files_opened(captures, explicit),
            on_failure=self._open_failed,
            on_cancel=lambda: self.banners.show_message("open", "info", "Opening was cancelled; what was open stays open."),
        )

    def _open_failed(self, message: str) -> None:
        """A file that cannot be opened as a capture: with no pair open, the verdict is UNUSABLE,
        as `report` says of it (the strip said "No pair open" beside `report`'s exit 2)."""
        self.banners.show_message("open", "error", f"Could not open: {message}")
        if not self.model.has_pair:
            self.verdict_strip.show_unusable(f"could not open {message}")

    def _may_leave_session_pair(self, paths: list[Path]) -> bool:
        """Files outside the session's pair end that investigation: its unsaved work is asked about
        first, as closing the window asks (False: the user cancelled, nothing is opened)."""
        named = self.session_sync.pair_paths()
        if not named or all(path.absolute() in named for path in paths):
            return True
        return self.session_file.settle_unsaved()

    def _files_opened(self, captures: list[Capture], explicit: bool) -> None:
        """Files the user opened: a pair other than the session's starts a new, empty investigation."""
        if explicit:
            native, oracle, guessed = captures[0], captures[1], False
        else:
            native, oracle, guessed = assign_roles(captures, (self.model.native, self.model.oracle))
        named = self.session_sync.pair_paths()
        if named and {c.path.absolute() for c in (native, oracle) if c is not None} != named:
            self.session_file.start_new()
        self._show_pair(captures, native, oracle, guessed)

    def show_session_pair(self, captures: list[Capture]) -> None:
        """The saved session's (native, oracle), which passed its identity gate."""
        self._show_pair(captures, captures[0], captures[1], False)

    def _show_pair(self, captures: list[Capture], native: Capture | None, oracle: Capture | None, guessed: bool) -> None:
        for capture in captures:
            self.settings.add_recent(capture.path)
        self._rebuild_recent_menu()
        self._retired.extend(self.model.set_captures(native, oracle))
        self._close_retired()
        if guessed:
            self.banners.show_message("roles", "info", "The files' role hints did not decide which is native; roles follow the drop order. Use Swap roles (Ctrl+Shift+S) if they are the other way round.")
        self.start_compare()

    def swap_roles(self) -> None:
        if self.model.native is None and self.model.oracle is None:
            return
        self.banners.clear("roles")
        self.model.swap()
        self.start_compare()

    # -- comparison --------------------------------------------------------------------------

    def start_compare(self) -> None:
        self.banners.clear("comparison")
        self._show_capture_banners()
        if not self.model.has_pair:
            return
        native, oracle = self.model.native, self.model.oracle
        self.banners.clear("gate")
        judged = self._judged_here()
        if judged is not None:
            self.banners.show_message("gate", "info", judged.judgment)
            self._say_budget_not_kept(judged)
        try:
            options = self.session_sync.compare_options(self._base_options())
        except PolicyError as exc:
            self._policy_unusable(str(exc))
            return
        self.tasks.submit(
            "compare",
            lambda: cv.iter_compare_pair(native, oracle, options),
            on_success=self.model.set_comparison,
            on_failure=self._comparison_failed,
            on_cancel=self._comparison_cancelled,
        )

    def _base_options(self) -> CompareOptions:
        """What the pair on show is compared with before the session's own choices: a gate case's
        options for its pair, and the viewer's for any other pair this window opens later (they
        stayed with the window: another pair was judged by the gate's budget)."""
        judged = self._judged_here()
        return cv.VIEWER_OPTIONS if judged is None else judged.options

    def _before_save(self) -> None:
        """The view, and a gate case's options the session would otherwise lose (`keep_options`);
        a token budget, which a session cannot hold, is said."""
        self.session_sync.record_view(with_layout=True)
        judged = self._judged_here()
        if judged is None:
            return
        self.session_sync.keep_options(judged.options)
        self._say_budget_not_kept(judged, saving=True)

    def _say_budget_not_kept(self, judged: GateJudged, saving: bool = False) -> None:
        """Beside the gate's judgment, once the session is saved (a save clears the session's own
        banners, and the comparison it starts the gate's): a session cannot hold a token budget."""
        if judged.options.max_steps is None or (self.session_file.document.path is None and not saving):
            return
        self.banners.show_message(
            "gate", "warning",
            f"The session keeps the gate's tolerance and pairing, not its token budget: reopened, it compares every "
            f"step, not the first {judged.options.max_steps}.",
        )

    def _judged_here(self) -> GateJudged | None:
        """The gate case this window was opened on, when its pair is the one on show."""
        judged, here = self.judged_by_gate, {c.path for c in (self.model.native, self.model.oracle) if c is not None}
        return judged if judged is not None and set(judged.paths) == here else None

    def _comparison_cancelled(self) -> None:
        self.model.set_comparison(None, "the comparison was cancelled")
        self.banners.show_message("comparison", "info", "Comparison cancelled. Open the pair again, or swap roles, to restart it.")

    def _policy_unusable(self, problem: str) -> None:
        """The session's policy file cannot be used (moved, edited): no verdict, as `report` exits 2.
        A comparison still running is dropped, not cancelled: its cancel, or its verdict judged by
        the old policy, arrived after this and replaced the policy's error."""
        self.tasks.drop_lane("compare")
        self.model.set_comparison(None, "the tolerance policy cannot be used")
        message = f"The tolerance policy cannot be used: {problem}"
        self.banners.show_message("comparison", "error", message, actions=[("Tolerance…", self.edit_tolerance)])
        self.verdict_strip.show_unusable(message)

    def _comparison_failed(self, message: str) -> None:
        """The pair cannot be compared (unreadable, or no profile knows its names): the verdict is UNUSABLE."""
        self.model.set_comparison(None, "the comparison failed")
        self.deep_check.offer("comparison", f"The comparison failed: {message}")
        self.verdict_strip.show_unusable(message)

    def _show_capture_banners(self) -> None:
        self.banners.clear("captures")
        for role, capture in (("native", self.model.native), ("oracle", self.model.oracle)):
            if capture is not None and not capture.complete:
                self.banners.show_message("captures", "warning", f"{role} {capture.path.name}: {capture.contents.describe()}.")

    def _comparison_changed(self) -> None:
        """Nothing said of the last comparison stays: its first finding in the status bar read
        beside a new verdict that had none, and "X is not in this comparison" beside one that held X."""
        comparison = self.model.comparison
        self.banners.clear("comparison")
        self.session_sync.forget_missing_ops()
        self.findings.forget()
        if comparison is None:
            return
        for level, text in cv.banner_messages(comparison):
            self.banners.show_message("comparison", level, text)
        card = cv.contract_card(comparison)
        if card is not None:
            headline, details = card
            expanded = self.height() >= CARD_EXPANDED_FROM_HEIGHT
            self.banners.show_message("comparison", "error", headline, details=details, expanded=expanded, rich=True)
        self.tabs.prerender_hidden()
        self.findings.arrive(comparison)

    # -- tensors -----------------------------------------------------------------------------

    def _selection_changed(self, pair: Any) -> None:
        """The op's default slice, unless its tensor is the one on show (a re-compare kept the
        op): that keeps the user's slice, which the default replaced, in the session too."""
        if pair is None:
            self.tasks.drop_lane("tensor")  # an op's tensors still loading would show beside no op
            return
        shown = self.tensor_view.data
        self.load_slice(shown.spec if shown is not None and shown.request.label == pair.key.text() else None)

    def load_slice(self, spec: SliceSpec | None) -> None:
        pair = self.model.selected
        if pair is None or not self.model.has_pair:
            return
        request = cv.tensor_request(self.model.comparison, self.model.native, self.model.oracle, pair, spec)
        if isinstance(request, str):
            self.tasks.drop_lane("tensor")
            self.tensor_view.clear(request)
            return
        self.tensor_view.show_loading(request.label)
        self.tasks.submit(
            "tensor",
            lambda: iter_prepare(request),
            on_success=self._slice_ready,
            on_failure=self._tensor_failed,
            # The last op's tensors stayed on show under "Loading <this op> ...", read as this op's.
            on_cancel=lambda: self.tensor_view.clear(f"Loading {request.label} was cancelled: choose another op and come back to load it."),
        )

    def _tensor_failed(self, message: str) -> None:
        self.tensor_view.clear(f"Cannot show this pair: {message}")
        self.deep_check.offer("tensor", f"A tensor could not be read: {message}")

    def _slice_ready(self, data: TensorSlice) -> None:
        self.tasks.cancel_lane("detail")
        self.tensor_view.show_slice(data)

    def load_detail(self, data: TensorSlice, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        self.tasks.submit(
            "detail",
            lambda: iter_prepare_detail(data, rows, cols),
            on_success=self.tensor_view.show_detail,
            on_failure=lambda message: self.statusBar().showMessage(f"Cannot show the zoomed-in region: {message}", 8000),
        )

    # -- progress, cancel --------------------------------------------------------------------

    def _show_progress(self, progress: Progress) -> None:
        show_progress(self.progress, progress, f"{progress.label}  %p%")

    def _busy_changed(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self._close_retired()

    def cancel_work(self) -> None:
        self.report_export.abort("cancelled")  # the user's own stop: a read's answer may be on its way already
        self.tasks.cancel_all()

    def _close_retired(self) -> None:
        """Captures replaced while a worker might still read them are closed once work is idle."""
        if not self.tasks.idle:
            return
        keep = (self.model.native, self.model.oracle)
        for capture in self._retired:
            if capture not in keep:
                capture.close()
        self._retired = []

    # -- panels, roles, recent, theme ----------------------------------------------------------

    def show_panel(self, index: int) -> None:
        if self.stack.currentWidget() is self.tabs and 0 <= index < self.tabs.count():
            self.tabs.setCurrentIndex(index)
            self.tabs.currentWidget().setFocus()

    def _focus_tree(self) -> None:
        self.tree.view.setFocus()

    def _update_roles(self) -> None:
        def name(capture: Capture | None) -> str:
            return capture.path.name if capture is not None else "—"

        self.role_label.setText(f"native: {name(self.model.native)}    ⇄    oracle: {name(self.model.oracle)}")
        self.swap_action.setEnabled(self.model.native is not None or self.model.oracle is not None)
        has_any = self.model.native is not None or self.model.oracle is not None
        self.stack.setCurrentWidget(self.tabs if has_any else self.drop_hint)
        title = "Parity X-ray"
        if has_any:
            title += f" — {name(self.model.native)} vs {name(self.model.oracle)}"
        document = self.session_file.document
        if document.path is not None or document.dirty:
            title += f"   [{document.path.name if document.path else 'unsaved session'}{' *' if document.dirty else ''}]"
        self.setWindowTitle(title)

    def _rebuild_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.settings.recent_files()
        for path in recent:
            action = self.recent_menu.addAction(path)
            action.triggered.connect(lambda _=False, p=path: self.open_files([Path(p)]))
        self.recent_menu.setEnabled(bool(recent))
        self.drop_hint.set_recent(recent)

    def rebuild_recent_sessions(self) -> None:
        self.recent_sessions_menu.clear()
        recent = self.settings.recent_sessions()
        for path in recent:
            action = self.recent_sessions_menu.addAction(path)
            action.triggered.connect(lambda _=False, p=path: self.session_file.open_session(Path(p)))
        self.recent_sessions_menu.setEnabled(bool(recent))

    def open_beside(self, native: Path, oracle: Path) -> MainWindow:
        """Another window on another pair (e.g. a rerun against one side); this one stays as it is."""
        window = MainWindow(self.settings)
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._beside.append(window)
        window.destroyed.connect(lambda _=None, w=window: self._beside.remove(w) if w in self._beside else None)
        window.show()
        window.open_pair(native, oracle)
        return window

    def toggle_theme(self) -> None:
        self._apply_theme("light" if self.settings.theme() == "dark" else "dark")

    def _apply_theme(self, name: str) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            restyle_plots(self, apply_theme(app, name))
        self.settings.set_theme(name)
        self.theme_action.setText("Switch to &light theme" if name == "dark" else "Switch to &dark theme")

    # -- drag and drop -----------------------------------------------------------------------

    @staticmethod
    def _local_paths(urls: list[QUrl]) -> list[Path]:
        return [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls() and 1 <= len(self._local_paths(event.mimeData().urls())) <= 2:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = self._local_paths(event.mimeData().urls())
        if not 1 <= len(paths) <= 2:
            self.banners.show_message("open", "error", "Drop one or two capture files.")
            event.ignore()
            return
        event.acceptProposedAction()
        self.open_files(paths)

    def resizeEvent(self, event: QResizeEvent) -> None:
        """The contract card follows the window's height (CARD_EXPANDED_FROM_HEIGHT) until the user
        chooses with its toggle: a window opened tall and then made small kept five lines of card."""
        super().resizeEvent(event)
        self.banners.updateGeometry()  # its height is a share of the window's
        for card in self.banners.banners("comparison"):
            card.fit_room(event.size().height() >= CARD_EXPANDED_FROM_HEIGHT)

    # -- closing -----------------------------------------------------------------------------

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.stack and event.type() == QEvent.Type.Resize:
            self.tabs.follow_while_hidden(self.stack)
        return super().eventFilter(watched, event)

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.session_file.close():
            event.ignore()
            return
        self.dispatch.shutdown()
        self.diagnosis.shutdown()
        self.settings.save_window(QByteArray(self.saveGeometry()), QByteArray(self.saveState()))
        self.settings.sync()
        self.report_export.abort()
        self.tasks.shutdown()
        for capture in {id(c): c for c in [*self._retired, self.model.native, self.model.oracle] if c is not None}.values():
            capture.close()
        self._retired = []
        super().closeEvent(event)
