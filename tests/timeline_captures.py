"""Hand-built capture pairs with dispatch tables, for the timeline tests (real files, real writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter


def write_dispatch_capture(
    path: Path,
    *,
    role: str,
    ops: int,
    heads_per_call: int,
    q_heads: int = 48,
    kv_heads: int = 2,
    q_rows: int = 1,
    primitive: str = "fallback",
    metal_primitive: str = "sdpa_vector",
    device: str = "cpu",
    layers: int = 2,
) -> Path:
    """`ops` attention ops named by canonical op (layer alternating), each split into calls of
    `heads_per_call` query heads per KV group (0 = one unchunked call)."""
    meta = CaptureMeta(role=role, device=device, compiler="mlx 0.32.4", provenance={"mlx_version": "0.32.4"})
    gqa = q_heads // kv_heads
    with CaptureWriter(path, meta) as writer:
        for op in range(ops):
            step, layer = op // layers, op % layers
            seq = writer.add_tensor("sdpa", np.zeros((q_rows, 4), dtype=np.float32), step=step, segment="decode", layer=layer)
            if heads_per_call == 0:
                calls = [(-1, 0, q_heads)]
            else:
                calls = [(g, g * gqa + s, min(heads_per_call, gqa - s)) for g in range(kv_heads) for s in range(0, gqa, heads_per_call)]
            for number, (group, start, count) in enumerate(calls):
                writer.add_dispatch(
                    index_seq=seq, call=number, kv_group=group, head_start=start, head_count=count, q_heads=q_heads,
                    kv_heads=kv_heads, q_rows=q_rows, kv_len=100 + step, head_dim=128, mask_kind="none", dtype="bfloat16",
                    primitive=primitive, metal_primitive=metal_primitive, t_start_ns=op * 1000 + number * 10,
                    t_end_ns=op * 1000 + number * 10 + 8,
                )
            if step != (op + 1) // layers:
                writer.end_step()
    return path
