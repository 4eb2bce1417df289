"""Test-wide set-up: headless Qt, artifacts folder, and the real demo captures as fixtures."""

from __future__ import annotations

import os
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
import pytest  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save screenshots and reports for a person to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def demo_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every demo scenario generated once (seed 0): scenario -> (native path, oracle path)."""
    from backends.demo_generate import iter_generate
    from sessions.progress import run_to_end

    return run_to_end(iter_generate(tmp_path_factory.mktemp("demo"), seed=0))
