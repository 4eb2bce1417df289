"""Command-line values checked where they are parsed: a bad one is refused with exit 2 and one line.

argparse's own `type=float` lets through values no comparison can use: a negative or NaN
tolerance (`--rtol -1` reported a signed-zero pair as PARITY with exit 0) or a negative ULP
bound (a traceback, exit 1, read by CI as a divergence).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sessions.atomic_write import atomic_write_bytes
from sessions.compare.align_modes import ALIGN_MODES
from sessions.compare.tolerance_bounds import bound_problem, ulp_problem
from sessions.side_file import same_file


def _checked(text: str, convert: Callable[[str], float | int], problem_of: Callable[[object], str | None]) -> float | int:
    try:
        value = convert(text)
    except ValueError:
        # `--max-ulp 2.0` is a number, just not a whole one: say what the option takes.
        raise argparse.ArgumentTypeError(f"{problem_of(text) or 'must be a number'}, not {text}") from None
    problem = problem_of(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}, not {text}")
    return value


def tolerance_bound(text: str) -> float:
    """An absolute or relative tolerance (`bound_problem`)."""
    return float(_checked(text, float, bound_problem))


def ulp_bound(text: str) -> int:
    """A max_ulp tolerance (`ulp_problem`)."""
    return int(_checked(text, int, ulp_problem))


def whole_number(minimum: int) -> Callable[[str], int]:
    """A whole number of at least `minimum` (a count of workers, of ops to list)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, not {value}")
        return value

    return parse


def output_clash(outputs: Mapping[str, str | None], inputs: Mapping[str, str | Path | None]) -> str | None:
    """Why an output path may not be written: it names one of the inputs (`--json` given the
    oracle capture's path would replace the capture, or on an unusable input remove it), or
    another output (the JSON would silently replace the HTML)."""
    for option, output in outputs.items():
        for what, given in inputs.items():
            if output and given and same_file(output, given):
                return f"{option} {output} is the {what}: an output never replaces an input"
    named = [(option, output) for option, output in outputs.items() if output]
    for at, (option, output) in enumerate(named):
        for other, earlier in named[:at]:
            if same_file(output, earlier) or Path(output).resolve() == Path(earlier).resolve():
                return f"{other} and {option} both name {output}: each output needs a file of its own"
    return None


def capture_output_problem(option: str, path: str | Path | None) -> str | None:
    """Why a capture cannot be written at `path`, said before any work: it is a folder, or in a
    folder that is not there (the writer's error would name its hidden temporary file)."""
    if not path:
        return None
    path = Path(path)
    if path.is_dir():
        return f"{option} {path} is a folder; name the capture file"
    if not path.absolute().parent.is_dir():
        return f"{option} {path} is in {path.absolute().parent}, which is not a folder"
    return None


def write_outputs(outputs: Sequence[tuple[str | None, Callable[[], str]]]) -> str | None:
    """Write each asked-for output (path, its text made only now), atomically: a folder, a missing
    folder or a FIFO at the path is one line of problem (returned), never a traceback or a wait
    for a reader. None when all were written."""
    for path, text in outputs:
        if not path:
            continue
        if Path(path).is_dir():
            return f"cannot write {path}: it is a folder"
        try:
            atomic_write_bytes(Path(path), text().encode("utf-8"))
        except OSError as exc:
            return f"cannot write {path}: {exc.strerror or exc}"
    return None


def add_align_argument(parser: argparse.ArgumentParser) -> None:
    """`--align`, alike on every command that aligns a pair: `rerun` and `diagnose` must find the
    op keys `report` printed, and a key made by position exists only under that alignment."""
    parser.add_argument(
        "--align", choices=ALIGN_MODES, default="auto",
        help="pair records by the same forward calls, or by token position when the runs were cut differently (default: auto; docs/profiles.md)",
    )
