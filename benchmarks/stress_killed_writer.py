"""SIGKILL a realistic capture writer at random times and check that every file it leaves opens.

Issue 2 promises that a run killed anywhere leaves a readable, clearly incomplete prefix. One
kill tells little (a torn file needs the kill to land in a short window), so this runs many:
each kill starts a writer process that streams token steps (tens of tensors per step, KB to
MB each, bfloat16 and float32, with and without compression, each with a `ggml_src` recorder
attribute), kills it after a random delay, then opens the file with `open_capture` (structural
check in a child, as users open files) and checks that it says it is incomplete, shows whole
steps only, at least every step the writer had reported finished, and that every tensor holds
exactly the bits and the attribute written.

Run:  .venv/bin/python benchmarks/stress_killed_writer.py kill --kills 200 --out results.jsonl
      .venv/bin/python benchmarks/stress_killed_writer.py summary results.jsonl
      .venv/bin/python benchmarks/stress_killed_writer.py speed --steps 30

`--root DIR` runs the writer from another checkout (e.g. `git archive HEAD | tar -x -C DIR`),
to measure a change against the code before it. Results are appended one JSON line per kill,
so batches can run in the background and be summed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

LAYERS = 4
HIDDEN = 1024
VOCAB = 32768
COMPRESSIONS = ("", "gzip", "lzf")


def step_plan(step: int) -> list[tuple[str, int, str, tuple[int, ...]]]:
    """(name, layer, dtype, shape) of every tensor of one step: 9 per layer plus embeddings and
    logits; prefill (step 0) holds 16 rows, decode steps one. 4 KB to 2 MB per tensor."""
    rows = 16 if step == 0 else 1
    plan: list[tuple[str, int, str, tuple[int, ...]]] = [("inp_embd", -1, "bfloat16", (rows, HIDDEN))]
    for layer in range(LAYERS):
        plan += [
            (f"attn_norm-{layer}", layer, "float32", (rows, HIDDEN)),
            (f"Qcur-{layer}", layer, "bfloat16", (rows, 16, 64)),
            (f"Kcur-{layer}", layer, "bfloat16", (rows, 4, 64)),
            (f"Vcur-{layer}", layer, "bfloat16", (rows, 4, 64)),
            (f"kqv_out-{layer}", layer, "bfloat16", (rows, HIDDEN)),
            (f"ffn_inp-{layer}", layer, "float32", (rows, HIDDEN)),
            (f"ffn_gate-{layer}", layer, "bfloat16", (rows, 4 * HIDDEN)),
            (f"ffn_out-{layer}", layer, "float32", (rows, HIDDEN)),
            (f"l_out-{layer}", layer, "float32", (rows, HIDDEN)),
        ]
    plan += [("result_norm", -1, "float32", (rows, HIDDEN)), ("result_output", -1, "float32", (rows, VOCAB))]
    return plan


def tensor_data(seed: int, step: int, position: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The bits of one tensor, reproducible from where it sits: the checker regenerates them."""
    rng = np.random.default_rng((seed, step, position))
    if dtype == "bfloat16":
        return rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return rng.standard_normal(size=shape, dtype=np.float32)


def run_writer(path: str, compression: str, seed: int, steps: int) -> None:
    """The killed process: streams steps until killed (or `steps` steps, then closes), printing
    `step N` after each `end_step` returns, i.e. once the writer says the step is safe."""
    from sessions.capture.meta import CaptureMeta
    from sessions.capture.writer import CaptureWriter

    writer = CaptureWriter(path, CaptureMeta(role="native", engine_name="stress", seed=seed), compression=compression or None)
    print("ready", flush=True)
    step = 0
    while steps < 0 or step < steps:
        segment = "prefill" if step == 0 else "decode"
        for position, (name, layer, dtype, shape) in enumerate(step_plan(step)):
            seq = writer.add_tensor(
                name, tensor_data(seed, step, position, dtype, shape), step=step, segment=segment, layer=layer, dtype=dtype,
                attrs={"ggml_src": json.dumps(source_names(step, position))},
            )
            if name.startswith("kqv_out"):
                writer.add_dispatch(
                    index_seq=seq, call=0, kv_group=-1, head_start=0, head_count=16, q_heads=16, kv_heads=4,
                    q_rows=shape[0], kv_len=16 + step, head_dim=64, mask_kind="causal", dtype="bfloat16", primitive="fallback",
                )
        writer.add_token(step=step, segment=segment, token_id=step, is_stop=False)
        writer.end_step()
        print(f"step {step}", flush=True)
        step += 1
    writer.close()


