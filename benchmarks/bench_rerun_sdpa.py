"""The SDPA rerun at the seed's visual segment against a plain MLX SDPA call on the same arrays.

Q=1008 query rows, KV=1013 keys, 32 query heads over 8 KV heads, head dim 128, bfloat16,
causal (Qwen3-VL's visual prefill, seed 002). Three timings, best of several repeats, each
including mx.eval:
- plain: `mx.fast.scaled_dot_product_attention(q, k, v)`;
- rerun op: `backends.rerun.ops.sdpa` (head-chunk plan, executor, per-call route report);
- rerun compute: `backends.rerun.compute.compute_mlx("sdpa", ...)` from canonical layouts
  (q [heads, rows, dim], k [kv, rows, dim], v_proj [rows, kv*dim]) back to [rows, heads*dim],
  i.e. everything a rerun does for the op except reading the capture.
The overhead ratio is rerun / plain; it also checks that the rerun's bits equal the plain call's.

Run: .venv/bin/python benchmarks/bench_rerun_sdpa.py [--repeats N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from backends.rerun import ops as rerun_ops  # noqa: E402
from backends.rerun.compute import Routes, compute_mlx  # noqa: E402

Q, KV, H, HKV, D = 1008, 1013, 32, 8, 128


def best_of(repeats: int, work: Callable[[], mx.array]) -> tuple[float, mx.array]:
    out = work()
    mx.eval(out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = work()
        mx.eval(out)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = mx.Device(mx.cpu)
    mx.set_default_device(device)
    rng = np.random.default_rng(0)
    q = mx.array(rng.normal(size=(1, H, Q, D)).astype(np.float32)).astype(mx.bfloat16)
    k = mx.array(rng.normal(size=(1, HKV, KV, D)).astype(np.float32)).astype(mx.bfloat16)
    v = mx.array(rng.normal(size=(1, HKV, KV, D)).astype(np.float32)).astype(mx.bfloat16)
    mx.eval(q, k, v)
    scale = D**-0.5
    plain_s, plain = best_of(args.repeats, lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal"))
    op_s, run = best_of(args.repeats, lambda: rerun_ops.sdpa(q, k, v, scale=scale, mask="causal", device=device).output)
    v_proj = v[0].transpose(1, 0, 2).reshape(KV, HKV * D)[KV - Q :]
    history = {"k": k[0, :, : KV - Q], "v": v[0, :, : KV - Q]}
    arrays = {"q_rope": q[0], "k_rope": k[0, :, KV - Q :], "v_proj": v_proj}
    params = {"kv_heads": HKV, "scale": scale, "mask": "causal"}
    compute_s, computed = best_of(args.repeats, lambda: compute_mlx("sdpa", arrays, history, None, params, Routes(), device).output)
    same = np.array_equal(np.array(plain.view(mx.uint16)), np.array(run.view(mx.uint16)))
    same_compute = np.array_equal(
        np.array(plain[0].transpose(1, 0, 2).reshape(Q, H * D).view(mx.uint16)), np.array(computed.view(mx.uint16))
    )
    routed = rerun_ops.sdpa(q, k, v, scale=scale, mask="causal", device=device)
    print(f"SDPA Q={Q} KV={KV} H={H} Hkv={HKV} D={D} bfloat16 causal on {device} (MLX {mx.__version__}), best of {args.repeats}")
    print(f"  plain mx.fast.scaled_dot_product_attention: {plain_s * 1000:8.1f} ms")
    print(f"  rerun_ops.sdpa:                            {op_s * 1000:8.1f} ms   overhead ratio {op_s / plain_s:.3f}")
    print(f"  rerun compute (canonical layouts in/out):  {compute_s * 1000:8.1f} ms   overhead ratio {compute_s / plain_s:.3f}")
    print(f"  calls: {len(routed.calls)} ({'chunked' if routed.chunked else 'unchunked: rows > 32'}), "
          f"primitive here {routed.calls[0].primitive}, Metal would take {routed.calls[0].metal_primitive}")
    print(f"  bits equal to the plain call: rerun op {same}, rerun compute {same_compute}")


if __name__ == "__main__":
    main()
