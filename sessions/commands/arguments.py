"""Command-line values checked where they are parsed: a bad one is refused with exit 2 and one line.

argparse's own `type=float` lets through values no comparison can use: a negative or NaN
tolerance (`--rtol -1` reported a signed-zero pair as PARITY with exit 0) or a negative ULP
bound (a traceback, exit 1, read by CI as a divergence).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import stat
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path

from sessions.atomic_write import (
    WriteFailed,
    atomic_write_all,
    folder_problem,
    link_problem,
)
from sessions.compare.align_modes import ALIGN_MODES
from sessions.compare.tolerance_bounds import bound_problem, ulp_problem
from sessions.compare.verdict import EXIT_UNUSABLE
from sessions.printable import printable
from sessions.side_file import file_kind


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


def non_empty(text: str) -> str:
    """A path's or an address's value. An empty one, as an unset shell variable gives
    (`--tolerance-policy "$POLICY"`), is refused: read as "no policy" a failing pair passed, read
    as "." a capture was "not a regular file", and `--scheduler ""` blamed a local cluster."""
    if not text:
        raise argparse.ArgumentTypeError("is empty (an unset variable?)")
    return text


def tolerance_bound(text: str) -> float:
    """An absolute or relative tolerance (`bound_problem`)."""
    return float(_checked(text, float, bound_problem))


def ulp_bound(text: str) -> int:
    """A max_ulp tolerance (`ulp_problem`)."""
    return int(_checked(text, int, ulp_problem))


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds > 0 (`--timeout nan` meant no limit at all)."""
    return float(_checked(text, float, _seconds_problem))


