"""Ctrl-C in the terminal that started the viewer closes it, as the window's close button does.

Python runs its signal handlers only between bytecodes, and a Qt event loop waiting for input
runs none: Ctrl-C raised KeyboardInterrupt inside whichever slot ran next (an autosave tick),
which the viewer showed as an uncaught error, and it kept running. A handler that asks the
window to close (unsaved work is asked about, as on any close) and a timer that lets Python run
it while Qt waits make Ctrl-C do what a terminal user expects.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget

from sessions.ctrl_c import ctrl_c_is_pythons

WAKE_MS = 200
"""How often Python gets a turn to run a pending signal handler while Qt waits for input."""


@contextmanager
def closing_on_ctrl_c(window: QWidget) -> Iterator[None]:
    """Within: Ctrl-C closes `window` (nothing changes unless `ctrl_c_is_pythons`)."""
    if not ctrl_c_is_pythons():
        yield
        return

    def close(signum: int, frame: FrameType | None) -> None:
        QTimer.singleShot(0, window, window.close)

    previous = signal.signal(signal.SIGINT, close)
    wake = QTimer(window)
    wake.timeout.connect(_nothing)
    wake.start(WAKE_MS)
    try:
        yield
    finally:
        wake.stop()
        signal.signal(signal.SIGINT, previous)


def _nothing() -> None:
    """A turn of Python code, in which the interpreter runs any signal handler due."""
