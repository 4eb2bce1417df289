"""The offer to read every tensor of both open captures when one read failed.

A failed read may be one damaged chunk among many: the banner offers to read every tensor of
both files in the limited child (`validate --deep`), so the user learns all of it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sessions.capture.reader import Capture
from sessions.capture.structure_check import CheckReport, iter_deep_check
from viewer.widgets.banner import BannerArea
from viewer.workers import TaskSlots


class DeepCheck:
    """Offers the deep check in a banner, runs it off the UI thread, and says what it found."""

    def __init__(self, pair: Callable[[], tuple[Capture | None, Capture | None]], tasks: TaskSlots, banners: BannerArea) -> None:
        self._pair = pair
        self._tasks = tasks
        self._banners = banners

    def offer(self, group: str, message: str) -> None:
        self._banners.show_message(group, "error", message, actions=[("Check both files deeply", self.run)])

    def run(self) -> None:
        paths = [c.path for c in self._pair() if c is not None]
        self._tasks.submit(
            "deep-check",
            lambda: iter_deep_check(paths),
            on_success=self._checked,
            on_failure=lambda message: self._banners.show_message("deep-check", "error", f"The deep check could not run: {message}"),
        )

    def _checked(self, found: list[tuple[Path, CheckReport]]) -> None:
        self._banners.clear("deep-check")
        for path, report in found:
            if report.problems:
                first = report.problems[0]
                more = f" (and {len(report.problems) - 1} more problem(s); `parity-xray validate --deep` lists them all)" if len(report.problems) > 1 else ""
                self._banners.show_message("deep-check", "error", f"{path.name}: {first.location}: {first.problem}{more}")
            else:
                self._banners.show_message("deep-check", "info", f"{path.name}: every tensor reads back ({report.contents})")
