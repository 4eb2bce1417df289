"""`parity-xray validate [--deep] FILE...`: every problem of every capture, with where it is.

Files are checked in child processes (`sessions.capture.structure_check`; small files in batches,
one child after another), so one file that crashes or hangs libhdf5 is reported and the others
are still checked. A file is valid when it
has no problem and its writer finished it. The plain check reads metadata only; `--deep` also
reads every tensor's data there, so exit 0 then means `report` can read the file. Exit status:
0 when every file is valid, 2 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

from sessions.capture.hdf5_safety import (
    CHECK_TIMEOUT_ENV,
    CHECK_TIMEOUT_S,
    DEFAULT_MEMORY_BUDGET,
    Problem,
)
from sessions.capture.structure_check import CheckReport, iter_check_files
from sessions.commands.arguments import non_empty, seconds, whole_number
from sessions.printable import printable
from sessions.side_file import regular_file_problem

EXIT_VALID = 0
EXIT_INVALID = 2
MAX_MEMORY_BUDGET = 2**62
"""The largest --memory-budget: the checking process holds budgets as 64-bit integers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=non_empty, metavar="FILE", help="capture files (.h5)")
    parser.add_argument(
        "--memory-budget",
        type=whole_number(1, MAX_MEMORY_BUDGET),
        default=DEFAULT_MEMORY_BUDGET,
        metavar="BYTES",
        help=f"largest read one dataset may need (default {DEFAULT_MEMORY_BUDGET})",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=CHECK_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time allowed to check one file (default {CHECK_TIMEOUT_S:g}, or ${CHECK_TIMEOUT_ENV})",
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also read every tensor's data (bounded, in the checking process), so valid means readable",
    )


def validate_files(paths: list[Path], memory_budget: int, timeout_s: float, deep: bool = False) -> Iterator[tuple[Path, CheckReport]]:
    """Each file's report, in order, with an unfinished file counted as a problem (it cannot be trusted as a whole)."""
    at = 0
    while at < len(paths):
        shown = regular_file_problem(paths[at])
        if shown is not None:
            yield paths[at], CheckReport([Problem("file", shown)])
            at += 1
            continue
        files = list(itertools.takewhile(lambda path: regular_file_problem(path) is None, paths[at:]))
        for path, report in iter_check_files(files, memory_budget=memory_budget, timeout_s=timeout_s, deep=deep):
            if report.contents and not report.complete:
                report.problems.insert(0, Problem("/ attribute 'complete'", "is not 1: " + report.contents))
            yield path, report
        at += len(files)


def validate_file(path: Path, memory_budget: int, timeout_s: float, deep: bool = False) -> CheckReport:
    """One file's report, as `validate_files` gives it."""
    with contextlib.closing(validate_files([path], memory_budget, timeout_s, deep)) as reports:
        return next(reports)[1]


def run(args: argparse.Namespace) -> int:
    status = EXIT_VALID
    for path, report in validate_files([Path(file) for file in args.files], args.memory_budget, args.timeout, args.deep):
        if not report.finished:
            status = EXIT_INVALID  # not shown valid; its words blame the time allowed, not the file ("invalid (1 problem)" did)
            print(f"{printable(str(path))}: not checked")
            for problem in report.problems:
                print(f"  {problem.location}: {problem.problem}")
        elif report.problems:
            status = EXIT_INVALID
            count = len(report.problems)
            print(f"{printable(str(path))}: invalid ({count} problem{'s' if count != 1 else ''})")
            for problem in report.problems:
                print(f"  {problem.location}: {problem.problem}")
        else:
            print(f"{printable(str(path))}: valid ({report.contents})")
    return status
