"""How long writing and opening a capture of many small records take, next to plain h5py reads.

Run: .venv/bin/python benchmarks/bench_open_index.py [--rows N] [--layout packed|datasets] [--sources] [--keep DIR]

A real 8B model's run is hundreds of thousands of records (240,000: about 1,000 per token step);
each figure with a goal is printed beside it (the goals hold for the packed layout):
- writing: time per record with the streaming writer (its tensors are 128 bytes, so this is
  the cost per record beyond the bytes);
- open_capture with its first structural check in a child process (what the first open costs;
  the check cache is pointed at a fresh folder so the check really runs), and the CPU time it
  took (child and parent), which is its wall time where no other process competes for the cores;
  then the same first open in a new process that keeps a checking child ready, as the viewer
  and the commands that open captures do (`sessions.capture.spare_checker`): what a user waits;
- open_capture in a new process whose pass is cached on disk (time inside that process);
- open_capture of an already-checked file (index, dispatch, tokens: one read each);
- Capture.records (built on demand: one record looked at), and every Record built;
- reading one tensor through the reader (with its per-dataset safety checks);
- plain h5py: opening the file and reading /index, and reading the same tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import h5py  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
from sessions.capture import format as cf  # noqa: E402
from sessions.capture.meta import CaptureMeta  # noqa: E402
from sessions.capture.opening import open_capture  # noqa: E402
from sessions.capture.structure_check import shard_count  # noqa: E402
from sessions.machine import usable_cores  # noqa: E402

STEP_ROWS = 500
ROOT = Path(__file__).resolve().parent.parent
TIMED_OPEN = """
import sys, time
from sessions.capture.opening import open_capture
start = time.perf_counter()
open_capture(sys.argv[1]).close()
print(time.perf_counter() - start)
"""

TIMED_READY_OPEN = """
import sys, time
from sessions.capture import spare_checker
spare_checker.prepare()
time.sleep(1.0)
from sessions.capture.opening import open_capture
start = time.perf_counter()
open_capture(sys.argv[1]).close()
print(time.perf_counter() - start)
"""


GOALS_MS = {"write": 0.020, "first open": 1000.0, "records": 200.0}


def build_capture(path: Path, rows: int, layout: str = "packed", sources: bool = False) -> None:
    """A capture with `rows` small bfloat16 tensors, written with the streaming writer; with
    `sources` each carries a `ggml_src` as the llama.cpp recorder writes it."""
    from sessions.capture.writer import CaptureWriter

    rng = np.random.default_rng(0)
    tensor = rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16)
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="bench"), layout=layout) as writer:
        for seq in range(rows):
            step = seq // STEP_ROWS
            attrs = {"ggml_src": json.dumps([f"blk.{seq % 28}.ffn_down.weight", f"ffn_out-{seq % 28}"])} if sources else None
            writer.add_tensor(f"l_out-{seq % 28}", tensor, step=step, segment="decode", layer=seq % 28, attrs=attrs)
            if seq % STEP_ROWS == STEP_ROWS - 1:
                writer.add_token(step=step, segment="decode", token_id=seq, is_stop=False)
                writer.end_step()


def best_of(repeats: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times) if repeats < 5 else statistics.median(times)


def open_in_new_process(path: Path, script: str = TIMED_OPEN, cache: str | None = None) -> float:
    """Seconds `open_capture` takes in a fresh interpreter (its start-up not counted); `cache`: its check cache folder."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **({"PARITY_XRAY_CACHE_DIR": cache} if cache else {}))
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=240_000)
    parser.add_argument("--layout", choices=("packed", "datasets"), default="packed")
    parser.add_argument("--keep", type=Path, help="write the capture here and keep it (reused when present)")
    parser.add_argument("--sources", action="store_true", help="each record carries a ggml_src attribute, as llama.cpp captures do")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-open-") as scratch:
        return measure(args, Path(scratch))


def measure(args: argparse.Namespace, scratch: Path) -> int:
    """Every figure, printed beside its goal; the capture (unless --keep) and the caches live in `scratch`."""
    folder = args.keep or scratch
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bench-{args.rows}-{args.layout}{'-sources' if args.sources else ''}.h5"
    write_ms = None
    if args.keep is None or not path.exists():
        start = time.perf_counter()
        build_capture(path, args.rows, args.layout, args.sources)
        seconds = time.perf_counter() - start
        write_ms = seconds * 1e3 / args.rows
        print(f"built {path} ({path.stat().st_size / 1e6:.1f} MB, {args.rows} rows, {args.layout}) in {seconds:.1f} s")
    print(f"{usable_cores()} cores; the first check may use up to {shard_count(path)} child processes (more than one only for many datasets of their own)")
    os.environ["PARITY_XRAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache-", dir=scratch)

    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, cpu_start = time.perf_counter(), time.process_time()
    with open_capture(path) as capture:
        first_open = time.perf_counter() - start
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime
        first_open_cpu = time.process_time() - cpu_start + child_cpu
        assert len(capture.index) == args.rows
        middle = capture.records[args.rows // 2]

    def reopen() -> None:
        open_capture(path).close()

    def records() -> None:
        with open_capture(path) as capture:
            capture.records[args.rows // 2]

    def every_record() -> None:
        with open_capture(path) as capture:
            list(capture.records)

    capture = open_capture(path)
    one_tensor = best_of(20, lambda: capture.read_bits(middle))
    capture.close()

    def plain_index() -> None:
        with h5py.File(path, "r", locking=False) as f:
            f[cf.INDEX_PATH][()]

    plain_file = h5py.File(path, "r", locking=False)
    stored = np.s_[middle.offset : middle.offset + middle.nbytes] if middle.packed else ()
    plain_tensor = best_of(20, lambda: plain_file[middle.path][stored])
    plain_file.close()

    rows: list[tuple[str, float, str]] = [
        ("open_capture, first open (child structural check + open)", first_open * 1e3, f"goal < {GOALS_MS['first open']:g} ms"),
        ("  the same, CPU time of the checking child and this process", first_open_cpu * 1e3, "(wall time on an idle machine)"),
        (
            "  the same in a new process with a checking child ready (the viewer, CLI)",
            min(open_in_new_process(path, TIMED_READY_OPEN, tempfile.mkdtemp(prefix="cache-", dir=scratch)) for _ in range(3)) * 1e3,
            f"goal < {GOALS_MS['first open']:g} ms",
        ),
        ("open_capture in a new process, pass cached on disk", min(open_in_new_process(path) for _ in range(3)) * 1e3, ""),
        ("open_capture, already checked (index+dispatch+tokens)", best_of(7, reopen) * 1e3, ""),
        (f"open_capture + Capture.records ({args.rows} records), one looked at", best_of(5, records) * 1e3, f"goal < {GOALS_MS['records']:g} ms"),
        ("open_capture + every Record built (list(Capture.records))", best_of(3, every_record) * 1e3, ""),
        ("plain h5py: open + read /index", best_of(7, plain_index) * 1e3, "floor"),
        ("Capture.read_bits of one tensor (with safety checks)", one_tensor * 1e3, ""),
        ("plain h5py: read the same tensor", plain_tensor * 1e3, ""),
    ]
    if write_ms is not None:
        rows.insert(0, ("writing, per record (128-byte tensors)", write_ms, f"goal < {GOALS_MS['write'] * 1e3:g} us"))
    width = max(len(name) for name, _, _ in rows)
    for name, ms, goal in rows:
        print(f"{name:<{width}}  {ms:9.3f} ms  {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
