"""Where the window goes among a comparison's findings, and what it says of them.

On arrival it selects the first finding (a pair, or a record without a partner); Ctrl+J goes
there again, on the tab that shows it; F8 and Shift+F8 step through the ops that differ. What
it says in the status bar is about the comparison shown, so it is taken down when another
replaces it: the old first finding read beside a new verdict that had none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QMainWindow

from viewer import comparison_view as cv
from viewer.pair_model import PairModel
from viewer.panels.token_table import TokenTable
from viewer.tree.alignment_tree import AlignmentTree


class FindingSteps:
    """The window's moves to findings; `show_tab` brings a tab up by its name, `current_tab` names the one up."""

    def __init__(
        self, window: QMainWindow, model: PairModel, tree: AlignmentTree, token_table: TokenTable, show_tab: Callable[[str], None], current_tab: Callable[[], str]
    ) -> None:
        self._window = window
        self._current_tab = current_tab
        self._model = model
        self._tree = tree
        self._token_table = token_table
        self._show_tab = show_tab
        self._said: set[str] = set()
        """Status lines about the comparison shown now (`_say`)."""

    def forget(self) -> None:
        """Take down what was said of the last comparison."""
        status = self._window.statusBar()
        if status.currentMessage() in self._said:
            status.clearMessage()
        self._said = set()

    def arrive(self, comparison: Any) -> None:
        """Select `comparison`'s first finding (else its first pair) once the window has painted it."""
        record = cv.first_finding_record(comparison)
        if record is not None:
            # The first finding is a record without a partner: arrive on its row, not on a bit-exact op.
            QTimer.singleShot(1, self._window, lambda: self._reveal_arrived(comparison, record))
            return
        target = cv.first_finding_pair(comparison) or cv.first_pair(comparison)
        if target is not None:
            # On a timer of its own, not in this turn nor a posted event: the window first paints
            # the verdict and tree and answers input, then the tensors load (together they held
            # it ~200 ms on a 240k-record pair). A selection made meanwhile (a restored session's) wins;
            # the window is the timer's context, so closing it meanwhile cancels the timer.
            QTimer.singleShot(1, self._window, lambda: self._select_arrived(comparison, target))

    def _select_arrived(self, comparison: Any, target: Any) -> None:
        if self._model.comparison is comparison and self._model.selected is None:
            self._model.select(target)
            first = cv.first_finding(comparison)
            if first is not None and self._current_tab() == "Tensor diff" and cv.evidence_tab(first) != "Tensor diff":
                # A dispatch-only or token finding: its op's tensors are bit-exact, and the window
                # opened on a green "bit-exact" map and "no differing elements" beside the verdict.
                self._show_tab(cv.evidence_tab(first))

    def _reveal_arrived(self, comparison: Any, record: Any) -> None:
        if self._model.comparison is comparison and self._model.selected is None:
            self._tree.reveal_unaligned(record, past_filter=False)

    def jump_to_first(self) -> None:
        """Ctrl+J: the verdict's first finding, whatever its kind -- the same place the CLI names."""
        comparison = self._model.comparison
        if comparison is None:
            self._say(self._model.waiting() if self._model.has_pair else "Open a pair first.")
            return
        first = cv.first_finding(comparison)
        if first is None:
            self._say(cv.headline(comparison))
            return
        pair = cv.first_finding_pair(comparison)
        record = cv.first_finding_record(comparison)
        tab = cv.evidence_tab(first)
        if pair is not None:
            self._model.select(pair)
            self._tree.reveal(pair)  # also when already selected, under a filter that hides its row
        elif record is not None:
            self._tree.reveal_unaligned(record)
        if pair is not None or tab != "Tensor diff":
            # The tab that shows the finding: a token step's or a dispatch difference's op may be
            # bit-exact (or unrecorded), and Tensor diff said "bit-exact" in green beside a DIVERGENCE verdict.
            self._show_tab(tab)
        if tab == "Token parity":
            self._token_table.show_step(first.key.step)
        self._say(f"First {first.kind} at {first.key}: {first.detail}")

    def step(self, direction: int) -> None:
        """F8 (+1) and Shift+F8 (-1): the next or previous op that differs."""
        comparison = self._model.comparison
        if comparison is None:
            self._say(self._model.waiting() if self._model.has_pair else "Open a pair first.")
            return
        # Under a filter, the ops it shows: stepping to one it hid cleared the filter the user typed.
        text = self._tree.filter.text()
        among = cv.stepped_under_filter(comparison, text, self._model.locality) if text else None
        target = cv.neighbour_divergence(comparison, self._model.selected, direction, among)
        while target is not None and among is not None and not self._tree.shows(target):
            target = cv.neighbour_divergence(comparison, target, direction, among)  # text across cells: no cell of its row holds it
        if target is not None:
            self._model.select(target)
            # Said at every step: the last line (Ctrl+J's finding, "no differing op after this one") stayed up beside another op.
            which, of = cv.stepped_place(comparison, target)
            shown = f"; {len(among):,} of them shown by the filter" if among is not None else ""
            self._say(f"{target.key}: {target.verdict} (op {which:,} of the {of:,} that are not bit-exact{shown})")
        elif among is not None and comparison.stepped:
            self._say(f"No differing op the filter shows {'after' if direction > 0 else 'before'} this one (“{text}”).")
        elif not comparison.stepped:
            first = comparison.comparison.verdict.first
            # Under a DIVERGENCE of records without a partner it read as if nothing were wrong.
            elsewhere = "" if first is None else f"; the first finding, {first.kind} at {first.key}, is {cv.finding_place(first)} (Ctrl+J)"
            self._say(f"No op differs before any shared EOS: nothing to step through{elsewhere}.")
        else:
            self._say(f"No differing op {'after' if direction > 0 else 'before'} this one.")  # F8 at either end did nothing

    def _say(self, text: str) -> None:
        """A status line about the comparison shown now, taken down when another replaces it."""
        self._said.add(text)
        self._window.statusBar().showMessage(text, 8000)
