"""What the llama.cpp process runs with, beside the model: its log, the buffer types it chose,
and how its OpenMP workers wait. The recorder writes all three into provenance; none of them is
about one graph node.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}
"""How llama.cpp's idle OpenMP workers wait while a recording stops its graph (`brief_openmp_wait`)."""

LOG_LINES: list[str] = []
"""What llama.cpp logged in this process (the recorder runs in a child: one run per process)."""
ERROR_LINES: list[str] = []
"""The lines of LOG_LINES llama.cpp logged as errors: why a model or context would not load."""
_LOG_CALLBACK: list[Any] = []
_BUFFER_LINE = re.compile(r"^\w+:\s+(\S+)\s+(model|KV|compute|output)\s+buffer size")
_DECLINED_LINE = re.compile(r"tensor '[^']*' \(\w+\)(?: \(and (\d+) others\))? cannot be used with preferred buffer type (\w+)")
_LOG_WARN, _LOG_ERROR = 3, 4
"""ggml_log_level values (1 debug, 2 info, 5 continuation are the others)."""


def keep_log() -> Any:
    """One log callback for the process's lifetime (llama.cpp keeps the pointer after any run
    ends): every line is kept for provenance, warnings and errors also go to stderr, where the
    parent finds them when the run fails."""
    if not _LOG_CALLBACK:
        import llama_cpp

        def log(level: int, text: bytes, _data: Any) -> None:
            line = text.decode("utf-8", "replace")
            LOG_LINES.append(line)
            if level == _LOG_ERROR:
                ERROR_LINES.append(line)
            if level in (_LOG_WARN, _LOG_ERROR):
                sys.stderr.write(line)

        _LOG_CALLBACK.append(llama_cpp.llama_log_callback(log))
    return _LOG_CALLBACK[0]


def first_error_since(mark: int) -> str:
    """The first error llama.cpp logged after ERROR_LINES held `mark` lines, as `: REASON`, or ""
    when it logged none: its first error is the specific one (later ones say only that loading
    failed)."""
    return f": {ERROR_LINES[mark].strip()}" if len(ERROR_LINES) > mark else ""


def buffer_types(lines: list[str]) -> dict[str, Any]:
    """Which ggml buffer types held what, from llama.cpp's log: `{"model": ["CPU_Mapped", "CPU_REPACK"],
    "KV": ["CPU"], ..., "declined": {"CPU_REPACK": 25}}` ("declined": how many tensors could not go
    to the buffer type llama.cpp preferred). The buffer type decides the kernel (a repacked or AMX
    buffer runs other matmul code), so it belongs in provenance beside the system info."""
    found: dict[str, Any] = {}
    declined: dict[str, int] = {}
    for line in lines:
        if (buffer := _BUFFER_LINE.match(line)) is not None:
            names = found.setdefault(buffer.group(2), [])
            if buffer.group(1) not in names:
                names.append(buffer.group(1))
        elif (refused := _DECLINED_LINE.search(line)) is not None:
            tensors = 1 + int(refused.group(1) or 0)
            declined[refused.group(2)] = declined.get(refused.group(2), 0) + tensors
    if declined:
        found["declined"] = declined
    return found


def brief_openmp_wait() -> None:
    """Let llama.cpp's idle OpenMP threads spin briefly, then sleep, unless the environment says
    how they wait (either variable set: both left as they are).

    ggml's CPU backend (built with OpenMP) computes in parallel regions whose worker threads then
    wait for the next one, by default spinning for milliseconds. A recording stops the graph after
    every recorded node to run Python, so those threads spun through all of it: on the 2-core
    development VM a recorded 50 M-parameter run spent most of its samples in libgomp's spin loop
    (perf) and took 2-10x as long whenever other processes wanted the cores. Asleep at once
    (`OMP_WAIT_POLICY=PASSIVE` alone), every stop pays for waking them: about 400 us a stop there,
    most of a recording's overhead. A spin of 3,000 rounds (libgomp counts ~100,000 a millisecond)
    bridges a short callback: measured on that VM, 5 runs each, recording took 0.34-0.47 s against
    0.60-0.90 s asleep at once, and with two busy processes on its cores 0.95-1.35 s against
    0.57-1.35 s (within that load's noise; 20,000 rounds took 3x as long under it). These are
    libgomp's variables (GCC's OpenMP, which the Makefile's build links); another OpenMP runtime
    ignores GOMP_SPINCOUNT. libgomp reads them once, when it loads, so this runs before llama_cpp
    is imported. How threads wait never changes what ggml computes: each thread's share of the
    work is fixed by its index."""
    if not any(name in os.environ for name in OPENMP_WAIT):
        os.environ.update(OPENMP_WAIT)
