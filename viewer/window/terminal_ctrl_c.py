"""Ctrl-C in the terminal that started the viewer closes it, as the window's close button does.

Python runs its signal handlers only between bytecodes, and a Qt event loop waiting for input
runs none: Ctrl-C raised KeyboardInterrupt inside whichever slot ran next (an autosave tick),
which the viewer showed as an uncaught error, and it kept running. A handler that asks the
window to close (unsaved work is asked about, as on any close) and a timer that lets Python run
it while Qt waits make Ctrl-C do what a terminal user expects. SIGTERM (`kill`) closes it the
same way: `parity-xray demo` opens the window from a command, whose SIGTERM handler raised inside
a slot and showed an uncaught error.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget

WAKE_MS = 200
"""How often Python gets a turn to run a pending signal handler while Qt waits for input."""


@contextmanager
def closing_on_ctrl_c(window: QWidget) -> Iterator[None]:
    """Within: Ctrl-C or SIGTERM closes `window`, from the main thread, unless the signal is
    ignored (a viewer started in the background of a shell keeps ignoring Ctrl-C). Taken over
    from Python or from the command that opened the window (`sessions.ctrl_c.ctrl_c_kept`)."""
    taken = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    if threading.current_thread() is not threading.main_thread() or not taken:
        yield
        return

    def close(signum: int, frame: FrameType | None) -> None:
        QTimer.singleShot(0, window, window.close)

    previous = {signum: signal.signal(signum, close) for signum in taken}
    wake = QTimer(window)
    wake.timeout.connect(_nothing)
    wake.start(WAKE_MS)
    try:
        yield
    finally:
        wake.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _nothing() -> None:
    """A turn of Python code, in which the interpreter runs any signal handler due."""
