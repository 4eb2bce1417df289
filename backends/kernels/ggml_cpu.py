"""ggml's CPU arithmetic (x86 AVX2 + FMA + F16C build, llamafile on), repeated in numpy to the bit.

Diagnosis asks "which contract did llama.cpp run here?"; the only convincing answer is a
computation that gives llama.cpp's exact bits from the same inputs. Each function below follows
one ggml kernel's order of operations and rounding boundaries, written from the source
(ggml-org/llama.cpp, ggml/src/ggml-cpu/) and checked against real llama.cpp captures
(tests/test_diagnosis_candidates.py):

- RMSNorm: `ggml_compute_forward_rms_norm_f32` (ops.cpp): squares in float, summed in
  `ggml_float` (double) left to right, `scale = 1.0f/sqrtf(mean + eps)`, `x * scale`; the
  weight is a separate `ggml_mul`.
- mul_mat: `ggml_compute_forward_mul_mat` converts the activations to the weight type's
  `vec_dot_type` first (F32 stays, F16 -> F16, Q8_0/Q4_0 -> Q8_0 blocks, K-quants -> Q8_K
  blocks); with two or more activation rows `llamafile_sgemm` (tinyBLAS, sgemm.cpp) runs --
  8 FMA lanes per output over k, then `hsum` -- and with one row (`n < 2`: "only enable
  sgemm for prompt processing") `ggml_vec_dot_f32` -- 4 x 8 FMA lanes, GGML_F32x8_REDUCE.
- Q8_0: `quantize_row_q8_0` (arch/x86/quants.c): `d = max/127`, values times `127/max`,
  rounded to nearest even; the dot is integer per 4 bytes, scaled by the two block scales'
  float product and FMA-accumulated in 8 lanes (tinyBLAS_Q0_AVX and ggml_vec_dot_q8_0_q8_0
  agree).
- SwiGLU: `ggml_vec_swiglu_f32` (vec.cpp): `x / (1 + ggml_v_expf(-x)) * g` in 8-lane blocks
  with ggml's own polynomial exp (vec.h), `expf` for the tail.
- RoPE: `ggml_rope_cache_init` (theta *= powf(base, -2/n_dims) per pair, `cosf`/`sinf`) and
  `rotate_pairs`, whose `x0*cos - x1*sin` GCC contracts into an FMA.
- Attention without flash attention: `kq = mul_mat(k, q)` (q is a permuted view, not contiguous,
  so llamafile is skipped and every row takes vec_dot), `ggml_compute_forward_soft_max_f32`
  (scale, additive mask, max, `ggml_vec_soft_max_f32`, `1.0/sum`), `kqv = mul_mat(v^T, kq)`,
  over the KV cache padded to the length llama.cpp allocated. Over an F16 cache (llama.cpp's
  default type) K and V are stored rounded to F16, and each mul_mat converts its activations
  (q, then the probabilities) to F16, its `vec_dot_type`, into a contiguous buffer: llamafile
  then takes two or more query rows, `ggml_vec_dot_f16` one, both accumulating in float32 as
  for F32 operands.
- Flash attention: `ggml_compute_forward_flash_attn_ext_f16` (ops.cpp) over K and V in F16.
  Below 64 query rows the one-row kernel (q rounded to F16, `ggml_vec_dot_f16`, an online
  softmax with libm `expf` into an F16 accumulator); from 64 the tiled one (q in float32,
  64-cell tiles, `simd_gemm` FMA chains, `ggml_vec_soft_max_f32`, a float32 accumulator).

Inputs are float32 numpy arrays (widened from whatever dtype was captured); outputs are float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from backends.kernels.f32_ops import fma, hsum8, libm, libm_map

F32 = np.float32
LANES = 8
Q8_0_BLOCK = 32
Q8_K_BLOCK = 256


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_compute_forward_rms_norm_f32 over the last axis (no weight: that is a separate mul)."""
    x = np.asarray(x, dtype=F32)
    squares = (x * x).astype(np.float64)
    total = np.add.accumulate(squares, axis=-1)[..., -1]
    mean = (total / x.shape[-1]).astype(F32)
    scale = (F32(1.0) / np.sqrt((mean + F32(eps)).astype(F32))).astype(F32)
    return (x * scale[..., None]).astype(F32)


