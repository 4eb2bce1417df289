"""Time `parity-xray report` against `h5diff -r` and a plain `cat` of the same bytes.

Builds a native/oracle capture pair of at least 1 GB in total (bfloat16 residual-stream
tensors, one single-ULP flip planted in the oracle), then runs, in one go and in that order,
--repeat times: cat of both files to /dev/null, h5diff -r, and the report (cache off) exactly as
a user types it (`parity-xray report`, through viewer.cli). Ratios are taken within each round,
so load from other processes hits all three alike; the median round is the result. Before the
rounds the report runs once on the new files, timed on its own: that run pays the one-time
structure check of each file and compiles bytecode (kept under --dir, as an installed package
has it). The report is then run twice more with the sidecar cache. Targets: report faster than
h5diff, within 2x of cat. --cold drops the page cache before every command (root only).
The report is timed with 1, 2 and all cores' worker processes (--workers); the goal for a
multi-GB pair is at least 2x h5diff's speed and within 2x of cat.

With `--records N` the pair is instead N records per side in 36-layer token steps (a real 8B
model's run is about 240,000), each a bfloat16 tensor of `--record-shape` (default 4,16: 128
bytes), one bit apart at 60% of the run: the cost that grows with records, not bytes. With
`--diverged` every record after it differs in most of its elements by 1-3 ULP, as in a run
whose first error reaches every later op: the cost of the diff engine per differing record.
Without `--records`, `--diverged` makes the 64 MiB tensors of the layers after the middle one
differ so: the diff engine's cost per element of a prefill's large records.

Each round also times `python -c "import numpy, h5py"`: the start-up any Python HDF5 reader pays
before its first byte. On a warm 1 GB pair that alone is about 2x cat, so the script also prints
the report's time beyond it against cat -- the part this project's code decides.

`--align positions` times the report pairing records by token position, as it pairs runs cut
differently. `--json` times it writing its JSON document too, as a CI pipeline runs it: a
document of about 1 KB per pair.

Usage: python benchmarks/bench_report.py [--dir /tmp/parity-xray-bench] [--gib 1.0 | --records N [--record-shape R,C]] [--diverged]
       [--repeat 3] [--cold] [--keep] [--workers 1,2,all] [--align auto|calls|positions] [--json]
h5diff comes with the hdf5-tools package (apt-get install hdf5-tools).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sessions.capture.meta import CaptureMeta  # noqa: E402
from sessions.capture.writer import CaptureWriter  # noqa: E402
from sessions.machine import usable_cores  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from many_records import build_many_records_pair, many_records_paths  # noqa: E402

REPORT_COMMAND = [sys.executable, "-m", "viewer.cli", "report"]
"""`parity-xray report`: the console script's entry point, viewer.cli.main."""
FLOOR_COMMAND = [sys.executable, "-c", "import numpy, h5py"]
"""What any Python tool that reads HDF5 pays before its first byte: the interpreter, numpy and h5py."""

ROWS, HIDDEN = 4096, 8192
"""One [rows, hidden] bfloat16 tensor is 64 MiB."""


