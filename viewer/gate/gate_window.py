"""A gate's result (`parity-xray GATE.json`): one row per case, and each case's pair one keypress away.

The table shows what `parity-xray gate` printed, read from its JSON document (docs/gate.md),
with each verdict word in the colour of the main window's verdict strip, so a reader scanning
forty rows sees at once which are not green. Opening a case (double-click, Enter) opens its
native and oracle captures in a main window of their own; the gate window stays as it is.
"""

from __future__ import annotations

from dataclasses import replace
from html import escape
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QMainWindow,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from sessions.compare.align_modes import AUTO
from sessions.compare.profiles import builtin_profiles
from sessions.compare.tolerance_policy import PolicyError, load_policy
from sessions.compare.verdict import UNUSABLE
from sessions.gate.result import CaseResult, GateResult
from sessions.report.word_colours import WORD_COLOURS
from viewer.comparison_view import VIEWER_OPTIONS
from viewer.settings import ViewerSettings
from viewer.widgets.plain_text import plain_label, plain_tip
from viewer.window.main_window import GateJudged, MainWindow

COLUMNS = ("case", "verdict", "gate", "first finding", "tokens", "EOS", "worst op", "notes")
VERDICT_COLUMN = COLUMNS.index("verdict")


def case_cells(case: CaseResult) -> tuple[str, ...]:
    """The row's texts, in COLUMNS order."""
    tokens, eos = ("", "") if case.tokens is None else (case.tokens.compared_text(), case.tokens.eos_text())
    first = "" if case.first is None else f"{case.first.key} ({case.first.kind})"
    worst = "" if case.worst_op is None else case.worst_op.key
    notes = "; ".join(case.notes())
    return (case.name, case.word, "pass" if case.passed else "FAIL", first, tokens, eos, worst, notes)


class GateWindow(QMainWindow):
    def __init__(self, gate: GateResult, settings: ViewerSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.gate = gate
        self.settings = settings
        self.opened: list[MainWindow] = []
        """The case windows opened from here, kept alive while they are open."""
        self.setObjectName("ParityXrayGateWindow")
        self.setWindowTitle(f"Parity X-ray gate: {gate.manifest}")
        central = QWidget()
        layout = QVBoxLayout(central)
        self.headline = QLabel(f"<b>{escape(gate.headline)}</b> (exit {gate.exit_code})")
        self.headline.setTextFormat(Qt.TextFormat.RichText)
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.headline.setWordWrap(True)
        layout.addWidget(self.headline)
        layout.addWidget(plain_label(f"judged on {gate.cluster} in {gate.seconds:.1f} s, finished {gate.created}; double-click or Enter opens a case"))
        self.table = QTableWidget(len(gate.cases), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        for row, case in enumerate(gate.cases):
            for column, text in enumerate(case_cells(case)):
                item = QTableWidgetItem(text)
                item.setToolTip(plain_tip(text))
                if column == VERDICT_COLUMN:
                    item.setBackground(QColor(WORD_COLOURS.get(case.word, WORD_COLOURS[UNUSABLE])))
                    item.setForeground(QColor("white"))
                self.table.setItem(row, column, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        # Qt activates an item on Enter/Return and on double-click (single click where the style says so).
        self.table.activated.connect(lambda index: self.open_case(index.row()))
        layout.addWidget(self.table)
        self.setCentralWidget(central)
        self.resize(1200, 600)
        if gate.cases:
            self.table.selectRow(0)

    def open_case(self, row: int) -> MainWindow | None:
        """The case's pair in a main window of its own, compared as the gate judged it (`_as_judged`)."""
        if not 0 <= row < len(self.gate.cases):
            return None
        case = self.gate.cases[row]
        window = MainWindow(self.settings)
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.opened.append(window)
        window.destroyed.connect(lambda _=None, w=window: self.opened.remove(w) if w in self.opened else None)
        window.show()
        _as_judged(window, case)
        window.open_pair(case.native, case.oracle)
        return window


def _as_judged(window: MainWindow, case: CaseResult) -> None:
    """Compare the case's pair as the gate judged it (its token budget, tolerance, policy file,
    pairing and profiles, built-in or files), with the gate's own judgment in a banner. With the viewer's
    defaults, a case the gate passed under a policy read SIGNED-ZERO-ONLY, and one judged over 2
    token steps counted the differing ops of every step, with nothing on screen saying why.
    They are the window's starting point for this pair only, not the session's choices: a
    tolerance or pairing the user sets wins, and closing asks to save nothing they did not do."""
    budget = case.tokens.budget if case.tokens is not None else None
    tolerance = case.tolerance
    try:
        policy = load_policy(case.tolerance_policy) if case.tolerance_policy else None
    except PolicyError as exc:
        window.banners.show_message("gate-policy", "error", f"The gate's tolerance policy cannot be read now, so the case is compared without it: {exc}")
        policy = None
    builtins = builtin_profiles()
    options = replace(
        VIEWER_OPTIONS, max_steps=budget, atol=tolerance.atol, rtol=tolerance.rtol, max_ulp=tolerance.max_ulp, policy=policy,
        alignment=case.alignment or AUTO,
        native_profile=case.native_profile_file or (case.native_profile if case.native_profile in builtins else None),
        oracle_profile=case.oracle_profile_file or (case.oracle_profile if case.oracle_profile in builtins else None),
    )
    window.judged_by_gate = GateJudged((Path(case.native).absolute(), Path(case.oracle).absolute()), options, f"{case.judgment()}, and compared so here.")