def dot_tinyblas(weight: np.ndarray, x: np.ndarray, fused: bool = True) -> np.ndarray:
    """x @ weight.T in tinyBLAS's order: per output 8 lanes, lane i accumulating elements i, i+8, ...
    with an FMA (or a rounded multiply then add when `fused` is off), then `hsum`."""
    _check_widths(weight, x, LANES)
    return _jit().dot_tinyblas(_contiguous(weight), _contiguous(x), fused)


def dot_vec_f32(weight: np.ndarray, x: np.ndarray, fused: bool = True) -> np.ndarray:
    """x @ weight.T as ggml_vec_dot_f32 sums one output: four 8-lane FMA accumulators over steps of
    32 (a rounded multiply, then add, when `fused` is off), reduced (0+2)+(1+3) and then across
    lanes; leftovers added one by one."""
    _check_widths(weight, x, 1)
    return _jit().dot_vec_f32(_contiguous(weight), _contiguous(x), fused)


def _check_widths(weight: np.ndarray, x: np.ndarray, multiple: int) -> None:
    """The compiled kernels index without bounds checks: shapes are checked before they run."""
    if weight.ndim != 2 or x.ndim != 2 or weight.shape[1] != x.shape[1] or x.shape[1] % multiple:
        rule = f", a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(f"a dot of activations {x.shape} with weights {weight.shape} needs one shared width{rule}")


def _jit() -> ModuleType:
    """The compiled kernels, imported on first use: numba takes about a second to import, which
    the window and the CLI should not pay before anyone diagnoses."""
    from backends.kernels import f32_jit

    return f32_jit


def _contiguous(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=F32)


def mul_mat(weight: np.ndarray, x: np.ndarray, fused: bool = True, call_rows: int | None = None) -> np.ndarray:
    """ggml_compute_forward_mul_mat for float types: tinyBLAS from two activation rows, vec_dot for one.
    `call_rows`: the rows of the call the engine ran, when `x` is only some of them (a position
    window): the path follows the call, and each output's sum is the same in either path's
    tiling, so rows computed inside a larger call come out as that call gave them."""
    x = np.asarray(x, dtype=F32)
    if (call_rows or x.shape[0]) >= 2 and x.shape[1] % LANES == 0:
        return dot_tinyblas(weight, x, fused)
    return dot_vec_f32(weight, x, fused)


@dataclass(frozen=True)
class Q8Blocks:
    """Rows of Q8_0 blocks: the fp16 scale (as float32) and 32 int8 values per block."""

    scale: np.ndarray
    """[rows, blocks] float32 values of the stored fp16 scales."""
    values: np.ndarray
    """[rows, blocks, 32] int32 holding the int8 quants."""


