"""The `parity-xray` command.

Headless subcommands live beside the code they drive (`sessions`, `backends`) and are
imported only when named, so `report` and `validate` in CI never load Qt. Each subcommand
module exposes `add_arguments(parser)` and `run(args) -> int`. Anything else (no arguments,
captures, `open FILE.xray`, `FILE.xray`) opens the viewer (viewer.app).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import ModuleType
from typing import Any, NoReturn, TextIO

from sessions.capture import spare_checker
from sessions.compare.heap_tuning import keep_temporaries_on_heap
from sessions.compare.verdict import EXIT_UNUSABLE
from sessions.ctrl_c import ctrl_c_kept, exit_code_of, said
from sessions.printable import printable

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("sessions.commands.validate", "check capture files; exit 0 valid, 2 invalid"),
    "report": ("sessions.commands.report", "compare a native and an oracle capture headlessly"),
    "gate": ("sessions.commands.gate", "judge every case of a manifest like report, on a Dask cluster; exit 0 all pass, 1 any fails, 2 any unusable"),
    "rerun": ("backends.commands.rerun", "recompute one captured op or segment live through MLX"),
    "diagnose": ("backends.commands.diagnose", "say why the runs part: local vs inherited ops, and the contract each local op ran"),
    "demo": ("viewer.demo_command", "generate the demo captures, or open the viewer on them"),
    "record": ("backends.commands.record", "record a real llama.cpp or MLX run into a capture"),
    "import": ("sessions.commands.import_dump", "turn safetensors / .npz / .npy+.bin dumps into a capture"),
    "cache": ("sessions.commands.cache", "show or --clear the cache: comparison results, structure checks, gate cases, weights hashes"),
    "doctor": ("viewer.doctor.command", "check what a run needs on this machine and print the exact fix"),
}


VIEWER_FORMS = """without a command, the viewer opens:
  parity-xray                      empty (drop captures onto it)
  parity-xray NATIVE ORACLE        on a pair of captures
  parity-xray [open] FILE.xray     on a saved investigation session
  parity-xray GATE.json            on a gate's result (gate --json)
  --settings FILE.ini              layout, recent files and theme from this file"""
"""The viewer's command lines, which `--help` lists after the commands: only `parity-xray
NATIVE ORACLE --help` said them, and nothing led there."""


def _unknown_command(word: str) -> str | None:
    """Why `word` is neither a command nor a file for the viewer, or None: a bare word (no folder,
    no suffix) that names no file is a mistyped command. `parity-xray valdate x.h5` opened the
    window on two files named so, and without a display ended in Qt's abort."""
    if word.startswith("-") or word == "open" or "/" in word or os.sep in word or "." in word or os.path.exists(word):
        return None
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown command {printable(word)!r}: {hint}the commands are {', '.join(SUBCOMMANDS)}; a capture to open is a file that exists"


def _module(name: str) -> ModuleType:
    return importlib.import_module(SUBCOMMANDS[name][0])


class _OneLineParser(argparse.ArgumentParser):
    """A mistyped option is refused in one line, as every other refusal is: argparse printed the
    whole usage block first (nine lines for `report --top x`), burying the error under it in a CI log."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_UNUSABLE, f"{self.prog}: error: {printable(message)} (`{self.prog} --help` lists the options)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or only `only`: `parity-xray report` must not pay for importing MLX."""
    parser = _OneLineParser(
        prog="parity-xray",
        description="Show where and why two runs of a language model stop agreeing, down to the bit.",
        epilog=VIEWER_FORMS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        if only is None or name == only:
            _module(name).add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _parsed(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed; words no option takes are refused by the command's own parser, which names
    the command ("parity-xray report: error: unrecognized arguments: --nosuch"), not the top one."""
    name = argv[0] if argv[0] in SUBCOMMANDS else None
    parser = build_parser(name)
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = parser if name is None else _OneLineParser(prog=f"{parser.prog} {name}")
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


OPENS_CAPTURES = frozenset({"validate", "report", "rerun", "diagnose", "demo"})
"""Subcommands that check captures: a checking child is started before their imports (`spare_checker`)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        unknown = _unknown_command(argv[0]) if argv else None
        if unknown is not None:
            print(f"parity-xray: {unknown}", file=sys.stderr)
            return EXIT_UNUSABLE
        from viewer.viewer_request import viewer_request
        from viewer.window_launch import EXIT_NO_WINDOW, window_refused

        request = viewer_request(argv)  # a mistyped command line is answered as typed, display or none
        if isinstance(request, int):
            return request
        if window_refused():  # before the spare checker's child starts, for a window that cannot open
            return EXIT_NO_WINDOW
        spare_checker.prepare()
        from viewer.app import run_viewer

        return run_viewer(request)
    keep_temporaries_on_heap()
    if argv[0] in OPENS_CAPTURES:
        spare_checker.prepare()
    try:
        with ctrl_c_kept(), _checked_stdout():
            try:
                args = _parsed(argv)
            except SystemExit as refused:
                if refused.code == EXIT_UNUSABLE:
                    _remove_earlier_documents(argv)
                raise
            code = int(_module(args.command).run(args))
            sys.stdout.flush()
            return code
    except KeyboardInterrupt as stop:
        # Commands that leave something behind (record, gate) say what; the rest end here. An
        # interrupted run makes no claim: the last run's JSON and HTML would read as this one's.
        _remove_earlier_documents(argv)
        _say(f"parity-xray {argv[0]}: {said(stop)}")
        return exit_code_of(stop)
    except BrokenPipeError:
        # `parity-xray report ... | head -1`: the reader has what it wanted. Python would print a
        # traceback at exit while flushing stdout, so stdout goes to /dev/null first.
        _stdout_to_null()
        return 141  # the shell's code for a pipe's writer ended by SIGPIPE (128 + 13)
    except _StdoutFailed as failed:
        _stdout_to_null()
        _remove_earlier_documents(argv)
        _say(f"parity-xray {argv[0]}: cannot write to standard output: {failed.reason}")
        return EXIT_UNUSABLE
    except OSError as exc:
        if exc.filename is None:
            raise
        # A path no check expected (a name longer than the file system allows, a loop of links):
        # still one line that names it, never a traceback.
        _remove_earlier_documents(argv)
        _say(f"parity-xray {argv[0]}: cannot use {printable(str(exc.filename))}: {exc.strerror or exc}")
        return EXIT_UNUSABLE


def _say(line: str) -> None:
    _QuietStderr(sys.stderr).write(line + "\n")


DOCUMENT_OPTIONS = ("--json", "--html")


def _remove_earlier_documents(argv: list[str]) -> None:
    """A command that ended unusable before its own checks (a bad option, a path no check
    expected, a full standard output) removes the JSON and HTML an earlier run left where it was
    told to write, as every other exit 2 does (`remove_earlier_outputs`): a CI step archiving
    them took the earlier run's PARITY for this one's. Every other word typed counts as an input."""
    from sessions.commands.arguments import remove_earlier_outputs

    outputs: dict[str, str | None] = {}
    taken: set[int] = set()
    for at, word in enumerate(argv):
        for option in DOCUMENT_OPTIONS:
            if word == option and at + 1 < len(argv):
                outputs[option], taken = argv[at + 1], taken | {at, at + 1}
            elif word.startswith(f"{option}="):
                outputs[option], taken = word.split("=", 1)[1], taken | {at}
    if outputs:
        remove_earlier_outputs(outputs, {f"word {at} typed": word for at, word in enumerate(argv) if at not in taken})


class _StdoutFailed(OSError):
    """Standard output could not be written (a full disk, a closed or broken descriptor): an
    OSError, as a command that can do without its output (`record`'s progress) takes it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _CheckedStdout:
    """Standard output whose failures are `_StdoutFailed`, told apart from a file's (`report >
    /dev/full` printed a traceback and exited 1, which CI reads as a divergence)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with _stdout_failures():
            return self._stream.write(text)

    def flush(self) -> None:
        with _stdout_failures():
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _stdout_failures() -> Iterator[None]:
    """A failed write to standard output as `_StdoutFailed`; a broken pipe stays what it is."""
    try:
        yield
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a closed stream
        raise _StdoutFailed(getattr(exc, "strerror", None) or str(exc)) from None


@contextmanager
def _checked_stdout() -> Iterator[None]:
    """`_CheckedStdout` while a command runs; a process started with stdout closed (`>&-`) writes
    to nowhere instead of failing at its first print."""
    original, errors = sys.stdout, sys.stderr
    sys.stdout = _CheckedStdout(original if original is not None else open(os.devnull, "w"))  # type: ignore[assignment]
    sys.stderr = _QuietStderr(errors if errors is not None else open(os.devnull, "w"))  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = original, errors


class _QuietStderr:
    """Standard error whose failures are dropped: with nowhere to say what went wrong, a failed
    message must not change the exit status (`report ... 2>/dev/full` on an unusable input
    printed no traceback, having nowhere to, and exited 1, a divergence to CI, not 2)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with suppress(OSError, ValueError):
            return self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_to_null() -> None:
    """Point descriptor 1 at /dev/null, so the interpreter's last flush of stdout at exit succeeds."""
    if sys.stdout is not None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
