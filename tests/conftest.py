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
