"""Command-line values checked where they are parsed: a bad one is refused with exit 2 and one line.

argparse's own `type=float` lets through values no comparison can use: a negative or NaN
tolerance (`--rtol -1` reported a signed-zero pair as PARITY with exit 0) or a negative ULP
bound (a traceback, exit 1, read by CI as a divergence).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from sessions.compare.align_modes import ALIGN_MODES


def tolerance_bound(text: str) -> float:
    """An absolute or relative tolerance: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text}")
    return value


def whole_number(minimum: int) -> Callable[[str], int]:
    """A whole number of at least `minimum` (a count of ULPs, workers, ops to list)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, not {value}")
        return value

    return parse


def add_align_argument(parser: argparse.ArgumentParser) -> None:
    """`--align`, alike on every command that aligns a pair: `rerun` and `diagnose` must find the
    op keys `report` printed, and a key made by position exists only under that alignment."""
    parser.add_argument(
        "--align", choices=ALIGN_MODES, default="auto",
        help="pair records by the same forward calls, or by token position when the runs were cut differently (default: auto; docs/profiles.md)",
    )
