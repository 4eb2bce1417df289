"""Showing a `Progress` on a QProgressBar.

Progress counts whatever the work counts -- bytes of a comparison run past 2^31 on any
multi-GB pair, and QProgressBar takes a 32-bit int -- so the bar shows the fraction done.
"""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from sessions.progress import Progress

STEPS = 1000


def show_progress(bar: QProgressBar, progress: Progress, text: str) -> None:
    """`text` may use QProgressBar's %p (percent) placeholder."""
    bar.setRange(0, STEPS)
    bar.setValue(round(min(1.0, max(0.0, progress.fraction)) * STEPS))
    bar.setFormat(text)
