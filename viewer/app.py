"""`parity-xray [NATIVE ORACLE]`, `parity-xray [open] FILE.xray`, `parity-xray GATE.json`: the desktop viewer's entry point."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication, QWidget

import sessions  # noqa: F401  (disables HDF5 filter plugins before h5py is imported)
from viewer.gate.gate_window import GateWindow
from viewer.settings import APPLICATION, ORGANISATION, ViewerSettings
from viewer.viewer_request import SESSION_SUFFIX, ViewerRequest, viewer_request
from viewer.window.main_window import MainWindow
from viewer.window.terminal_ctrl_c import closing_on_ctrl_c


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


def window_for(request: ViewerRequest | list[str]) -> QWidget | int:
    """The window the command line asks for, or an exit code with the reason printed (tests
    check the choice here without entering the event loop, which a quit would end for good)."""
    if isinstance(request, list):
        request = viewer_request(request)
        if isinstance(request, int):
            return request
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANISATION)
    app.setApplicationName(APPLICATION)
    settings = ViewerSettings(request.settings) if request.settings else None
    return GateWindow(request.gate, settings) if request.gate is not None else create_window(request.files, settings)


def run_viewer(request: ViewerRequest | list[str]) -> int:
    window = window_for(request)
    if isinstance(window, int):
        return window
    window.show()
    with closing_on_ctrl_c(window):
        return int(QApplication.instance().exec())  # type: ignore[union-attr]
