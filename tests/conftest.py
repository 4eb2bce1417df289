"""Test-wide set-up: headless Qt, artifacts folder, and the real demo captures as fixtures."""

from __future__ import annotations

import os
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import pytest  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save screenshots and reports for a person to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def demo_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every demo scenario generated once (seed 0): scenario -> (native path, oracle path)."""
    from backends.demo.generate import iter_generate
    from sessions.progress import run_to_end

    return run_to_end(iter_generate(tmp_path_factory.mktemp("demo"), seed=0))


# Structure-check passes are remembered on disk (sessions.capture.check_cache); each test session gets
# its own empty cache, so no pass from an earlier run or from the user's own files counts here.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SESSION_CACHE_DIR = tempfile.mkdtemp(prefix="parity-xray-test-cache-")
os.environ["PARITY_XRAY_CACHE_DIR"] = _SESSION_CACHE_DIR
atexit.register(shutil.rmtree, _SESSION_CACHE_DIR, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mutation_corpus: 300 seeded byte-mutated captures through validate --deep and report (about 20 s)"
    )
