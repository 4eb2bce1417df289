"""The C heap kept for the diff engine's temporaries, so that each one is not new memory.

A pair that differs goes through the diff engine a block of BLOCK_ELEMENTS at a time, and each
numpy step on a block's differing elements makes a temporary of up to 2 MB, some fifty a block.
glibc hands allocations that large out as fresh mappings until one is freed, then raises its
threshold to that size and trims its heap past twice it: a block's temporaries together pass
that, so their pages were given back and faulted in again, block after block. A 4096x4096
bfloat16 pair of which 3 in 4 elements differ took 0.69 s through the engine, 0.29 s with these
thresholds set (24 against 58 million elements a second; a 16x2048 pair: 26 against 45). Set
alone, either threshold made it worse: ten 512x512 pairs faulted 87,797 pages in with the trim
threshold alone, 48,351 with the mapping threshold alone, 13,251 with neither, 2 with both.

mallopt(3) is not safe while other threads allocate, so a process sets them as it starts, before
any thread: the CLI (`viewer.cli.main`), the comparison's child (`sessions.compare.in_child`,
which the window and the gate compare in) and its worker processes. Each is short-lived, so the
heap they keep goes with them.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt(3)'s parameters, from glibc's malloc.h."""
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Allocations below this come from the heap (the ceiling of the threshold glibc raises by
itself): a larger buffer is still a mapping of its own, given back whole when freed."""
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free memory at the top of the heap stays with the process up to this, for the next block."""


@cache
def keep_temporaries_on_heap() -> bool:
    """Set glibc's thresholds (MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES) once per process, at its
    start; False where there is no glibc to take them (macOS, musl), which changes nothing else."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
