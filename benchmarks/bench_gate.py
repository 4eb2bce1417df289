"""How `parity-xray gate` scales with local Dask workers: a 40-case gate on 1, 2 and all cores.

The 40 cases are real demo pairs (backends.demo.generate.iter_generate): 10 seeds, each its
own weights and prompt, times 4 scenarios (clean, swiglu-order, attention-contract, post-eos).
They are generated once into --dir and kept. Each timed run is the command exactly as a user
types it (`parity-xray gate MANIFEST --workers N --no-cache`, through viewer.cli) in a fresh
process with a fresh cache directory, so every run pays the same work: the cluster's start,
each capture's structure check, each comparison in its child process. The captures are read
once beforehand, so all runs find them in the page cache. Then the gate runs once more on the
widest cluster with its cache: what an unchanged rerun costs.

Printed per run: wall time, cases per second, the speed-up over one worker, and the CPU time of
the whole process tree with the cores it kept busy on average (CPU / wall): where that stays
below the worker count, the cores were not free. Other load on the machine shows in the
figures; the load average is printed with them.

Usage: python benchmarks/bench_gate.py [--dir /tmp/parity-xray-bench-gate] [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sessions.child_env import child_env  # noqa: E402
from sessions.machine import usable_cores  # noqa: E402

SCENARIOS = ["clean", "swiglu-order", "attention-contract", "post-eos"]
GATE_COMMAND = [sys.executable, "-m", "viewer.cli", "gate"]
"""`parity-xray gate`: the console script's entry point, viewer.cli.main."""


def generate(directory: Path, seeds: int) -> Path:
    """The demo pairs of every seed under directory/seed-N/, and a manifest globbing them all."""
    from backends.demo.generate import iter_generate
    from sessions.progress import run_to_end

    for seed in range(seeds):
        folder = directory / f"seed-{seed:02d}"
        if not all((folder / f"{s}.oracle.h5").exists() and (folder / f"{s}.native.h5").exists() for s in SCENARIOS):
            started = time.monotonic()
            run_to_end(iter_generate(folder, SCENARIOS, seed=seed))
            print(f"generated seed {seed} in {time.monotonic() - started:.1f} s", flush=True)
    manifest = directory / "gate.toml"
    manifest.write_text('cases = "seed-*/*.native.h5"\noracle = "seed-*/*.oracle.h5"\n')
    return manifest


def warm(directory: Path) -> None:
    for path in sorted(directory.glob("seed-*/*.h5")):
        path.read_bytes()


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_gate(manifest: Path, workers: int, cache: Path, extra: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s of the whole process tree: the gate, its cluster, every child it reaped, the document)."""
    out = cache / "gate.json"
    cpu = _children_cpu_s()
    started = time.monotonic()
    done = subprocess.run(
        [*GATE_COMMAND, str(manifest), "--workers", str(workers), "--json", str(out), *extra],
        cwd=ROOT, env=dict(child_env(), PARITY_XRAY_CACHE_DIR=str(cache)), capture_output=True, text=True,
    )
    wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"gate failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall, _children_cpu_s() - cpu, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "parity-xray-bench-gate")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    manifest = generate(args.dir, args.seeds)
    warm(args.dir)
    every = usable_cores()
    counts = sorted({1, 2, every})
    print(f"{args.seeds * len(SCENARIOS)} cases; this machine has {every} core(s); load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'workers':>8} {'wall s':>8} {'cases/s':>8} {'speed-up':>9} {'CPU s':>7} {'cores used':>10}  summary")
    base = None
    for workers in counts:
        with tempfile.TemporaryDirectory(prefix="bench-gate-") as cache:
            wall, cpu, gate = run_gate(manifest, workers, Path(cache), ["--no-cache"])
        base = base or wall
        label = f"{workers}" + (" (all)" if workers == every else "")
        print(f"{label:>8} {wall:8.1f} {len(gate['cases']) / wall:8.2f} {base / wall:8.2f}x {cpu:7.1f} {cpu / wall:10.2f}  {gate['headline']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as cache:
        run_gate(manifest, every, Path(cache), [])
        wall, _, gate = run_gate(manifest, every, Path(cache), [])
    reused = sum(c["reused"] for c in gate["cases"])
    print(f"unchanged rerun on {every} worker(s): {wall:.1f} s, {reused} of {len(gate['cases'])} cases reused from the cache")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