def build(directory: Path, total_bytes: int, diverged: bool = False) -> tuple[Path, Path, str]:
    """64 MiB tensors; with `diverged`, the flip is planted in the middle layer and the layers after
    it differ in most elements by 1-3 ULP: a prefill's large records through the diff engine, not
    only past its memcmp."""
    per_tensor = ROWS * HIDDEN * 2
    layers = max(1, -(-total_bytes // (2 * per_tensor)))
    planted_layer, planted = (layers // 2 if diverged else layers - 2 if layers > 1 else 0), (ROWS - 7, HIDDEN // 3)
    paths = []
    for role in ("native", "oracle"):
        path = directory / f"bench.{role}.h5"
        meta = CaptureMeta(role=role, engine_name=f"bench-{role}", model_id="bench", weights_hash="sha256:bench", prompt="bench")
        writer = CaptureWriter(path, meta)
        gen = np.random.default_rng(0)
        for layer in range(layers):
            bits = gen.integers(0x3C00, 0x4000, size=(ROWS, HIDDEN), dtype=np.uint16)
            if role == "oracle" and layer == planted_layer:
                bits[planted] ^= 1
            if role == "oracle" and diverged and layer > planted_layer:
                bits ^= np.random.default_rng(layer).integers(0, 4, size=bits.shape, dtype=np.uint16)
            writer.add_tensor("layer_out", bits, step=0, segment="prefill", layer=layer, dtype="bfloat16")
            writer.end_step()
        writer.close()
        paths.append(path)
    after = range(planted_layer + 1, layers) if diverged else range(0)
    spread = f", and layer {after[0]} diverged" if len(after) == 1 else f", and layers {after[0]}-{after[-1]} diverged" if after else ""
    where = f"step 0 prefill layer {planted_layer} layer_out at {list(planted)}{spread}"
    return paths[0], paths[1], where


def timed(command: list[str], env: dict[str, str] | None = None, output: bool = True) -> tuple[float, int, str]:
    """Seconds, exit status and (with `output`) what the command printed. h5diff's output is
    thrown away: on a diverged run it prints every differing element, hundreds of millions of
    lines, which held in memory here took this script past 24 GB."""
    start = time.perf_counter()
    stdout = subprocess.PIPE if output else subprocess.DEVNULL
    done = subprocess.run(command, stdout=stdout, stderr=subprocess.STDOUT, env=env, text=True, errors="replace")
    return time.perf_counter() - start, done.returncode, done.stdout or ""


def _drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _read_into_cache(*paths: Path):  # type: ignore[no-untyped-def]
    def warm() -> None:
        subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)

    return warm


def _round(mode: str, native: Path, oracle: Path, h5diff: str, report: list[str], env: dict[str, str], workers: list[int]) -> dict[str, float]:
    """One cat / h5diff / report (per worker count) round; every command starts from the same page-cache state."""
    prepare = _drop_page_cache if mode == "cold" else _read_into_cache(native, oracle)
    prepare()
    cat_s, _, _ = timed(["sh", "-c", f"cat '{native}' '{oracle}' > /dev/null"])
    prepare()
    h5_s, h5_rc, _ = timed([h5diff, "-r", str(native), str(oracle)], output=False)
    times = {"cat": cat_s, "h5diff": h5_s}
    line = f"  cat {cat_s:6.2f} s | h5diff -r {h5_s:6.2f} s (exit {h5_rc})"
    for n in workers:
        prepare()
        rep_s, rep_rc, rep_out = timed(report + ["--no-cache", "--workers", str(n)], env)
        verdict = next((text for text in rep_out.splitlines() if text.startswith("DIVERGENCE") or text.startswith("PARITY")), None)
        found = rep_out[-300:] if verdict is None else verdict.split(" (")[0]  # the headline up to its figures; else the error's tail
        times[f"report{n}"] = rep_s
        line += f" | report x{n} {rep_s:6.2f} s (exit {rep_rc}: {found[:80]})"
    prepare()
    times["floor"], _, _ = timed(FLOOR_COMMAND, env)
    print(line + f" | python+numpy+h5py start-up {times['floor']:5.2f} s")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/parity-xray-bench")
    parser.add_argument("--gib", type=float, default=1.0, help="total size of the pair in GiB (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per page-cache mode (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the captures afterwards")
    parser.add_argument("--cold", action="store_true", help="also time each command after dropping the page cache (root only)")
    parser.add_argument("--workers", default="1,2,all", help="report worker counts to time, comma-separated; all = one per core (default 1,2,all)")
    parser.add_argument("--records", type=int, help="instead of --gib: this many records per side (240000: a real 8B model's run)")
    parser.add_argument("--record-shape", default="4,16", help="with --records: each record's rows,cols (default 4,16)")
    parser.add_argument("--align", default="auto", choices=("auto", "calls", "positions"), help="the report's --align (positions: the pairing of runs cut differently)")
    parser.add_argument("--diverged", action="store_true", help="every record (with --gib: every tensor of the layers) after the planted one differs in most elements (a diverged run)")
    parser.add_argument("--json", action="store_true", help="the report also writes its JSON document (--json), as a CI pipeline runs it")
    args = parser.parse_args()
    cores = usable_cores()
    workers = sorted({cores if w.strip() == "all" else int(w) for w in args.workers.split(",")})
    h5diff = shutil.which("h5diff")
    if h5diff is None:
        print("h5diff not found: install hdf5-tools", file=sys.stderr)
        return 2
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    shape = tuple(int(n) for n in args.record_shape.split(","))
    need = int(args.gib * 1024**3) if not args.records else 2 * args.records * shape[0] * shape[1] * 2
    if args.records and all(path.exists() for path in many_records_paths(directory, args.records, (shape[0], shape[1]), args.diverged)):
        need = 0  # reused (a real model's 31.7 GB pair was refused for the room it would take to build it again)
    free = shutil.disk_usage(directory).free
    if free < need * 1.2:
        print(f"{directory}: {free / 1024**3:.1f} GiB free, need {need * 1.2 / 1024**3:.1f}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.records:
        native, oracle = build_many_records_pair(directory, args.records, (shape[0], shape[1]), args.diverged)
        planted = f"record {args.records * 3 // 5}{' and every later one' if args.diverged else ''} of {args.records:,} ({shape[0]}x{shape[1]} bfloat16 each)"
    else:
        native, oracle, planted = build(directory, need, args.diverged)
    size = native.stat().st_size + oracle.stat().st_size
    print(f"built {size / 1e9:.2f} GB pair in {time.perf_counter() - t0:.1f} s; planted 1-ULP flip at {planted}")
    env = dict(os.environ, XDG_CACHE_HOME=str(directory / "cache"), PYTHONPYCACHEPREFIX=str(directory / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    report = REPORT_COMMAND + [str(native), str(oracle), "--align", args.align] + (["--json", str(directory / "report.json")] if args.json else [])
    os.chdir(ROOT)
    first_s, _, _ = timed(report + ["--no-cache"], env)
    print(f"report, first open of the new files (one-time structure check, bytecode compiled): {first_s:.2f} s")
    modes = ["warm"] + (["cold"] if args.cold else [])
    for mode in modes:
        print(f"[{mode} page cache]")
        rounds = [_round(mode, native, oracle, h5diff, report, env, workers) for _ in range(max(1, args.repeat))]
        most = f"report{workers[-1]}"
        middle = sorted(rounds, key=lambda r: r[most] / r["cat"])[len(rounds) // 2]
        print(f"  median round: cat {middle['cat']:.2f} s ({size / middle['cat'] / 1e9:.2f} GB/s), h5diff {middle['h5diff']:.2f} s ({cores} cores here)")
        for n in workers:
            rep = middle[f"report{n}"]
            print(f"  report x{n:<2}  {rep:6.2f} s   report / h5diff {rep / middle['h5diff']:5.2f} (target <= 0.5)   report / cat {rep / middle['cat']:5.2f} (target <= 2)"
                  f"   (report - start-up) / cat {(rep - middle['floor']) / middle['cat']:5.2f}")
        print(f"  start-up / cat   {middle['floor'] / middle['cat']:7.2f}  (the interpreter, numpy and h5py alone)")
    timed(report, env)
    cached_s, _, _ = timed(report, env)
    print(f"report, second open (sidecar cache hit): {cached_s:.2f} s")
    if not args.keep:
        native.unlink()
        oracle.unlink()
        (directory / "report.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
