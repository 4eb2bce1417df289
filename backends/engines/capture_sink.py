"""Where a demo engine puts what it computes: MLX arrays in, capture records out.

Both demo engines record through this one class, so their bf16 bits reach the file the same
way (`.view(mx.uint16)`, which keeps signed zeros and NaN payloads) and their dispatch events
carry the same fields, including the Metal route predicted for each call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from backends.kernels import metal_routes
from backends.kernels.head_chunk import SdpaCall
from sessions.capture.writer import CaptureWriter

_BIT_VIEWS = {mx.bfloat16: (mx.uint16, "bfloat16"), mx.float16: (mx.uint16, "float16")}


def to_numpy_bits(array: mx.array) -> tuple[np.ndarray, str]:
    """The array's exact bits as numpy, with the logical dtype name the capture stores."""
    view = _BIT_VIEWS.get(array.dtype)
    if view is None:
        values = np.array(array)
        return values, values.dtype.name
    return np.array(array.view(view[0])), view[1]


def mask_kind(mask: mx.array | str | None) -> str:
    if mask is None:
        return "none"
    if isinstance(mask, str):
        return mask
    return "bool" if mask.dtype == mx.bool_ else "additive"


def call_shape(
    call: SdpaCall, kv_heads: int, head_dim: int, v_head_dim: int, kind: str, dtype: str
) -> metal_routes.SdpaShape:
    """The shape the route predictor sees for one call: a chunked call spans a single KV head."""
    call_kv = kv_heads if call.kv_group == -1 else 1
    return metal_routes.SdpaShape(call.q_rows, call.head_count, call_kv, head_dim, v_head_dim, call.kv_len, kind, dtype)


@dataclass(frozen=True)
class DispatchedCall:
    """One attention call as the dispatch table records it: its head range and both routes."""

    call: SdpaCall
    primitive: str
    metal_primitive: str
    t_start_ns: int = 0
    t_end_ns: int = 0


def add_dispatch_events(
    writer: CaptureWriter,
    index_seq: int,
    events: Iterable[DispatchedCall],
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    mask_kind: str,
    dtype: str,
) -> None:
    """The dispatch rows of one attention op, numbered in call order (engines and reruns alike)."""
    for number, event in enumerate(events):
        call = event.call
        writer.add_dispatch(
            index_seq=index_seq,
            call=number,
            kv_group=call.kv_group,
            head_start=call.head_start,
            head_count=call.head_count,
            q_heads=q_heads,
            kv_heads=kv_heads,
            q_rows=call.q_rows,
            kv_len=call.kv_len,
            head_dim=head_dim,
            mask_kind=mask_kind,
            dtype=dtype,
            primitive=event.primitive,
            metal_primitive=event.metal_primitive,
            t_start_ns=event.t_start_ns,
            t_end_ns=event.t_end_ns,
        )


class CaptureSink:
    """One engine run's recorder: the writer plus the current token step and segment."""

    def __init__(self, writer: CaptureWriter) -> None:
        self.writer = writer
        self.step = 0
        self.segment = ""
        self.position = -1
        """The token position of the current call's first row (-1: not tracked by this engine)."""

    def now_ns(self) -> int:
        return self.writer.now_ns()

    def tensor(
        self,
        name: str,
        array: mx.array,
        *,
        layer: int = -1,
        t_start_ns: int | None = None,
        kernel_id: str = "",
        contract_id: str = "",
        effective_contract_id: str = "",
    ) -> int:
        mx.eval(array)
        bits, dtype = to_numpy_bits(array)
        return self.writer.add_tensor(
            name,
            bits,
            step=self.step,
            segment=self.segment,
            layer=layer,
            dtype=dtype,
            kernel_id=kernel_id,
            contract_id=contract_id,
            effective_contract_id=effective_contract_id,
            t_start_ns=t_start_ns,
            position=self.position,
        )

    def dispatch(
        self,
        index_seq: int,
        calls: list[tuple[SdpaCall, int, int]],
        *,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        mask: mx.array | str | None,
        dtype: str,
    ) -> None:
        """One event per timed call; `metal_primitive` is Metal MLX's pick for that call's shape."""
        kind = mask_kind(mask)
        events = []
        for call, t_start, t_end in calls:
            shape = call_shape(call, kv_heads, head_dim, head_dim, kind, dtype)
            events.append(
                DispatchedCall(
                    call,
                    metal_routes.executed_route(shape).primitive,
                    metal_routes.metal_route(shape).primitive,
                    t_start,
                    t_end,
                )
            )
        add_dispatch_events(
            self.writer, index_seq, events, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, mask_kind=kind, dtype=dtype
        )
