"""The diff engine's temporaries stay on the C heap (sessions.compare.heap_tuning): a differing
pair's blocks do not fault their pages in again, block after block; and every process that
compares sets that as it starts. Each is looked at in a fresh process, whose allocator no other
test has set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, write_capture

ROOT = Path(__file__).resolve().parent.parent

FAULTS_OF_DIFFERING_PAIRS = """
import resource
import numpy as np
from sessions.compare.heap_tuning import keep_temporaries_on_heap
from sessions.compare.tensor_diff import DiffAccumulator, Tolerance

oracle = np.random.default_rng(1).integers(0, 0x3F80, size=(512, 512), dtype=np.uint16)
native = oracle ^ np.random.default_rng(2).integers(0, 4, size=oracle.shape, dtype=np.uint16)

def compare() -> None:
    accumulator = DiffAccumulator("bfloat16", oracle.shape, Tolerance(), 0)
    accumulator.add(native, oracle, 0)
    accumulator.finish()

kept = keep_temporaries_on_heap()
compare()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    compare()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _in_a_fresh_process(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, errors="replace")
    assert run.returncode == 0, run.stderr
    return run


def test_a_differing_pair_faults_no_memory_in_after_the_first() -> None:
    """512x512 bfloat16, 3 in 4 elements a few ULP apart: its temporaries are 1.5-2 MB each. With
    glibc's own thresholds, ten such pairs faulted 13,259 pages in (54 MB the kernel zeroed)."""
    kept, faults = _in_a_fresh_process(FAULTS_OF_DIFFERING_PAIRS).stdout.split()
    if kept != "True":
        pytest.skip("no glibc here to take the thresholds (macOS, musl)")
    assert int(faults) < 1000


ENTRY_SETS_THE_HEAP = """
import multiprocessing, pickle, sys
from sessions.compare.heap_tuning import keep_temporaries_on_heap

entry, native, oracle = sys.argv[1:]
if entry == "cli":
    from viewer.cli import main
    main(["report", native, oracle])
elif entry == "comparison child":
    from sessions.compare.in_child import main
    main([native, oracle])
else:
    from sessions.compare.parallel_compare import _start_worker
    _start_worker(multiprocessing.Array("b", 1), pickle.dumps(None))
print(keep_temporaries_on_heap.cache_info().currsize, file=sys.stderr)
"""


@pytest.mark.parametrize("entry", ["cli", "comparison child", "worker"])
def test_every_process_that_compares_sets_the_heap_as_it_starts(tmp_path: Path, entry: str) -> None:
    """Before any thread: mallopt(3) is not safe while another thread allocates."""
    tensors = [T("attn_norm", np.ones((2, 4), dtype=np.float32), layer=0)]
    native, oracle = write_capture(tmp_path / "n.h5", "native", tensors), write_capture(tmp_path / "o.h5", "oracle", tensors)
    said = _in_a_fresh_process(ENTRY_SETS_THE_HEAP, entry, str(native), str(oracle)).stderr.splitlines()
    assert said[-1] == "1", "keep_temporaries_on_heap ran in this process"
