"""The progress unit every long-running generator yields, so any caller can show and cancel it."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

from sessions.ctrl_c import raise_if_pressed

T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    label: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


ProgressGenerator = Generator[Progress, None, T]
"""Yields progress, returns its result; closing it early is cancellation."""


def run_to_end(work: "ProgressGenerator[T]") -> T:
    """Drive a progress generator without showing progress (headless callers, tests); a Ctrl-C
    whose KeyboardInterrupt was lost stops it at its next step (sessions.ctrl_c)."""
    while True:
        try:
            next(work)
        except StopIteration as stop:
            return stop.value
        raise_if_pressed()
