"""Ctrl-C (or SIGTERM) in a headless command: it stops the command, whatever Python code was running when it came.

Python raises KeyboardInterrupt in whichever frame runs when the signal is handled. When that
frame is a weakref callback or a finalizer (h5py and numpy run many), the exception is printed
as "Exception ignored in ..." with a traceback, and lost: `record mlx` runs of 4,000 steps,
interrupted early, went on to the end and said they had recorded the run (2 of 60 interrupts).
So a Ctrl-C is also kept as a flag, every progress step of a command's work asks for it
(`raise_if_pressed`), and the lost exception's traceback is not printed.

SIGTERM (a CI job's time limit, `kill`) stops a command the same way, as `Terminated`: it
killed the process outright, so a gate's Dask cluster left "leaked semaphore" warnings behind
and no command could say what it had and had not done.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from types import FrameType
from typing import TypeVar

EXIT_INTERRUPTED = 130
"""The shell's code for a command ended by Ctrl-C (128 + SIGINT)."""
EXIT_TERMINATED = 143
"""The shell's code for a command ended by SIGTERM (128 + SIGTERM)."""


Started = TypeVar("Started")


class Terminated(KeyboardInterrupt):
    """SIGTERM: every handler of Ctrl-C stops the command the same way, and says which it was."""


_pressed = threading.Event()
_terminated = threading.Event()


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _pressed.set()
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _pressed.set()
    _terminated.set()
    raise Terminated


def exit_code_of(stop: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM."""
    return EXIT_TERMINATED if isinstance(stop, Terminated) or _terminated.is_set() else EXIT_INTERRUPTED


def said(stop: KeyboardInterrupt, ctrl_c: str = "interrupted by Ctrl-C") -> str:
    """What stopped the command, for its one line: `ctrl_c`, in the command's own words, or SIGTERM."""
    return "stopped by SIGTERM" if exit_code_of(stop) == EXIT_TERMINATED else ctrl_c


def ctrl_c_is_pythons() -> bool:
    """Whether this thread may take Ctrl-C over: the main thread, with Python's own handler. A
    process started in the background of a shell has SIGINT ignored, and keeps ignoring it."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler


@contextmanager
def ctrl_c_kept() -> Iterator[None]:
    """Within: a Ctrl-C raises KeyboardInterrupt as usual and is also kept for `raise_if_pressed`
    (only where `ctrl_c_is_pythons`), and a SIGTERM raises Terminated (where nothing else handles
    it). A background job keeps ignoring Ctrl-C, and still stops on SIGTERM as a command should:
    taking neither there, an import killed by a CI time limit left its partial file and said nothing."""
    main = threading.current_thread() is threading.main_thread()
    take_ctrl_c = ctrl_c_is_pythons()
    take_term = main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if not take_ctrl_c and not take_term:
        yield
        return
    _pressed.clear()
    _terminated.clear()
    previous = signal.signal(signal.SIGINT, _on_ctrl_c) if take_ctrl_c else None
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm) if take_term else None
    previous_hook = sys.unraisablehook

    def hook(unraisable: "sys.UnraisableHookArgs") -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        sys.unraisablehook = previous_hook
        _pressed.clear()


@contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Within: a Ctrl-C or SIGTERM is noted, not raised, and raised on leaving the block (also
    when the block fails: a terminal's Ctrl-C reaches the block's child processes too, and the
    error their end causes must read as the interrupt it is). For third-party start-up code that
    an exception leaves half-built: a Dask LocalCluster interrupted while its workers start is
    never closed, and Dask's own exit handler then fails on it with a traceback (3 of 7
    interrupts of a starting gate). A second signal is raised at once, so a start that hangs
    can still be stopped. Only in the main thread, and only for a signal Python or `ctrl_c_kept`
    handles: a background job keeps ignoring Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        if came:
            (_on_sigterm if signum == signal.SIGTERM else _on_ctrl_c)(signum, frame)
        came.append(signum)

    ours = (signal.default_int_handler, _on_ctrl_c, _on_sigterm, signal.SIG_DFL)
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    taken = {number: handler for number, handler in previous.items() if handler in ours}
    for number in taken:
        signal.signal(number, note)
    try:
        yield
    finally:
        for number, handler in taken.items():
            signal.signal(number, handler)
        if came:  # raised over an error the block ended with, which becomes its context
            (_on_sigterm if signal.SIGTERM in came else _on_ctrl_c)(came[0], None)


def raise_if_pressed() -> None:
    """KeyboardInterrupt (Terminated for SIGTERM) when one came within `ctrl_c_kept`: its own exception may have been lost."""
    if _terminated.is_set():
        raise Terminated
    if _pressed.is_set():
        raise KeyboardInterrupt


def started_out_of_ctrl_c_reach(start: Callable[[], Started]) -> Started:
    """`start()`, run in a thread that blocks SIGINT, while this thread waits for it and still
    takes Ctrl-C. The threads `start` starts inherit the block, and so do the processes those
    spawn: a terminal's Ctrl-C goes to every process of its foreground group, and each of a
    local gate's Dask worker processes printed its KeyboardInterrupt traceback (60 to 86 lines
    of stderr) above the gate's one line. The command still gets the Ctrl-C and stops them."""
    outcome: list[Started] = []
    failure: list[BaseException] = []

    def run() -> None:
        # multiprocessing's resource tracker, started by the first process spawned, unblocks
        # SIGINT in the thread that starts it (CPython 3.11 `ensure_running`): started first.
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            outcome.append(start())
        except BaseException as error:  # handed to the waiting thread, which raises it as its own
            failure.append(error)

    starter = threading.Thread(target=run, name="started out of Ctrl-C's reach", daemon=True)
    starter.start()
    while starter.is_alive():
        starter.join(0.05)  # a bounded join: this thread runs its signal handlers between waits
    if failure:
        raise failure[0]
    return outcome[0]
