"""Compare ▸ Pair records: how the window pairs records, the modes of `report --align`.

The choice belongs to the session (`Investigation.alignment_mode`), so `report --session` pairs
as the window did; the menu only shows it and asks the session sync to change it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QWidget

from sessions.compare.align_modes import AUTO, CALLS, POSITIONS

ALIGNMENT_CHOICES = (
    (
        AUTO,
        "&Automatically",
        "By the same forward calls when both runs made them, else by token position when both recorded positions or their prompts "
        "are equally long, else by calls (report's default)",
    ),
    (CALLS, "By the same &calls", "Pair records of the same forward calls, as `report --align calls`"),
    (
        POSITIONS,
        "By token &position",
        "Pair records by token position, as `report --align positions`: attention calls are compared only where the runs were cut alike",
    ),
)


class PairingMenu(QActionGroup):
    """One checkable action per mode, exclusive, in `menu`; `choose(mode)` records a choice."""

    def __init__(self, menu: QMenu, choose: Callable[[str], None], parent: QWidget) -> None:
        super().__init__(parent)
        pairing = menu.addMenu("&Pair records")
        pairing.setToolTipsVisible(True)
        for mode, text, tip in ALIGNMENT_CHOICES:
            action = QAction(text, parent)
            action.setToolTip(tip)
            action.setStatusTip(tip)
            action.setCheckable(True)
            action.setData(mode)
            action.triggered.connect(lambda _=False, mode=mode: choose(mode))
            self.addAction(action)
            pairing.addAction(action)

    def show_mode(self, mode: str) -> None:
        """Check the session's mode (a session opened may bring its own)."""
        for action in self.actions():
            action.setChecked(action.data() == mode)
