"""`parity-xray [NATIVE ORACLE]`, `parity-xray [open] FILE.xray`, `parity-xray GATE.json`: the desktop viewer's entry point."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication, QWidget

import sessions  # noqa: F401  (disables HDF5 filter plugins before h5py is imported)
from sessions.gate.result import GateFormatError, load_gate_file
from viewer.gate.gate_window import GateWindow
from viewer.settings import APPLICATION, ORGANISATION, ViewerSettings
from viewer.window.main_window import MainWindow
from viewer.window.terminal_ctrl_c import closing_on_ctrl_c

SESSION_SUFFIX = ".xray"
GATE_SUFFIX = ".json"
"""`parity-xray GATE.json` opens a gate's result (`parity-xray gate --json`)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parity-xray",
        description="Open the viewer: empty (drop files onto it), on a NATIVE and an ORACLE capture, or on a saved session (open FILE.xray).",
    )
    parser.add_argument("files", nargs="*", type=Path, metavar="CAPTURE", help="NATIVE ORACLE, one capture, one FILE.xray session, or one GATE.json gate result")
    parser.add_argument("--settings", type=Path, help="use this INI file for layout, recent files and theme")
    return parser


def create_window(files: list[Path], settings: ViewerSettings | None = None) -> MainWindow:
    """The window, opening the given files: two are NATIVE ORACLE in that order, one uses its role hint."""
    window = MainWindow(settings)
    if len(files) == 1 and files[0].suffix == SESSION_SUFFIX:
        window.session_file.open_session(files[0])
    elif len(files) == 2:
        window.open_pair(files[0], files[1])
    elif len(files) == 1:
        window.open_files(files)
    return window


def window_for(argv: list[str]) -> QWidget | int:
    """The window the command line asks for, or an exit code with the reason printed (tests
    check the choice here without entering the event loop, which a quit would end for good)."""
    if argv[:1] == ["open"]:
        argv = argv[1:]
        if len(argv) != 1 or not argv[0].endswith(SESSION_SUFFIX):
            print(f"parity-xray open: give one session file (FILE{SESSION_SUFFIX})", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
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
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANISATION)
    app.setApplicationName(APPLICATION)
    settings = ViewerSettings(args.settings) if args.settings else None
    return GateWindow(gate, settings) if gate is not None else create_window(args.files, settings)


def run_viewer(argv: list[str]) -> int:
    window = window_for(argv)
    if isinstance(window, int):
        return window
    window.show()
    with closing_on_ctrl_c(window):
        return int(QApplication.instance().exec())  # type: ignore[union-attr]
