"""Every uncaught error becomes an error banner in the window and a traceback on stderr.

Qt calls Python slots from its event loop; an exception escaping one goes to `sys.excepthook`,
and the default hook only prints it. Someone using the desktop app never sees stderr, so the
click "did nothing" -- a silent failure, the worst outcome for a tool people trust with a
verdict. This hook keeps the window running, says in it what failed (the one-line message; the
traceback in the banner's tooltip and behind "Copy details"), and still logs it to stderr.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from PySide6.QtWidgets import QApplication

from viewer.widgets.banner import BannerArea
from viewer.widgets.plain_text import plain_tip

GROUP = "uncaught"
ExceptHook = Callable[[type[BaseException], BaseException, "TracebackType | None"], Any]


def one_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


class UncaughtErrors:
    """The process's hook: shows each error in the active window's banners (else the newest shown window's)."""

    def __init__(self) -> None:
        self._areas: list[BannerArea] = []
        self._previous: ExceptHook = sys.__excepthook__

    def watch(self, banners: BannerArea) -> None:
        self._areas.append(banners)
        banners.destroyed.connect(lambda _=None, b=banners: self._areas.remove(b) if b in self._areas else None)
        if sys.excepthook != self.hook:  # a bound method is a new object each time it is looked up: `is not` was always true
            self._previous = sys.excepthook
            sys.excepthook = self.hook

    def hook(self, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        details = "".join(traceback.format_exception(kind, error, tb))
        sys.stderr.write(f"Parity X-ray: uncaught error\n{details}")
        sys.stderr.flush()
        banners = self._target()
        if banners is not None:
            self._show(banners, error, details)
        if self._previous is not sys.__excepthook__:
            self._previous(kind, error, tb)  # another hook (a debugger, a test harness) still sees it

    def _target(self) -> BannerArea | None:
        shown = [b for b in self._areas if b.window().isVisible()]
        active = QApplication.activeWindow()
        return next((b for b in shown if b.window() is active), shown[-1] if shown else None)

    @staticmethod
    def _show(banners: BannerArea, error: BaseException, details: str) -> None:
        text = f"Unexpected error: {one_line(error)}"
        if text in banners.texts(GROUP):
            return
        banner = banners.show_message(GROUP, "error", text, actions=[("Copy details", lambda: _copy(details))])
        banner.label.setToolTip(plain_tip(details))
        banner.setToolTip(plain_tip(details))


def _copy(text: str) -> None:
    clipboard = QApplication.clipboard()
    if clipboard is not None:
        clipboard.setText(text)


_HOOK = UncaughtErrors()


def show_uncaught_errors_in(banners: BannerArea) -> None:
    """Install the hook (once per process) and let it show errors in these banners."""
    _HOOK.watch(banners)
