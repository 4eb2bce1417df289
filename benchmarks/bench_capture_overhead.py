"""What recording costs: llama.cpp or MLX decoding the same tokens with and without recording.

Run: .venv/bin/python benchmarks/bench_capture_overhead.py [--engine llama|mlx] [--variant f16] [--prompt 32] [--decode 16]
[--hidden H] [--whole-cache] [--keep DIR]

The model is the demo's Qwen3 architecture with bigger dimensions (3 layers, hidden 1024,
FFN 2816, 16 query / 4 KV heads, vocabulary 8192: about 51 M parameters, ~100 MB as F16),
seeded weights exported to GGUF. Printed: the GGUF size, the plain and recorded wall times
(best of `--repeats`), their ratio, the capture size, and whether the recorded run's logits
equal the plain run's bit for bit (they must: recording may cost time, never bits).
Both run llama.cpp in this process, not in the recording child `record llama` uses, so the
figures are the callback's cost without a process start-up on either side; both run with
the OpenMP wait the recording child sets (`brief_openmp_wait`: llama.cpp's idle threads spin
3,000 rounds, then sleep), unless `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` is set. `--engine mlx` runs
the same model as an mlx-lm directory (float32) on MLX's CPU stream: plain mlx-lm against
`record mlx`'s recorder, and compares the greedy tokens (the recorder must not change them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
from backends.demo.llama_pairs import demo_weights_f32  # noqa: E402
from backends.engines.demo_model import DemoConfig  # noqa: E402
from backends.engines.gguf_export import VARIANTS, export_gguf, write_mlx_model_dir  # noqa: E402
from backends.recorders.llama_process_env import brief_openmp_wait  # noqa: E402
from backends.recorders.llama_recorder import (  # noqa: E402
    LlamaSettings,
    iter_plain_here,
    iter_record_here,
)
from backends.recorders.mlx_recorder import iter_record_mlx, plain_run_mlx  # noqa: E402
from backends.recorders.record_schedule import TokenSchedule  # noqa: E402
from sessions.progress import run_to_end  # noqa: E402

BENCH_CONFIG = DemoConfig(
    hidden_size=1024, num_hidden_layers=3, intermediate_size=2816, num_attention_heads=16,
    num_key_value_heads=4, head_dim=64, vocab_size=8192, dead_gate_channels=8,
)


def main() -> int:
    brief_openmp_wait()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama", "mlx"), default="llama")
    parser.add_argument("--variant", choices=VARIANTS, default="f16", help="GGUF weights (llama only)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--decode", type=int, default=16, help="decode steps")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--whole-cache", action="store_true", help="llama: record the whole KV cache in every view at every step (the layout before written cells)")
    parser.add_argument("--keep", type=Path, help="write the GGUF and capture here instead of a temp dir")
    parser.add_argument("--hidden", type=int, default=BENCH_CONFIG.hidden_size, help="hidden size (FFN is 2.75x, heads of 64); larger: compute dominates")
    args = parser.parse_args()
    config = dataclasses.replace(
        BENCH_CONFIG, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 256),
    )
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as scratch:
        return measure(args, config, args.keep or Path(scratch))


def measure(args: argparse.Namespace, config: DemoConfig, work_dir: Path) -> int:
    """Plain and recorded runs side by side; the model and the capture are written to `work_dir`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    weights = demo_weights_f32(config, seed=0)
    params = sum(w.size for w in weights.values())
    rng = np.random.default_rng(1)
    schedule = TokenSchedule(tuple(int(t) for t in rng.integers(0, config.vocab_size, args.prompt)), args.decode)
    if args.engine == "mlx":
        return _mlx(write_mlx_model_dir(config.as_dict(), weights, work_dir / "mlx-bench"), params, schedule, work_dir / "bench.h5", args)
    gguf = export_gguf(config.as_dict(), weights, work_dir / f"bench.{args.variant}.gguf", args.variant)
    del weights
    settings = LlamaSettings(n_threads=args.threads, whole_cache=args.whole_cache)
    out = work_dir / "bench.h5"
    plain_times, recorded_times = [], []
    plain, recorded = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        plain = run_to_end(iter_plain_here(gguf, schedule, settings))
        plain_times.append(time.perf_counter() - start)
        out.unlink(missing_ok=True)
        start = time.perf_counter()
        recorded = run_to_end(iter_record_here(gguf, schedule, out, settings))
        recorded_times.append(time.perf_counter() - start)
    same = len(plain) == len(recorded) and all(a.tobytes() == b.tobytes() for a, b in zip(plain, recorded))
    best_plain, best_recorded = min(plain_times), min(recorded_times)
    print(f"model: {params / 1e6:.1f} M parameters, {gguf.name} {gguf.stat().st_size / 2**20:.1f} MiB")
    print(f"tokens: {args.prompt}-token prefill + {args.decode} decode steps, {args.threads} threads")
    print(f"plain decode:    {best_plain:.3f} s (best of {args.repeats})")
    print(f"recorded decode: {best_recorded:.3f} s (best of {args.repeats}; includes writing the capture)")
    print(f"overhead ratio:  {best_recorded / best_plain:.2f}x")
    print(f"capture: {out.stat().st_size / 2**20:.1f} MiB")
    print(f"logits identical with capture on: {same}")
    return 0 if same else 1


def _mlx(model_dir: Path, params: int, schedule: TokenSchedule, out: Path, args: argparse.Namespace) -> int:
    plain_times, recorded_times = [], []
    plain: list[int] = []
    recorded: list[int] = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        plain = plain_run_mlx(model_dir, schedule)
        plain_times.append(time.perf_counter() - start)
        out.unlink(missing_ok=True)
        start = time.perf_counter()
        recorded = run_to_end(iter_record_mlx(model_dir, schedule, out))
        recorded_times.append(time.perf_counter() - start)
    best_plain, best_recorded = min(plain_times), min(recorded_times)
    print(f"model: {params / 1e6:.1f} M parameters, mlx-lm float32 on the CPU stream")
    print(f"tokens: {args.prompt}-token prefill + {args.decode} decode steps")
    print(f"plain mlx-lm:    {best_plain:.3f} s (best of {args.repeats}; both load the model)")
    print(f"recorded:        {best_recorded:.3f} s (best of {args.repeats}; includes writing the capture)")
    print(f"overhead ratio:  {best_recorded / best_plain:.2f}x")
    print(f"capture: {out.stat().st_size / 2**20:.1f} MiB")
    print(f"greedy tokens identical with recording on: {plain == recorded}")
    return 0 if plain == recorded else 1


if __name__ == "__main__":
    sys.exit(main())
