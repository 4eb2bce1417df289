"""The domain and compute layers never import Qt, so they run headless and in CI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QT_MODULES = ("PySide6", "pyqtgraph", "superqt", "qtpy", "PyQt5", "PyQt6", "shiboken6")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_sessions_and_backends_sources_import_no_qt() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {sorted(_imported_modules(path) & set(QT_MODULES))}"
        for package in ("sessions", "backends")
        for path in sorted((ROOT / package).rglob("*.py"))
        if _imported_modules(path) & set(QT_MODULES)
    ]
    assert offenders == []


def test_importing_every_domain_module_loads_no_qt_at_runtime() -> None:
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in ("sessions", "backends")
        for path in sorted((ROOT / package).rglob("*.py"))
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_headless_cli_commands_load_no_qt() -> None:
    code = (
        "import sys\n"
        "from viewer.cli import build_parser\n"
        "build_parser()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