def source_names(step: int, position: int) -> list[str]:
    """The `ggml_src` the writer gives each tensor (a recorder attribute, in its pack's table)."""
    return [f"blk.{position}.weight", f"node-{step}-{position}"]


def check_file(path: Path, seed: int, steps_reported: int) -> tuple[str, str]:
    """('ok' | 'open' | 'content', detail) for the file a killed writer left."""
    from sessions.capture.opening import open_capture
    from sessions.capture.reader import CaptureError
    from sessions.compare.record_sources import record_sources

    if not path.exists():  # the writer renames its file to `path` at its first committed step
        return ("ok", "no file: killed before its first step") if steps_reported == 0 else ("content", f"no file, though the writer had finished {steps_reported} steps")
    try:
        capture = open_capture(path)
    except CaptureError as exc:
        return "open", f"{exc.location}: {exc.problem}"
    with capture:
        if capture.complete:
            return "content", "a killed writer's file says it is complete"
        by_step = Counter(record.step for record in capture.records)
        steps = len(by_step)
        if sorted(by_step) != list(range(steps)):
            return "content", f"steps shown are {sorted(by_step)}"
        for step, count in by_step.items():
            if count != len(step_plan(step)):
                return "content", f"step {step} shows {count} of {len(step_plan(step))} records (a torn step)"
        if steps < steps_reported:
            return "content", f"shows {steps} steps; the writer had finished {steps_reported}"
        # /index is committed first, so the last step's tokens and dispatch rows may still be missing.
        if len(capture.tokens) not in (steps - 1, steps) or len(capture.dispatch) not in ((steps - 1) * LAYERS, steps * LAYERS):
            return "content", f"{len(capture.tokens)} tokens and {len(capture.dispatch)} dispatch rows for {steps} steps"
        positions: Counter[int] = Counter()
        sources = record_sources(capture)
        for record in capture.records:
            position = positions[record.step]
            positions[record.step] += 1
            expected = tensor_data(seed, record.step, position, record.dtype, record.shape)
            if not np.array_equal(capture.read_bits(record), expected):
                return "content", f"{record.path} ({record.name}, step {record.step}) holds other bits"
            if sources.get(record.seq) != tuple(source_names(record.step, position)):
                return "content", f"{record.path} ({record.name}, step {record.step}) has ggml_src {sources.get(record.seq)}"
    return "ok", f"{steps} steps"


def writer_command(root: Path, path: Path, compression: str, seed: int, steps: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "write", str(path), "--compression", compression,
            "--seed", str(seed), "--steps", str(steps), "--root", str(root)]


