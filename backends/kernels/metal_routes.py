"""Which MLX primitive an SDPA call takes, on Metal and here.

The bits of an attention output depend on the kernel MLX picks for the call's shape, and the
pick is invisible from Python. The rules below were read from
`mlx/backend/metal/scaled_dot_product_attention.cpp` (`has_fused_kernel`,
`ScaledDotProductAttention::use_fallback`, `eval_gpu`) and `mlx/fast.cpp`, and every decision
names the rule that made it and the source it was read from. A version with no rule table is
answered "unknown": routing changes between releases (head dims 72 and 96 joined the full
kernel in 0.32.1, a NAX path for head dim 256 came after it), so guessing would mislead.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

SDPA_VECTOR = "sdpa_vector"
SDPA_VECTOR_2PASS = "sdpa_vector_2pass"
SDPA_FULL = "sdpa_full"
FALLBACK = "fallback"
UNKNOWN = "unknown"

RULES_SOURCE = "ml-explore/mlx@846d176 (v0.32.1-26, version.h 0.32.2)"
RULES_VERSIONS = ("0.32.2", "0.32.3", "0.32.4")
"""Releases this table describes. It was read at the commit that became 0.32.2; the team's
route facts state the same routing for the 0.32.4 build, and the seed's 0.32.2 record
(head dim 256 on the vector kernel only through eight rows) agrees. Anything else is unknown."""

FULL_HEAD_DIMS = frozenset({64, 72, 80, 96, 128, 192, 256})
VECTOR_HEAD_DIMS = frozenset({64, 96, 128, 192, 256})
VECTOR_ROWS_MAX = 8
VECTOR_ROWS_TIMES_GQA_MAX = 32
TWO_PASS_KV_LARGE_DEVICE = 1024
TWO_PASS_KV_GQA = 4096
NAX_MIN_ROWS = 1024


@dataclass(frozen=True)
class DeviceClass:
    """What the route depends on about the device.

    `large` is a GPU whose architecture name ends in 'd' or 's' (MLX reads
    `get_architecture().back()`); `nax` a GPU with neural accelerators; `tf32` whether
    MLX_ENABLE_TF32 is on (it lets float32 use the NAX path).
    """

    gpu: bool
    large: bool = False
    nax: bool = False
    tf32: bool = False

    @staticmethod
    def from_architecture(architecture: str, nax: bool = False, tf32: bool = False) -> "DeviceClass":
        return DeviceClass(gpu=True, large=architecture[-1:] in ("d", "s"), nax=nax, tf32=tf32)


CPU = DeviceClass(gpu=False)
GPU = DeviceClass(gpu=True)
GPU_LARGE = DeviceClass(gpu=True, large=True)


@dataclass(frozen=True)
class SdpaShape:
    """One call as `mx.fast.scaled_dot_product_attention` sees it (q, k, v as [B, H, L, D])."""

    q_rows: int
    q_heads: int
    kv_heads: int
    q_head_dim: int
    v_head_dim: int
    kv_len: int
    mask_kind: str = "none"
    dtype: str = "bfloat16"

    @property
    def gqa(self) -> int:
        return self.q_heads // self.kv_heads


@dataclass(frozen=True)
class Route:
    primitive: str
    rule: str
    """The rule that decided, e.g. 'has_fused_kernel: vector q_len*GQA'."""
    reason: str
    source: str


def _route(primitive: str, rule: str, reason: str) -> Route:
    return Route(primitive, rule, reason, RULES_SOURCE)


def _no_fused_kernel(s: SdpaShape) -> Route | None:
    """`has_fused_kernel`: shapes no fused kernel handles."""
    if s.q_rows > VECTOR_ROWS_MAX:
        if not (s.q_head_dim == s.v_head_dim and s.q_head_dim in FULL_HEAD_DIMS):
            return _route(FALLBACK, "has_fused_kernel: full head dims", f"full kernel lacks q/v head dims {s.q_head_dim}/{s.v_head_dim}")
        if s.mask_kind == "causal" and s.q_rows > s.kv_len:
            return _route(FALLBACK, "has_fused_kernel: full causal q_len<=kv_len", f"causal with q_len {s.q_rows} > kv_len {s.kv_len}")
        return None
    vector_dims = (s.q_head_dim == s.v_head_dim and s.q_head_dim in VECTOR_HEAD_DIMS) or (
        s.q_head_dim == 192 and s.v_head_dim == 128
    )
    if not vector_dims:
        return _route(FALLBACK, "has_fused_kernel: vector head dims", f"vector kernel lacks q/v head dims {s.q_head_dim}/{s.v_head_dim}")
    if s.q_rows > s.kv_len:
        return _route(FALLBACK, "has_fused_kernel: vector q_len<=kv_len", f"q_len {s.q_rows} > kv_len {s.kv_len}")
    if s.q_rows * s.gqa > VECTOR_ROWS_TIMES_GQA_MAX:
        return _route(
            FALLBACK,
            "has_fused_kernel: vector q_len*GQA<=32",
            f"q_len {s.q_rows} x GQA {s.gqa} = {s.q_rows * s.gqa} > {VECTOR_ROWS_TIMES_GQA_MAX}",
        )
    return None


def _prefers_unfused(s: SdpaShape, device: DeviceClass) -> Route | None:
    """`use_fallback`: shapes a fused kernel could take but the unfused path is faster for."""
    nax_path = (
        device.nax
        and (device.tf32 or s.dtype != "float32")
        and s.q_rows >= NAX_MIN_ROWS
        and s.q_head_dim == 256
        and s.mask_kind == "causal"
    )
    if nax_path:
        return None
    if s.q_rows > VECTOR_ROWS_MAX and s.q_head_dim in (192, 256):
        return _route(FALLBACK, "use_fallback: unfused faster q_len>8 head dim 192/256", f"head dim {s.q_head_dim} with {s.q_rows} rows")
    if s.q_rows <= VECTOR_ROWS_MAX and s.q_head_dim == s.v_head_dim == 192:
        return _route(FALLBACK, "use_fallback: unfused faster q_len<=8 head dim 192", f"head dim 192 with {s.q_rows} rows")
    return None


def _fused_kind(s: SdpaShape, device: DeviceClass) -> Route:
    """`eval_gpu`: vector (one or two passes) through eight rows, full kernel above."""
    if s.q_rows > VECTOR_ROWS_MAX:
        return _route(SDPA_FULL, "eval_gpu: q_len>8 full kernel", f"{s.q_rows} rows")
    if device.large and s.kv_len >= TWO_PASS_KV_LARGE_DEVICE:
        return _route(SDPA_VECTOR_2PASS, "eval_gpu: 2-pass large device kv>=1024", f"kv_len {s.kv_len} on a 'd'/'s' device")
    if s.kv_heads < s.q_heads and s.kv_len >= TWO_PASS_KV_GQA:
        return _route(SDPA_VECTOR_2PASS, "eval_gpu: 2-pass GQA kv>=4096", f"kv_len {s.kv_len} with {s.q_heads} q heads over {s.kv_heads} kv heads")
    return _route(SDPA_VECTOR, "eval_gpu: q_len<=8 vector kernel", f"{s.q_rows} rows, q_len x GQA {s.q_rows * s.gqa}")


def predict_route(shape: SdpaShape, device: DeviceClass, mlx_version: str) -> Route:
    """The primitive MLX `mlx_version` takes for this call on `device`; 'unknown' without rules."""
    if mlx_version not in RULES_VERSIONS:
        return Route(UNKNOWN, "no rule table", f"no routing rules were read for MLX {mlx_version}", RULES_SOURCE)
    if not device.gpu:
        return _route(FALLBACK, "has_fused_kernel: GPU only", "the fused kernels require a Metal stream")
    return _no_fused_kernel(shape) or _prefers_unfused(shape, device) or _fused_kind(shape, device)


def metal_route(shape: SdpaShape) -> Route:
    """What Metal MLX (this table's releases, a base-class GPU) picks: the demo's `metal_primitive`."""
    return predict_route(shape, GPU, RULES_VERSIONS[-1])


def executed_route(shape: SdpaShape, device: mx.Device | None = None) -> Route:
    """What runs in this process: every CPU call takes the decomposed fallback."""
    device = device or mx.default_device()
    if device.type == mx.cpu:
        return _route(FALLBACK, "has_fused_kernel: GPU only", "this call runs on the CPU")
    architecture = str(mx.metal.device_info().get("architecture", ""))
    return predict_route(shape, DeviceClass.from_architecture(architecture), mx.__version__)
