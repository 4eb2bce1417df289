"""Showing a `Progress` on a QProgressBar.

Progress counts whatever the work counts -- bytes of a comparison run past 2^31 on any
multi-GB pair, and QProgressBar takes a 32-bit int -- so the bar shows the fraction done.
"""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from sessions.progress import Progress

STEPS = 1000


def show_progress(bar: QProgressBar, progress: Progress, text: str) -> None:
    """`text` may use QProgressBar's %p (percent) placeholder.

    The bar is drawn with the window's next paint, not at once: QProgressBar repaints itself on
    each new value, and a repaint draws everything waiting to be drawn in its window. While a pair
    opened, each progress step drew the heatmaps and plots again, outside the paint that would
    have drawn them once (17 ms of one step, several steps a second)."""
    bar.setUpdatesEnabled(False)
    try:
        bar.setRange(0, STEPS)
        bar.setValue(round(min(1.0, max(0.0, progress.fraction)) * STEPS))
        bar.setFormat(text)
    finally:
        bar.setUpdatesEnabled(True)
