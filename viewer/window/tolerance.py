"""The tolerance in the window: what the shown verdict was judged with, and a dialog to change it.

A verdict means nothing without its tolerance, so the status bar always names it (and a click
changes it). The dialog takes what `report --atol/--rtol/--max-ulp --tolerance-policy` takes,
and only collects and checks: a policy file is read with the same loader the CLI uses
(`load_policy`), so a file the CLI would refuse is refused here with the same message, naming
the file and the problem, and the dialog stays open to fix it. Accepting emits the choice;
the window's session part records it and compares again.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from sessions.compare.tolerance_bounds import MAX_ULP
from sessions.compare.tolerance_policy import load_policy
from sessions.investigation.model import SavedTolerance
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.widgets.plain_text import plain_label, plain_tip

ERROR_STYLE = "color: #d64541;"


def _bound_text(value: float) -> str:
    return "" if not value else f"{value:g}"


class ToleranceIndicator(QToolButton):
    """The tolerance the shown comparison was judged with, in the status bar; a click asks to change it."""

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.setObjectName("toleranceIndicator")
        self.setAutoRaise(True)
        model.comparison_changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        viewed = self._model.comparison
        self.setText(cv.tolerance_label(viewed))
        self.setToolTip(plain_tip(cv.tolerance_tooltip(viewed)))


class ToleranceDialog(QDialog):
    chosen = Signal(object, object)
    """(SavedTolerance, policy Path or None): what the user accepted, already checked."""

    def __init__(self, tolerance: SavedTolerance, policy: Path | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tolerance = tolerance
        self.setWindowTitle("Tolerance")
        layout = QVBoxLayout(self)
        intro = QLabel(
            "By default every op must be bit-exact. A tolerance never hides a difference: bits and ULP steps are "
            "always counted and shown; it only decides whether a difference fails (within-tolerance). "
            "A policy file's rules (docs/tolerance-policy.md) win over these bounds for the ops they name. "
            "The same as <code>report --atol --rtol --max-ulp --tolerance-policy</code>."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        self.atol = QLineEdit(_bound_text(tolerance.atol))
        self.rtol = QLineEdit(_bound_text(tolerance.rtol))
        for field, example in ((self.atol, "1e-3"), (self.rtol, "1e-2")):
            field.setPlaceholderText(f"not set (e.g. {example})")
            field.setClearButtonEnabled(True)
        # A text field, not a spin box: a spin box stops at 2^31 - 1, and a float32 element can be
        # 4 billion steps off (a session's max ULP goes to 2^63 - 1, as `report --max-ulp` does).
        self.max_ulp = QLineEdit(str(tolerance.max_ulp) if tolerance.max_ulp else "")
        self.max_ulp.setPlaceholderText("not set (e.g. 2)")
        self.max_ulp.setClearButtonEnabled(True)
        self.max_ulp.setToolTip("Largest ULP distance (representable steps) an element may be off by")
        form.addRow("atol (absolute)", self.atol)
        form.addRow("rtol (relative)", self.rtol)
        form.addRow("max ULP error", self.max_ulp)
        policy_row = QHBoxLayout()
        self.policy = QLineEdit("" if policy is None else str(policy))
        self.policy.setPlaceholderText("none: the bounds above apply to every op")
        self.browse = QPushButton("Choose…")
        self.browse.clicked.connect(self._browse)
        self.clear_policy = QPushButton("Clear")
        self.clear_policy.setToolTip("Compare without a policy file")
        self.clear_policy.clicked.connect(self.policy.clear)
        policy_row.addWidget(self.policy, 1)
        policy_row.addWidget(self.browse)
        policy_row.addWidget(self.clear_policy)
        form.addRow("policy file (TOML)", policy_row)
        layout.addLayout(form)
        self.error = plain_label()
        self.error.setObjectName("toleranceError")
        self.error.setStyleSheet(ERROR_STYLE)
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setVisible(False)
        layout.addWidget(self.error)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Compare again")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.resize(620, self.sizeHint().height())

    def _browse(self) -> None:
        start = self.policy.text() or str(Path.cwd())
        name, _ = QFileDialog.getOpenFileName(self, "Tolerance policy", start, "Tolerance policies (*.toml);;All files (*)")
        if name:
            self.policy.setText(name)

    def _bound(self, field: QLineEdit, name: str) -> float:
        text = field.text().strip()
        if not text:
            return 0.0
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a number >= 0 (e.g. 1e-3), not {text!r}")
        return value

    def _max_ulp(self) -> int:
        text = self.max_ulp.text().strip().replace(",", "")
        if not text:
            return 0
        if not (text.isascii() and text.isdigit() and len(text) <= 19) or int(text) > MAX_ULP:
            raise ValueError(f"max ULP error must be a whole number from 0 to {MAX_ULP:,}, not {self.max_ulp.text().strip()!r}")
        return int(text)

    def accept(self) -> None:
        """Emit the choice once every field and the policy file check out; otherwise say what is wrong and stay open."""
        try:
            tolerance = replace(self._tolerance, atol=self._bound(self.atol, "atol"), rtol=self._bound(self.rtol, "rtol"), max_ulp=self._max_ulp())
            text = self.policy.text().strip()
            policy = Path(text).expanduser().absolute() if text else None
            if policy is not None:
                load_policy(policy)
        except (ValueError, RuntimeError) as exc:  # a bad bound, a PolicyError naming the file and the problem, "~nosuchuser"
            self.error.setText(str(exc))
            self.error.setVisible(True)
            return
        self.chosen.emit(tolerance, policy)
        super().accept()
