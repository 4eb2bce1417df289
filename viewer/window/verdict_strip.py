"""The verdict strip: the comparison's word, its first finding and a way to go there, always visible.

A user must read the outcome in five seconds without choosing a tab; the strip reads the one
verdict model (sessions.compare.verdict), the same object `report` prints, so the window and
the CLI cannot disagree. Its tooltip names the tolerance the verdict was judged with (the status
bar always shows it).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton, QWidget

from sessions.capture.opening import unfinished
from sessions.compare.verdict import UNUSABLE, Kind
from sessions.report.word_colours import WORD_COLOURS
from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.widgets.plain_text import plain_label, plain_tip

COMPARING = "#5f6773"


class VerdictStrip(QFrame):
    go_requested = Signal()
    """The user asked to see the first finding (the same as Ctrl+J)."""

    def __init__(self, model: PairModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.setObjectName("verdictStrip")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        layout.setSpacing(14)
        self.word = plain_label()
        self.word.setObjectName("verdictWord")
        self.detail = plain_label()
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.go = QPushButton("Go to it (Ctrl+J)")
        self.go.clicked.connect(self.go_requested)
        layout.addWidget(self.word)
        layout.addWidget(self.detail, 1)
        layout.addWidget(self.go)
        policy = self.go.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.go.setSizePolicy(policy)
        # Set once the children exist: the style change it sends measures them (`_hold_height`).
        self.setStyleSheet(
            "".join(f'QFrame#verdictStrip[tone="{tone.lstrip("#")}"] {{ background: {tone}; }}' for tone in (COMPARING, *WORD_COLOURS.values()))
            + "QFrame#verdictStrip QLabel { color: #ffffff; background: transparent; border: none; }"
            "QFrame#verdictStrip QLabel#verdictWord { font-size: 16pt; font-weight: bold; }"
            "QFrame#verdictStrip QPushButton { color: #1b1f24; background: #ffffff; border-radius: 3px; padding: 3px 10px; }"
        )
        model.comparison_changed.connect(self.refresh)
        model.captures_changed.connect(self.refresh)
        self.refresh()

    def event(self, event: QEvent) -> bool:
        handled = super().event(event)
        if event.type() in (QEvent.Type.Polish, QEvent.Type.StyleChange):
            self._hold_height()
        return handled

    def _hold_height(self) -> None:
        """One height whatever the strip says: room for two lines of detail and the button, whose
        place is kept while it is hidden so the detail wraps the same. When a verdict's button
        or second line made the strip grow, every panel below was resized and every plot redrawn
        in the comparison's arrival (7 px at 1440x900: 10 ms of relayout, then each plot's axes
        made again in the next paint). Measured once styled (the window's style sheet sizes the
        button), and again when the style changes (a theme)."""
        shown = self.detail.text()
        self.detail.setText("two\nlines")
        two_lines = self.detail.sizeHint().height()
        self.detail.setText(shown)
        margins = self.layout().contentsMargins()
        content = max(two_lines, self.go.sizeHint().height(), self.word.sizeHint().height())
        self.setMinimumHeight(content + margins.top() + margins.bottom())

    def refresh(self) -> None:
        viewed = self._model.comparison
        if viewed is None:
            self._paint(*self._waiting(), COMPARING)
            self.go.setVisible(False)
            return
        refusal = unfinished(self._model.native, self._model.oracle)
        if refusal is not None:
            self.show_unusable(f"{refusal}: no verdict, as report gives none; what it holds is compared below")
            return
        verdict = viewed.comparison.verdict
        first = verdict.first
        if first is None:
            detail = verdict.headline.split(": ", 1)[1]
        else:
            of = verdict.first_of()
            detail = f"first {first.kind} at {first.key}" + (f" (of {of:,})" if of > 1 else "")
            if first.kind != Kind.CONTRACT_MISMATCH:
                detail += f": {first.detail}"  # a contract finding has its own card with both contracts
            others = verdict.reasons_besides_first()
            if others:
                detail += f"  ·  also: {'; '.join(others)}"
        alignment = viewed.comparison.alignment
        if not alignment.is_plain:
            detail += f"  ·  aligned {alignment.short()}"
        self._paint(verdict.word, detail, WORD_COLOURS[verdict.word])
        tip = [detail] + ([first.detail] if first is not None else []) + ([f"aligned {alignment.words()}"] if not alignment.is_plain else [])
        self.detail.setToolTip(plain_tip("\n".join([*tip, cv.tolerance_tooltip(viewed)])))
        self.go.setVisible(first is not None)

    def _waiting(self) -> tuple[str, str]:
        """What the strip says before there is a verdict. Shown from the start, so the panels
        below keep one height when a pair opens (a strip appearing then resized and redrew
        every plot: ~100 ms of the first paint)."""
        if self._model.has_pair and self._model.not_compared is not None:
            return "Not compared", f"{self._model.not_compared}; open the pair again, or swap roles, to compare it"
        if self._model.has_pair:
            return self._model.waiting(), ""
        if self._model.native is not None or self._model.oracle is not None:
            return "One capture open", "open the other run's capture to compare the two (Ctrl+O)"
        return "No pair open", "the verdict shows here once a native and an oracle capture are open"

    def show_unusable(self, message: str) -> None:
        """An input that cannot be read: the same word `report` uses for exit 2."""
        self._paint(UNUSABLE, message, WORD_COLOURS[UNUSABLE])
        self.go.setVisible(False)

    def _paint(self, word: str, detail: str, colour: str) -> None:
        self.word.setText(word)
        self.detail.setText(detail)
        self.detail.setToolTip(plain_tip(detail))
        # One style sheet with a rule per colour, set once; a new sheet per verdict re-parsed and
        # restyled the strip and its children (10 ms of a real model's comparison's arrival).
        self.setProperty("tone", colour.lstrip("#"))
        self.style().unpolish(self)
        self.style().polish(self)

