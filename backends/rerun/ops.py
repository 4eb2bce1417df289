"""The ops a rerun recomputes through MLX, each with the route choices that change its bits.

A rerun tests a hypothesis ("the native's attention contract explains the difference"), so
every op is run the way one engine ran it, and what actually ran is returned beside the
output: for SDPA the head-chunk plan's calls and, per call, the primitive MLX takes on the
device used. The ops call the same MLX functions mlx-lm calls (`mx.fast.rms_norm`,
`mx.fast.rope`, mlx-lm's compiled `swiglu`, `mx.fast.scaled_dot_product_attention`), and the
same head-chunk executor the engines use (`backends.kernels.head_chunk`), so a rerun of a record on
the same route and device reproduces its bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from backends.engines.capture_sink import call_shape, mask_kind
from backends.kernels import attention_contracts as contracts
from backends.kernels import metal_routes
from backends.kernels.head_chunk import (
    DEFAULT_CHUNK_LIMIT,
    SdpaCall,
    plan_calls,
    plan_head_chunks,
    run_calls,
)

MLX_SDPA = "mlx.fast.sdpa"
"""Attention route: MLX's own primitive (on a CPU stream, always its decomposed fallback)."""
ATTENTION_ROUTES = (MLX_SDPA, contracts.SINGLE_RANGE, contracts.TILED_64)

SILU_THEN_MUL = "silu_then_mul"
MUL_THEN_SIGMOID = "mul_then_sigmoid"
SWIGLU_ORDERS = (SILU_THEN_MUL, MUL_THEN_SIGMOID)

DTYPES: dict[str, mx.Dtype] = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}

Mask = mx.array | str | None


class RerunOpError(ValueError):
    """An op cannot run as asked (an unknown route, a mask a contract cannot take, ...)."""


@dataclass(frozen=True)
class RoutedCall:
    """One SDPA primitive call of a rerun: its head range and the primitive it took."""

    call: SdpaCall
    primitive: str
    rule: str
    metal_primitive: str
    """What Metal MLX (the route table's newest release) would take for this call's shape."""


@dataclass(frozen=True)
class SdpaRun:
    output: mx.array
    route: str
    chunked: bool
    calls: tuple[RoutedCall, ...]
    mask_kind: str
    q_heads: int
    kv_heads: int
    head_dim: int


def sdpa(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    scale: float,
    mask: Mask = None,
    route: str = MLX_SDPA,
    head_chunk: bool = True,
    chunk_limit: int = DEFAULT_CHUNK_LIMIT,
    device: mx.Device | None = None,
) -> SdpaRun:
    """Attention of [B, H, L, D] q over [B, Hkv, S, D] k/v, head-chunked by the MTPLX rule when on.

    `route` is MLX's primitive or one of the demo engines' explicit reduction contracts
    (which take a causal mask or none). The mask goes to every chunk unchanged, as MTPLX
    passes it; a head-specific mask that cannot broadcast to a chunk is refused by MLX.
    """
    if route not in ATTENTION_ROUTES:
        raise RerunOpError(f"attention route must be one of {', '.join(ATTENTION_ROUTES)}, not {route!r}")
    kind = mask_kind(mask)
    if route != MLX_SDPA and kind not in ("none", "causal"):
        raise RerunOpError(f"the {route} contract takes a causal mask or none; this call has a {kind} mask")
    device = device or mx.default_device()
    _, q_heads, q_rows, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    plan = plan_head_chunks(q_rows, q_heads, kv_heads, enabled=head_chunk, chunk_limit=chunk_limit)
    calls = plan_calls(plan, q_rows, q_heads, kv_len)

    def kernel(call: SdpaCall, qc: mx.array, kc: mx.array, vc: mx.array, m: Mask) -> mx.array:
        if route == MLX_SDPA:
            return mx.fast.scaled_dot_product_attention(qc, kc, vc, scale=scale, mask=m, stream=device)
        return contracts.contract_attention(route, qc, kc, vc, scale=scale, causal=m == "causal")

    with mx.stream(device):
        out = run_calls(q, k, v, mask, calls, kernel)
        mx.eval(out)
    dtype = str(q.dtype).removeprefix("mlx.core.")
    routed = []
    for call in calls:
        shape = call_shape(call, kv_heads, head_dim, v.shape[-1], kind, dtype)
        executed = metal_routes.executed_route(shape, device) if route == MLX_SDPA else None
        routed.append(
            RoutedCall(
                call,
                executed.primitive if executed else metal_routes.FALLBACK,
                executed.rule if executed else f"{route}: written with ordinary MLX ops, no fused kernel",
                metal_routes.metal_route(shape).primitive,
            )
        )
    return SdpaRun(out, route, plan is not None, tuple(routed), kind, q_heads, kv_heads, head_dim)


def rms_norm(x: mx.array, weight: mx.array, eps: float, device: mx.Device | None = None) -> mx.array:
    """What `nn.RMSNorm` runs: fp32 normalisation, a cast, then the weight in the input dtype."""
    with mx.stream(device or mx.default_device()):
        return mx.fast.rms_norm(x, weight, eps)


def rope(x: mx.array, *, dims: int, base: float, offset: int, traditional: bool = False, device: mx.Device | None = None) -> mx.array:
    """What `nn.RoPE` runs on [..., rows, dim] for positions offset.. (NeoX halves by default)."""
    with mx.stream(device or mx.default_device()):
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=1.0, offset=offset)


def swiglu(gate: mx.array, up: mx.array, order: str = SILU_THEN_MUL, device: mx.Device | None = None) -> mx.array:
    """SwiGLU in one of the two evaluation orders the demo engines use.

    silu_then_mul is mlx-lm's own compiled `swiglu` (silu(gate) * up); mul_then_sigmoid is
    (gate * up) * sigmoid(gate). In bf16 every product rounds, so the orders differ in bits.
    """
    if order not in SWIGLU_ORDERS:
        raise RerunOpError(f"SwiGLU order must be one of {', '.join(SWIGLU_ORDERS)}, not {order!r}")
    with mx.stream(device or mx.default_device()):
        if order == SILU_THEN_MUL:
            return mlx_lm_swiglu(gate, up)
        return (gate * up) * mx.sigmoid(gate)


def linear(x: mx.array, weight: mx.array, bias: mx.array | None = None, device: mx.Device | None = None) -> mx.array:
    """What `nn.Linear` runs: x @ W^T, or addmm with a bias."""
    with mx.stream(device or mx.default_device()):
        if bias is None:
            return x @ weight.T
        return mx.addmm(bias, x, weight.T)


def residual_add(a: mx.array, b: mx.array, device: mx.Device | None = None) -> mx.array:
    with mx.stream(device or mx.default_device()):
        return a + b
