"""What `parity-xray [FILES]` asks of the viewer, read before Qt is loaded.

A mistyped command line (`parity-xray --version`, three captures) is answered by its own
message wherever it is typed: read after the check that a window can open, on a machine without
a display it was answered with ten lines about missing xcb libraries instead.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from sessions.gate.result import GateFormatError, GateResult, load_gate_file

SESSION_SUFFIX = ".xray"
GATE_SUFFIX = ".json"
"""`parity-xray GATE.json` opens a gate's result (`parity-xray gate --json`)."""


@dataclass(frozen=True)
class ViewerRequest:
    files: list[Path]
    """NATIVE ORACLE, one capture, or one FILE.xray session (none: the empty window)."""
    settings: Path | None
    gate: GateResult | None
    """The gate result to open instead of a pair (`files` then holds its path)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parity-xray",
        description="Open the viewer: empty (drop files onto it), on a NATIVE and an ORACLE capture, or on a saved session (open FILE.xray).",
    )
    parser.add_argument("files", nargs="*", type=Path, metavar="CAPTURE", help="NATIVE ORACLE, one capture, one FILE.xray session, or one GATE.json gate result")
    parser.add_argument("--settings", type=Path, help="use this INI file for layout, recent files and theme")
    return parser


def viewer_request(argv: list[str]) -> ViewerRequest | int:
    """The request, or an exit code with the reason printed (argparse's own refusals exit 2)."""
    if argv[:1] == ["open"]:
        argv = argv[1:]
        if len(argv) != 1 or not argv[0].endswith(SESSION_SUFFIX):
            print(f"parity-xray open: give one session file (FILE{SESSION_SUFFIX})", file=sys.stderr)
            return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as refused:
        return int(refused.code or 0)
    if len(args.files) > 2:
        print("parity-xray: give at most two captures: NATIVE ORACLE", file=sys.stderr)
        return 2
    gate = None
    if len(args.files) == 1 and args.files[0].suffix == GATE_SUFFIX:
        try:
            gate = load_gate_file(args.files[0])
        except GateFormatError as exc:
            print(f"parity-xray: {args.files[0]}: not a gate result: {exc}", file=sys.stderr)
            return 2
    return ViewerRequest(args.files, args.settings, gate)
