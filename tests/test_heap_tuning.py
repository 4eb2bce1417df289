"""The diff engine's temporaries stay on the C heap (sessions.compare.heap_tuning): a differing
pair's blocks do not fault their pages in again, block after block. Counted in a fresh process,
whose allocator no other test has set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAULTS_OF_DIFFERING_PAIRS = """
import resource
import numpy as np
from sessions.compare.tensor_diff import DiffAccumulator, Tolerance

oracle = np.random.default_rng(1).integers(0, 0x3F80, size=(512, 512), dtype=np.uint16)
native = oracle ^ np.random.default_rng(2).integers(0, 4, size=oracle.shape, dtype=np.uint16)

def compare() -> None:
    accumulator = DiffAccumulator("bfloat16", oracle.shape, Tolerance(), 0)
    accumulator.add(native, oracle, 0)
    accumulator.finish()

compare()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    compare()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator takes the thresholds")
def test_a_differing_pair_faults_no_memory_in_after_the_first() -> None:
    """512x512 bfloat16, 3 in 4 elements a few ULP apart: its temporaries are 1.5-2 MB each. With
    glibc's own thresholds, ten such pairs faulted 13,259 pages in (54 MB the kernel zeroed)."""
    run = subprocess.run([sys.executable, "-c", FAULTS_OF_DIFFERING_PAIRS], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert int(run.stdout) < 1000
