"""Import rules, enforced by import-linter (contracts in pyproject.toml) and checked at run time.

The domain and compute layers never import Qt, so they run headless and in CI; layers only import
downwards (viewer -> backends -> sessions); feature folders never import each other in a circle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QT_MODULES = ("PySide6", "pyqtgraph", "superqt", "qtpy", "PyQt5", "PyQt6", "shiboken6")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the packages under `root`, with the contracts in root's pyproject.toml."""
    env = dict(os.environ, PYTHONPATH=str(root))
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", "pyproject.toml", "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_import_linter_contracts_hold_for_the_tree() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "evidence"),
    [
        ("sessions/compare/verdict.py", "import PySide6.QtCore", "The domain and compute layers never import Qt", "sessions.compare.verdict -> PySide6"),
        ("sessions/compare/verdict.py", "import backends.kernels.head_chunk", "Layers: the viewer uses backends and sessions", "sessions.compare.verdict -> backends.kernels.head_chunk"),
        ("backends/kernels/head_chunk.py", "import viewer.theme", "Layers: the viewer uses backends and sessions", "backends.kernels.head_chunk -> viewer.theme"),
        ("sessions/compare/key.py", "import sessions.report.text", "Feature folders do not import each other in a circle", "No cycles are allowed in sessions."),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str, evidence: str) -> None:
    for package in ("sessions", "backends", "viewer"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / module
    planted.write_text(planted.read_text() + f"\n{line}  # planted by the test\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1
    broken = result.stdout[result.stdout.index("Broken contracts"):]
    assert contract in broken and evidence in broken


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


def test_the_window_and_the_cli_start_without_importing_numba() -> None:
    """numba takes about a second to import; only a diagnosis's ggml candidates need it."""
    code = (
        "import sys\n"
        "import viewer.window.main_window\n"
        "from viewer.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