def kill_once(root: Path, work: Path, kill_id: int, rng: random.Random, max_delay_s: float) -> dict[str, object]:
    compression = COMPRESSIONS[kill_id % len(COMPRESSIONS)]
    seed = rng.randrange(1 << 30)
    path = work / f"k{kill_id}.h5"
    delay = rng.uniform(0.0, max_delay_s)
    child = subprocess.Popen(writer_command(root, path, compression, seed, -1), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        child.wait()
        return {"kill": kill_id, "result": "writer", "detail": "the writer did not start"}
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    lines = child.stdout.read().split()
    child.wait()
    steps_reported = sum(1 for word in lines if word == "step")
    result, detail = check_file(path, seed, steps_reported)
    return {"kill": kill_id, "compression": compression, "seed": seed, "delay_s": round(delay, 4),
            "steps_reported": steps_reported, "bytes": path.stat().st_size if path.exists() else 0, "result": result, "detail": detail}


def kill_many(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="stress-killed-"))
    os.environ["PARITY_XRAY_CACHE_DIR"] = str(work / "cache")
    rng = random.Random(args.seed)
    keep = Path(args.keep) if args.keep else None
    try:
        with open(args.out, "a") as out:
            for kill_id in range(args.first, args.first + args.kills):
                outcome = kill_once(Path(args.root), work, kill_id, rng, args.max_delay)
                out.write(json.dumps(outcome) + "\n")
                out.flush()
                path = work / f"k{kill_id}.h5"
                if outcome["result"] != "ok" and keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, keep / f"k{kill_id}-seed{outcome.get('seed')}.h5")
                if outcome["result"] != "ok":
                    print(json.dumps(outcome), flush=True)
                path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summary(args: argparse.Namespace) -> None:
    for name in args.results:
        rows = [json.loads(line) for line in Path(name).read_text().splitlines() if line.strip()]
        results = Counter(str(row["result"]) for row in rows)
        steps = [int(row.get("steps_reported", 0)) for row in rows]
        print(f"{name}: {len(rows)} kills, {results.get('ok', 0)} ok, failures {dict((k, v) for k, v in results.items() if k != 'ok')}, "
              f"steps finished before the kill: median {statistics.median(steps) if steps else 0}, max {max(steps, default=0)}")
        for row in rows:
            if row["result"] != "ok":
                print(f"  k{row['kill']} ({row.get('compression') or 'none'}, {row.get('steps_reported')} steps): {row['detail']}")


def speed(args: argparse.Namespace) -> None:
    """Time per step of an uninterrupted writer, per compression (median over steps after the first)."""
    work = Path(tempfile.mkdtemp(prefix="stress-speed-"))
    try:
        for compression in COMPRESSIONS:
            per_step: list[float] = []
            for repeat in range(args.repeats):
                path = work / f"speed-{compression or 'none'}-{repeat}.h5"
                child = subprocess.Popen(
                    writer_command(Path(args.root), path, compression, 7, args.steps), stdout=subprocess.PIPE, text=True
                )
                assert child.stdout is not None
                last = None
                for line in child.stdout:
                    now = time.perf_counter()
                    if line.startswith("step") and last is not None and line != "step 0\n":
                        per_step.append(now - last)
                    last = now
                child.wait()
                path.unlink(missing_ok=True)
            print(f"{compression or 'none':5s} {1000 * statistics.median(per_step):7.2f} ms/step "
                  f"(decode steps, median of {len(per_step)}; p90 {1000 * sorted(per_step)[int(0.9 * len(per_step))]:.2f} ms)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="(the killed child) stream steps into PATH")
    write.add_argument("path")
    write.add_argument("--compression", default="")
    write.add_argument("--seed", type=int, default=0)
    write.add_argument("--steps", type=int, default=-1)
    write.add_argument("--root", default=str(ROOT))
    kill = commands.add_parser("kill", help="kill writers at random times and check each file")
    kill.add_argument("--kills", type=int, default=200)
    kill.add_argument("--first", type=int, default=0, help="number of the first kill (batches continue numbering)")
    kill.add_argument("--seed", type=int, default=1)
    kill.add_argument("--max-delay", type=float, default=1.5, help="kill up to this many seconds after the writer starts")
    kill.add_argument("--out", required=True, help="JSON lines file, appended to")
    kill.add_argument("--keep", default="", help="copy failing files here")
    kill.add_argument("--root", default=str(ROOT), help="checkout whose writer is killed")
    summ = commands.add_parser("summary", help="sum up result files")
    summ.add_argument("results", nargs="+")
    spd = commands.add_parser("speed", help="time per step without kills")
    spd.add_argument("--steps", type=int, default=30)
    spd.add_argument("--repeats", type=int, default=3)
    spd.add_argument("--root", default=str(ROOT))
    args = parser.parse_args()
    sys.path.insert(0, args.root if args.command == "write" else str(ROOT))
    if args.command == "write":
        run_writer(args.path, args.compression, args.seed, args.steps)
    elif args.command == "kill":
        kill_many(args)
    elif args.command == "summary":
        summary(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
