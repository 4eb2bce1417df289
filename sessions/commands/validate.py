"""`parity-xray validate FILE...`: every problem of every capture, with where it is.

Each file is checked in its own child process (`sessions.capture.structure_check`), so one file that
crashes or hangs libhdf5 is reported and the others are still checked. A file is valid when it
has no problem and its writer finished it. Exit status: 0 when every file is valid, 2 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sessions.capture.hdf5_safety import CHECK_TIMEOUT_S, DEFAULT_MEMORY_BUDGET, Problem
from sessions.capture.structure_check import CheckReport, check_in_child

EXIT_VALID = 0
EXIT_INVALID = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="capture files (.h5)")
    parser.add_argument(
        "--memory-budget",
        type=int,
        default=DEFAULT_MEMORY_BUDGET,
        metavar="BYTES",
        help=f"largest read one dataset may need (default {DEFAULT_MEMORY_BUDGET})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=CHECK_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time allowed to check one file (default {CHECK_TIMEOUT_S:g})",
    )


def validate_file(path: Path, memory_budget: int, timeout_s: float) -> CheckReport:
    """The child's report, with an unfinished file counted as a problem (it cannot be trusted as a whole)."""
    if not path.is_file():
        return CheckReport([Problem("file", "does not exist" if not path.exists() else "is not a regular file")])
    report = check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s)
    if report.contents and not report.complete:
        report.problems.insert(0, Problem("/ attribute 'complete'", "not set: " + report.contents))
    return report


def run(args: argparse.Namespace) -> int:
    status = EXIT_VALID
    for path in args.files:
        report = validate_file(path, args.memory_budget, args.timeout)
        if report.problems:
            status = EXIT_INVALID
            count = len(report.problems)
            print(f"{path}: invalid ({count} problem{'s' if count != 1 else ''})")
            for problem in report.problems:
                print(f"  {problem.location}: {problem.problem}")
        else:
            print(f"{path}: valid ({report.contents})")
    return status
