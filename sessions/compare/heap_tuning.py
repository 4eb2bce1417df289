"""The C heap kept for the diff engine's temporaries, so that each one is not new memory.

A pair that differs goes through the diff engine a block of BLOCK_ELEMENTS at a time, and each
numpy step on a block's differing elements makes a temporary of up to 2 MB, some fifty a block.
glibc hands allocations that large out as fresh mappings (or trims its heap once they are
freed), so every temporary's pages fault in again: a 4096x4096 bfloat16 pair of which 3 in 4
elements differ took 0.69 s through the engine, 0.29 s with these allocations kept on the
heap (24 against 58 million elements a second; a 16x2048 pair: 26 against 45).
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt(3)'s parameters, from glibc's malloc.h."""
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Allocations below this come from the heap (glibc's own ceiling for the threshold it raises by
itself, which it lowers again as it trims): a read buffer past it is still a mapping of its own,
given back whole when freed."""
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free memory at the top of the heap up to this stays with the process for the next block: the
most a comparison keeps beyond what it uses."""


@cache
def keep_temporaries_on_heap() -> bool:
    """Set glibc's thresholds (MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES) once per process;
    False where there is no glibc to take them (macOS, musl), which changes nothing else."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