def quantize_q8_0(x: np.ndarray, reference: bool = False) -> Q8Blocks:
    """Activations as ggml converts them for a Q8_0 dot product.

    AVX2 `quantize_row_q8_0` (default) multiplies by `127/max` and rounds to nearest even;
    `quantize_row_q8_0_ref` (`reference`) multiplies by `1/d` and rounds half away from zero."""
    x = np.asarray(x, dtype=F32)
    rows, k = x.shape
    blocks = x.reshape(rows, k // Q8_0_BLOCK, Q8_0_BLOCK)
    amax = np.max(np.abs(blocks), axis=-1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        if reference:
            inverse = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
        else:
            inverse = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    scaled = (blocks * inverse[..., None]).astype(F32)
    rounded = np.where(scaled >= 0, np.floor(scaled + F32(0.5)), -np.floor(-scaled + F32(0.5))) if reference else np.rint(scaled)
    return Q8Blocks(d.astype(np.float16).astype(F32), np.clip(rounded, -128, 127).astype(np.int32))


def q8_0_blocks(raw: np.ndarray, rows: int) -> Q8Blocks:
    """A GGUF Q8_0 tensor's stored bytes as blocks (2-byte fp16 scale, then 32 int8)."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1, 2 + Q8_0_BLOCK)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0].astype(F32)
    return Q8Blocks(scale, blocks[..., 2:].copy().view(np.int8).astype(np.int32))


def mul_mat_q8_0(weight: Q8Blocks, x: Q8Blocks) -> np.ndarray:
    """The Q8_0 x Q8_0 dot: per block 8 integer lanes of 4 products, converted to float, times the
    float product of the two scales, FMA-accumulated per lane; then `hsum`."""
    if weight.values.shape[1:] != x.values.shape[1:] or weight.scale.shape[1] != x.scale.shape[1]:
        raise ValueError(f"a Q8_0 dot of {x.values.shape} blocks with {weight.values.shape}: the block counts differ")
    return _jit().dot_q8_0(
        _contiguous(weight.scale), np.ascontiguousarray(weight.values, dtype=np.int32),
        _contiguous(x.scale), np.ascontiguousarray(x.values, dtype=np.int32),
    )


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """Activations rounded through `quantize_row_q8_K_ref` blocks of 256 and read back (d * q):
    `iscale = -127/max` (max = the element of largest magnitude, signed), `nearest_int`, d = 1/iscale."""
    x = np.asarray(x, dtype=F32)
    rows, k = x.shape
    blocks = x.reshape(rows, k // Q8_K_BLOCK, Q8_K_BLOCK)
    at = np.argmax(np.abs(blocks), axis=-1)
    signed_max = np.take_along_axis(blocks, at[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(signed_max != 0, F32(-127) / signed_max, F32(0)).astype(F32)
    quants = np.minimum(np.rint((iscale[..., None] * blocks).astype(F32)), 127)
    with np.errstate(divide="ignore"):
        d = np.where(iscale != 0, F32(1) / iscale, F32(0)).astype(F32)
    return (quants.astype(F32) * d[..., None]).astype(F32).reshape(rows, k)


def _v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX2 + FMA), lane by lane: ARM's optimized-routines expf, max error 1.45 ULP."""
    def h(text: str) -> np.float32:
        return F32(float.fromhex(text))

    x = np.asarray(x, dtype=F32)
    r = h("0x1.8p23")
    z = fma(x, h("0x1.715476p+0"), r)
    n = (z - r).astype(F32)
    b = fma(-n, h("0x1.7f7d1cp-20"), fma(-n, h("0x1.62e4p-1"), x))
    e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
    k = (e + F32(1).view(np.uint32)).astype(np.uint32).view(F32)
    u = (b * b).astype(F32)
    j = fma(fma(fma(h("0x1.0e4020p-7"), b, h("0x1.573e2ep-5")), u, fma(h("0x1.555e66p-3"), b, h("0x1.fffdb6p-2"))), u, (h("0x1.ffffecp-1") * b).astype(F32))
    out = fma(j, k, k)
    big = np.abs(n) > F32(126)
    if big.any():
        g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
        s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(F32)
        s2 = (e - g).astype(np.uint32).view(F32)
        with np.errstate(over="ignore", under="ignore"):
            far = np.where(np.abs(n) > F32(192), (s1 * s1).astype(F32), (fma(s2, j, s2) * s1).astype(F32))
        out = np.where(big, far, out)
    return out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml_vec_swiglu_f32 per row: ggml_v_silu in 8-lane blocks, `x/(1+expf(-x))` for the tail."""
    gate, up = np.asarray(gate, dtype=F32), np.asarray(up, dtype=F32)
    width = gate.shape[-1]
    vector = width - width % LANES
    silu = np.empty_like(gate)
    with np.errstate(over="ignore"):
        head = gate[..., :vector]
        silu[..., :vector] = (head / (F32(1) + _v_expf((F32(0) - head).astype(F32)))).astype(F32)
        tail = gate[..., vector:]
        silu[..., vector:] = (tail / (F32(1) + libm_map("expf", -tail))).astype(F32)
    return (silu * up).astype(F32)


def rope_tables(rows: int, offset: int, dims: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rope_cache_init per position: theta starts at the position and is multiplied by
    `powf(base, -2.0f/n_dims)` per pair, in float; cos/sin by `cosf`/`sinf`. [rows, dims/2] each."""
    theta_scale = F32(libm("powf")(float(F32(base)), float(F32(-2.0) / F32(dims))))
    thetas = np.empty((rows, dims // 2), dtype=F32)
    theta = np.arange(offset, offset + rows, dtype=F32)
    for i in range(dims // 2):
        thetas[:, i] = theta
        theta = (theta * theta_scale).astype(F32)
    return libm_map("cosf", thetas), libm_map("sinf", thetas)


def rope(x: np.ndarray, *, offset: int, base: float, neox: bool = True, fused: bool = True) -> np.ndarray:
    """rotate_pairs over [heads, rows, dim] (NeoX halves, or interleaved pairs). With `fused`, the
    contraction GCC makes of `x0*cos - x1*sin` and `x0*sin + x1*cos`: fma(x0, cos, -(x1*sin))."""
    x = np.asarray(x, dtype=F32)
    dims = x.shape[-1]
    cos, sin = rope_tables(x.shape[-2], offset, dims, base)
    x0, x1 = (x[..., : dims // 2], x[..., dims // 2 :]) if neox else (x[..., 0::2], x[..., 1::2])
    if fused:
        first = fma(x0, cos, -(x1 * sin).astype(F32))
        second = fma(x0, sin, (x1 * cos).astype(F32))
    else:
        first = ((x0 * cos).astype(F32) - (x1 * sin).astype(F32)).astype(F32)
        second = ((x0 * sin).astype(F32) + (x1 * cos).astype(F32)).astype(F32)
    if neox:
        return np.concatenate([first, second], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = first, second
    return out


def soft_max(scores: np.ndarray, scale: float, mask: np.ndarray | None) -> np.ndarray:
    """ggml_compute_forward_soft_max_f32 over the last axis: scale, add the mask, subtract the max,
    ggml_v_expf in 8-lane blocks each hsum'd into a double sum (expf for the tail), times (float)(1/sum)."""
    w = (np.asarray(scores, dtype=F32) * F32(scale)).astype(F32)
    if mask is not None:
        w = (w + mask.astype(F32)).astype(F32)
    peak = np.max(w, axis=-1, keepdims=True)
    width = w.shape[-1]
    vector = width - width % LANES
    shifted = (w - peak).astype(F32)
    out = np.empty_like(w)
    total = np.zeros(w.shape[:-1], dtype=np.float64)
    for i in range(0, vector, LANES):
        block = _v_expf(shifted[..., i : i + LANES])
        out[..., i : i + LANES] = block
        total += hsum8(block).astype(np.float64)
    for i in range(vector, width):
        out[..., i] = libm_map("expf", shifted[..., i])
        total += out[..., i].astype(np.float64)
    inverse = (1.0 / total).astype(F32)
    return (out * inverse[..., None]).astype(F32)


def _f16(x: np.ndarray) -> np.ndarray:
    """Rounded to F16 (nearest even, as F16C converts) and widened back: an F16 operand's values."""
    return np.asarray(x, dtype=F32).astype(np.float16).astype(F32)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, causal: bool, kv_cells: int, f16_cache: bool = False, call_rows: int | None = None
) -> np.ndarray:
    """llama.cpp attention without flash attention, for q [heads, rows, dim] over k/v [kv_heads,
    kv_len, dim]: the cache holds `kv_cells` cells (unused ones zero and masked with -inf); returns
    [heads, rows, dim]. Query row i sits at cache position kv_len - rows + i. `f16_cache`: the
    cache stores F16, so both products take F16 operands (module docstring). `call_rows`: the
    rows of the call the engine ran, when q is a window of it: the products follow the call's
    path (`mul_mat`); one row of an 83-row prefill took the one-row path and missed by 4,096 ULP."""
    q, k, v = (np.asarray(a, dtype=F32) for a in (q, k, v))
    if f16_cache:
        k, v = _f16(k), _f16(v)
    heads, rows, dim = q.shape
    kv_heads, kv_len = k.shape[0], k.shape[1]
    cells = max(kv_cells, kv_len)
    pad = ((0, 0), (0, cells - kv_len), (0, 0))
    k, v = np.pad(k, pad), np.pad(v, pad)
    position = np.arange(kv_len - rows, kv_len)[:, None]
    cell = np.arange(cells)[None, :]
    visible = (cell < kv_len) & ((cell <= position) if causal else True)
    mask = np.where(visible, F32(0), F32(-np.inf)).astype(F32)
    group = heads // kv_heads
    out = np.empty_like(q)
    for h in range(heads):
        kq = mul_mat(k[h // group], _f16(q[h]), call_rows=call_rows) if f16_cache else dot_vec_f32(k[h // group], q[h])
        probs = soft_max(kq, scale, mask)
        out[h] = mul_mat(np.ascontiguousarray(v[h // group].T), _f16(probs) if f16_cache else probs, call_rows=call_rows)
    return out


FLASH_TILED_ROWS = 64
"""GGML_FA_TILE_Q: from this many query rows a flash-attention call takes ggml's tiled kernel."""
FLASH_TILE_CELLS = 64
"""GGML_FA_TILE_KV: the tiled kernel's cells per tile."""
FLASH_SPLIT_CELLS = 512
"""A one-row flash-attention call over at least this many cache cells splits the cells across threads."""


def flash_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, causal: bool, call_rows: int | None = None,
    cells: int | None = None, threads: int | None = None, streams: int = 1,
) -> np.ndarray:
    """llama.cpp's CPU flash attention for q [heads, rows, dim] over k/v [kv_heads, kv_len, dim],
    K and V in F16 (llama.cpp casts an F32 cache for the kernel); returns [heads, rows, dim].
    Query row i sits at cache position kv_len - rows + i. The kernel is chosen per KV stream:
    the call's rows (`call_rows`, when q is a window of a larger call) are shared by `streams`
    requests. From `FLASH_TILED_ROWS` rows per stream it is the tiled kernel, below it the one-row
    kernel. One row in a single stream over a padded cache of `cells` >= `FLASH_SPLIT_CELLS` is
    split across the engine's `threads`, which it then needs (ValueError without)."""
    if q.ndim != 3 or k.ndim != 3 or v.shape[:2] != k.shape[:2] or q.shape[2] != k.shape[2] or q.shape[0] % max(k.shape[0], 1):
        raise ValueError(f"flash attention of q {q.shape} over k {k.shape} and v {v.shape}: the heads or widths do not fit")
    k, v = _f16(k), _f16(v)
    rows = (call_rows or q.shape[1]) // max(streams, 1)
    if rows >= FLASH_TILED_ROWS and v.shape[-1] % LANES == 0:
        return _flash_tiled(np.asarray(q, dtype=F32), k, v, scale, causal)
    if rows == 1 and streams == 1 and cells is not None and cells >= FLASH_SPLIT_CELLS:
        if threads is None:
            raise ValueError(f"a one-row flash attention over {cells} cells is split across threads: the thread count is needed")
        return _flash_one_row(q, k, v, scale, causal, (cells, threads))
    return _flash_one_row(q, k, v, scale, causal)


def _visible(rows: int, kv_len: int, causal: bool) -> np.ndarray:
    """[rows, kv_len]: which cache cells each query row attends to."""
    position = np.arange(kv_len - rows, kv_len)[:, None]
    return (np.arange(kv_len)[None, :] <= position) if causal else np.ones((rows, kv_len), dtype=bool)


def _flash_one_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool, split: tuple[int, int] | None = None) -> np.ndarray:
    """`ggml_compute_forward_flash_attn_ext_f16_one_chunk`: K and V are F16 (llama.cpp casts an F32
    cache for the kernel), so q is rounded to F16 and each score is `ggml_vec_dot_f16`, times
    the scale. The cells are visited in order with an online softmax in float32 and libm's
    `expf`: a new maximum rescales the accumulator by expf(Mold - M), any other cell weighs its
    value by expf(s - M). The accumulator is F16 (`ggml_vec_scale_f16`, `ggml_vec_mad_f16`:
    each update rounded to F16), the sum `S = S*ms + vs` float32, contracted into an FMA as GCC
    does (unfused, 409 of 7,680 elements of a real 60-row prefill differ); the output is the
    accumulator times 1/S. Masked cells are skipped, so the padded cache changes nothing.

    `split` = (cells, threads): one row whose padded cache of `cells` is split into one run of
    cells per thread, each run kept as (M, S, accumulator) and merged in order by
    `ggml_flash_attn_ext_reduce_partials` (the decode path from `FLASH_SPLIT_CELLS`)."""
    q = _f16(q)
    heads, rows, dim = q.shape
    kv_heads, kv_len = k.shape[0], k.shape[1]
    group = heads // kv_heads
    scores = np.stack([dot_vec_f32(k[h // group], q[h]) for h in range(heads)])
    scores = (scores * F32(scale)).astype(F32)
    seen = _visible(rows, kv_len, causal)
    values = np.repeat(v, group, axis=0)
    if split is None:
        _, total, acc = _online_softmax(scores, values, seen)
        return _divided(acc, total)
    cells, threads = split
    chunk = -(-cells // threads)
    peak = np.full((heads, rows), -np.inf, dtype=F32)
    total = np.zeros((heads, rows), dtype=F32)
    acc = np.zeros((heads, rows, dim), dtype=F32)
    for start in range(0, min(cells, kv_len), chunk):
        part = slice(start, min(start + chunk, kv_len))
        part_peak, part_total, part_acc = _online_softmax(scores[:, :, part], values[:, part], seen[:, part])
        merged = part_total != 0
        new_peak = np.maximum(peak, part_peak)
        with np.errstate(invalid="ignore"):
            old_scale = libm_map("expf", np.where(merged, (peak - new_peak).astype(F32), F32(0)))
            new_scale = libm_map("expf", np.where(merged, (part_peak - new_peak).astype(F32), F32(0)))
        acc = np.where(merged[..., None], fma(acc, old_scale[..., None], (part_acc * new_scale[..., None]).astype(F32)), acc)
        total = np.where(merged, fma(total, old_scale, (part_total * new_scale).astype(F32)), total)
        peak = np.where(merged, new_peak, peak)
    return _divided(acc, total)


def _online_softmax(scores: np.ndarray, values: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one-row kernel's pass over `scores` [heads, rows, cells] in order: (M, S, accumulator)."""
    heads, rows, cells = scores.shape
    peak = np.full((heads, rows), -np.inf, dtype=F32)
    total = np.zeros((heads, rows), dtype=F32)
    acc = np.zeros((heads, rows, values.shape[-1]), dtype=F32)
    for cell in range(cells):
        visible = seen[:, cell]
        if not visible.any():
            continue
        s = scores[:, :, cell]
        higher = (s > peak) & visible[None, :]
        with np.errstate(invalid="ignore"):
            exponent = np.where(higher, (peak - s).astype(F32), (s - peak).astype(F32))
        weight = libm_map("expf", exponent)
        ms = np.where(higher, weight, F32(1))
        vs = np.where(higher, F32(1), weight)
        scaled = np.where(higher[..., None], _f16((acc * ms[..., None]).astype(F32)), acc)
        updated = _f16(fma(values[:, cell][:, None, :], vs[..., None], scaled))
        summed = fma(total, ms, vs)
        acc = np.where(visible[None, :, None], updated, acc)
        total = np.where(visible[None, :], summed, total)
        peak = np.where(higher, s, peak)
    return peak, total, acc


def _divided(acc: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The accumulator times 1/S (0 where nothing was attended)."""
    inverse = np.where(total == 0, F32(0), (F32(1) / np.where(total == 0, F32(1), total)).astype(F32))
    return (acc * inverse[..., None]).astype(F32)


def _flash_tiled(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool) -> np.ndarray:
    """`ggml_compute_forward_flash_attn_ext_tiled`: q stays float32, K and V are widened from F16.
    The cells go in tiles of 64 from cell 0. In each, every score is one `simd_gemm` sum (an FMA
    chain over the head dim, from 0), times the scale, plus the mask; the row's maximum moves to
    the tile's if higher, rescaling the accumulator and the sum by expf(Mold - M);
    `ggml_vec_soft_max_f32` turns the tile's scores into ggml_v_expf(s - M) and adds their
    double sum to the float sum; the accumulator gains the tile's weighted values as one FMA
    chain over the tile's cells. The output is the accumulator times 1/S. Which rows share a
    query tile, and the tiles skipped as fully masked, change no row's bits."""
    heads, rows, dim = q.shape
    kv_heads, kv_len = k.shape[0], k.shape[1]
    keys, values = np.repeat(k, heads // kv_heads, axis=0), np.repeat(v, heads // kv_heads, axis=0)
    mask = np.where(_visible(rows, kv_len, causal), F32(0), F32(-np.inf)).astype(F32)
    peak = np.full((heads, rows), -np.inf, dtype=F32)
    total = np.zeros((heads, rows), dtype=F32)
    acc = np.zeros((heads, rows, values.shape[-1]), dtype=F32)
    tile = FLASH_TILE_CELLS
    for start in range(0, kv_len, tile):
        cells = min(tile, kv_len - start)
        scores = np.stack([_jit().fma_dot(_contiguous(q[h]), _contiguous(keys[h, start : start + cells])) for h in range(heads)])
        scores = ((scores * F32(scale)).astype(F32) + mask[None, :, start : start + cells]).astype(F32)
        scores = np.concatenate([scores, np.full((heads, rows, tile - cells), -np.inf, dtype=F32)], axis=-1)
        tile_peak = scores.max(axis=-1)
        live = tile_peak != -np.inf
        higher = live & (tile_peak > peak)
        new_peak = np.where(higher, tile_peak, peak)
        with np.errstate(invalid="ignore"):
            ms = libm_map("expf", np.where(higher, (peak - new_peak).astype(F32), F32(0)))
        acc = np.where(higher[..., None], (acc * ms[..., None]).astype(F32), acc)
        total = np.where(higher, (total * ms).astype(F32), total)
        peak = new_peak
        with np.errstate(invalid="ignore"):
            shifted = np.where(live[..., None], (scores - np.where(live, peak, F32(0))[..., None]).astype(F32), F32(-np.inf))
        weights = np.zeros_like(shifted)
        tile_sum = np.zeros((heads, rows), dtype=np.float64)
        for i in range(0, tile, LANES):
            block = _v_expf(shifted[..., i : i + LANES])
            weights[..., i : i + LANES] = block
            tile_sum += hsum8(block).astype(np.float64)
        total = np.where(live, (total.astype(np.float64) + tile_sum).astype(F32), total)
        weights = np.where(live[..., None], weights, F32(0))
        for h in range(heads):
            _jit().fma_accumulate(acc[h], _contiguous(weights[h, :, :cells]), _contiguous(values[h, start : start + cells]))
    return _divided(acc, total)