def _seconds_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return "must be a finite number of seconds > 0"
    return None


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number of at least `minimum` (a count of workers, of ops to list), and at most `maximum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number <= {maximum}, not {value}")
        return value

    return parse


def output_problem(
    outputs: Mapping[str, str | None], inputs: Mapping[str, str | Path | None], made_folders: Collection[str] = ()
) -> str | None:
    """Why one of the outputs (option -> path) may not be written, said before any work: it
    cannot hold a file (`_path_problem`; the options in `made_folders` are written into folders
    the command makes), it names one of the inputs (`--json` given the oracle capture's path
    would replace the capture, or on an unusable input remove it), or another output (the JSON
    would silently replace the HTML)."""
    for option, output in outputs.items():
        problem = _path_problem(output, option not in made_folders) if output else None
        if problem is not None:
            return f"{option} {printable(output)} {problem}"
    # Each path's identity is looked up once: compared pair by pair, a gate's 2,000 case pages
    # took 85 s of checks before its first case was judged.
    given: dict[tuple[object, ...], str] = {}
    for what, path in inputs.items():
        if path:
            given.setdefault(_existing(path), what)  # the first input a file is, as they were named
    given.pop((None,), None)
    for option, output in outputs.items():
        what = given.get(_existing(output)) if output else None
        if what is not None:
            return f"{option} {output} is the {what}: an output never replaces an input"
    seen: dict[tuple[object, ...], str] = {}
    for option, output in outputs.items():
        if not output:
            continue
        for identity in {_existing(output), ("path", str(Path(output).resolve()))}:
            if identity in seen and identity[0] is not None:
                return f"{seen[identity]} and {option} both name {output}: each output needs a file of its own"
            seen[identity] = option
    return None


def _existing(path: str | Path) -> tuple[object, ...]:
    """The file at `path` (device and inode: the same through a link or another spelling), or
    (None,) when nothing is there (`same_file`: a missing file is no other file)."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return (None,)
    return ("file", found.st_dev, found.st_ino)


def _path_problem(path: str | Path, in_a_folder: bool = True) -> str | None:
    """Why no file can be written at `path` ("is a folder; ..."), or None. Anything there but a
    regular file is refused: an atomic write puts a new file in its place, and `--json /dev/null`
    run as root replaced the device. The writer's own errors would come after the work, and
    name its hidden temporary file. `-` is refused too: it reads as standard output, and a
    file of that name appeared in the working folder instead."""
    if str(path) == "-":
        return "would be a file named '-' in this folder: outputs are files (the text goes to standard output); name a path"
    if str(path).endswith(("/", os.sep)):  # Path() drops the separator: `--json out/` wrote a file named out
        return "ends in a separator, so it names a folder; name a file"
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (its folder is checked below)
        mode = None
    except OSError as exc:  # a name too long, a loop of links
        return f"cannot be written ({exc.strerror or exc})"
    if mode is not None and stat.S_ISDIR(mode):
        return "is a folder; name a file"
    if mode is not None and not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file; an output only ever replaces a file"
    linked = link_problem(path)
    if linked is not None:
        return linked
    return folder_problem(path) if in_a_folder else None


DOCUMENT_HEAD_BYTES = 16 * 1024
"""How much of a file at an output path is read to tell whether a command of ours wrote it."""


def _ours(option: str, head: bytes) -> bool:
    """Whether `head` (a file's first bytes) begins a document this project writes for `option`:
    JSON whose "format" is one of ours, or an HTML page that names Parity X-ray (its report,
    gate and diagnosis pages all do, in their title or first lines)."""
    if option == "--json":
        return head.startswith(b"{") and b'"format": "parity-xray-' in head
    if option == "--html":
        lowered = head.lower()
        return lowered.startswith(b"<!doctype html") and b"parity" in lowered
    return False


def remove_earlier_outputs(outputs: Mapping[str, str | None], inputs: Mapping[str, str | Path | None]) -> None:
    """For a command that ends unusable (exit 2): remove the JSON and HTML documents an earlier
    run wrote at `outputs`, so that a CI step reading them never takes the last run's verdict
    for this one's. Only where an output may be written at all (`output_problem`: never an
    input, a folder or a device), and only a document of ours (`_ours`): a command that stopped
    before it knew every input (the weights a capture names) must not remove a file given there
    by mistake, a model's config.json no more than its weights."""
    if output_problem(outputs, inputs) is not None:
        return
    for option, path in outputs.items():
        if not path or option not in ("--json", "--html"):
            continue
        with contextlib.suppress(OSError):  # not there, or not ours to remove (a read-only place): left as it is
            with open(path, "rb") as document:
                head = document.read(DOCUMENT_HEAD_BYTES)
            if _ours(option, head):
                Path(path).unlink()


def end_unusable(command: str, message: str, outputs: Mapping[str, str | None], inputs: Mapping[str, str | Path | None]) -> int:
    """Exit 2 with one line on stderr naming `command`, leaving no document an earlier run wrote
    at `outputs` (`remove_earlier_outputs`): every command that writes --json or --html ends so."""
    print(f"parity-xray {command}: {printable(message)}", file=sys.stderr)  # a path from a session or manifest may hold anything
    remove_earlier_outputs(outputs, inputs)
    return EXIT_UNUSABLE


def write_outputs(outputs: Sequence[tuple[str | None, Callable[[], str | Iterable[str]]]]) -> str | None:
    """Write each asked-for output (path, its text made only now, whole or in pieces), all of
    them or none (`atomic_write_all`): a path that cannot hold a file (`_path_problem`: checked
    again, as it may have changed during the work) or a failed write is one line of problem
    (returned), never a traceback or a wait for a reader. None when all were written."""
    wanted = [(path, text) for path, text in outputs if path]
    for path, _ in wanted:
        problem = _path_problem(path)
        if problem is not None:
            return f"{printable(path)} {problem}"
    try:
        atomic_write_all([(Path(path), partial(_utf8, text)) for path, text in wanted])
    except WriteFailed as exc:
        return f"cannot write {printable(str(exc.filename))}: {printable(str(exc.strerror))}"
    return None


WRITE_CHARACTERS = 1 << 20
"""Pieces of an output are written this much at a time: a real model's `--json` is 480,000
pieces, and a write each took 1 s of its 6."""


def _utf8(text: Callable[[], str | Iterable[str]]) -> Iterator[bytes]:
    made = text()
    if isinstance(made, str):
        yield made.encode("utf-8")
        return
    held: list[str] = []
    size = 0
    for piece in made:
        held.append(piece)
        size += len(piece)
        if size >= WRITE_CHARACTERS:
            yield "".join(held).encode("utf-8")
            held, size = [], 0
    if held:
        yield "".join(held).encode("utf-8")


def add_align_argument(parser: argparse.ArgumentParser) -> None:
    """`--align`, alike on every command that aligns a pair: `rerun` and `diagnose` must find the
    op keys `report` printed, and a key made by position exists only under that alignment."""
    parser.add_argument(
        "--align", choices=ALIGN_MODES, default="auto",
        help="pair records by the same forward calls, or by token position when the runs were cut differently (default: auto; docs/profiles.md)",
    )
