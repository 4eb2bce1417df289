"""The candidate contracts, per canonical op: data plus small functions.

Each entry is an arithmetic contract some engine really runs, named by a stable id, with the
order of its operations and its rounding boundaries in one line, and where that engine does
it. MLX candidates call the rerun's own ops (`backends.rerun.compute`, `backends.kernels`), so
"what MLX does" is computed one way everywhere; ggml candidates call `backends.kernels.ggml_cpu`,
numpy repeating ggml's order to the bit. Adding a contract is one `Candidate(...)` here and
one test in tests/test_diagnosis_candidates.py.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import mlx.core as mx
import numpy as np

from backends.diagnosis.candidates import (
    CALL_SHAPE,
    Candidate,
    CandidateInputs,
    CandidateOutput,
    bits_array,
)
from backends.engines.native_engine import rms_norm as native_rms_norm
from backends.engines.native_engine import rope_neox, rope_tables
from backends.kernels import attention_contracts as contracts
from backends.kernels import ggml_cpu
from backends.rerun import ops as rerun_ops
from backends.rerun.compute import (
    ADDS,
    CACHES,
    LINEARS,
    NORMS,
    Routes,
    compute_mlx,
    kv_with_history,
)
from backends.rerun.segment import RerunSession
from sessions.compare.key import OpKey

CPU = mx.Device(mx.cpu)
HEAD_NORMS = ("q_norm", "k_norm")
ROPES = ("q_rope", "k_rope")
ALL_OPS = frozenset((*NORMS, *HEAD_NORMS, *LINEARS, *ROPES, *CACHES, "sdpa", "ffn_act", *ADDS))
MLX_SOURCE = "ml-explore/mlx"
GGML_SOURCE = "ggml-org/llama.cpp ggml/src/ggml-cpu"


def _mlx(routes: Routes) -> Callable[[CandidateInputs], CandidateOutput]:
    """The op as the rerun computes it through MLX on `routes`, on the CPU stream."""

    def run(inputs: CandidateInputs) -> CandidateOutput:
        weight = None if inputs.weight is None else inputs.weight.astype(inputs.compute_dtype())
        return compute_mlx(inputs.key.op, inputs.arrays, inputs.history, weight, inputs.params, routes, CPU).output

    return run


# -- RMSNorm ---------------------------------------------------------------------------------


def _norm_input(inputs: CandidateInputs) -> mx.array:
    """The normalised rows: [rows, hidden], or [rows, heads, dim] for the per-head Q/K norms."""
    x = inputs.arrays[inputs.first()]
    return x.reshape(x.shape[0], inputs.params["heads"], -1) if inputs.key.op in HEAD_NORMS else x


def _norm_output(inputs: CandidateInputs, out: CandidateOutput) -> CandidateOutput:
    """Back to canonical layout: per-head norms are [heads, rows, dim]."""
    return out.transpose(1, 0, 2) if inputs.key.op in HEAD_NORMS else out


def _rms_weight_after_cast(inputs: CandidateInputs) -> CandidateOutput:
    x = _norm_input(inputs)
    assert inputs.weight is not None
    return _norm_output(inputs, native_rms_norm(x, inputs.weight.astype(x.dtype), inputs.params["eps"]))


def _rms_weight_before_cast(inputs: CandidateInputs) -> CandidateOutput:
    x32 = _norm_input(inputs).astype(mx.float32)
    assert inputs.weight is not None
    with mx.stream(CPU):
        normed = x32 * mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + mx.array(inputs.params["eps"], dtype=mx.float32))
        return _norm_output(inputs, normed * inputs.weight.astype(mx.float32))


def _ggml_rms_norm(inputs: CandidateInputs) -> CandidateOutput:
    x = np.array(_norm_input(inputs).astype(mx.float32))
    return _norm_output(inputs, (ggml_cpu.rms_norm(x, inputs.params["eps"]) * inputs.weight_values()).astype(np.float32))


# -- matmul / linear -------------------------------------------------------------------------


def _f32_matmul(inputs: CandidateInputs) -> CandidateOutput:
    assert inputs.weight is not None
    with mx.stream(CPU):
        return inputs.arrays[inputs.first()].astype(mx.float32) @ inputs.weight.astype(mx.float32).T


def _ggml_mul_mat(activations: np.dtype | None, fused: bool = True) -> Callable[[CandidateInputs], CandidateOutput]:
    def run(inputs: CandidateInputs) -> CandidateOutput:
        x = inputs.values(inputs.first())
        if activations is not None:
            x = x.astype(activations).astype(np.float32)
        return ggml_cpu.mul_mat(inputs.weight_values(), x, fused, inputs.call_rows)

    return run


def _ggml_q8_0(reference: bool) -> Callable[[CandidateInputs], CandidateOutput]:
    def run(inputs: CandidateInputs) -> CandidateOutput:
        assert inputs.stored is not None
        weight = ggml_cpu.q8_0_blocks(inputs.stored.raw, inputs.stored.rows)
        return ggml_cpu.mul_mat_q8_0(weight, ggml_cpu.quantize_q8_0(inputs.values(inputs.first()), reference))

    return run


def _needs_q8_0_blocks(inputs: CandidateInputs) -> str | None:
    if inputs.stored is None:
        return "needs the weight's stored Q8_0 blocks; the weight does not come from a GGUF file"
    if inputs.stored.ggml_type != "Q8_0":
        return f"needs Q8_0 weight blocks; the GGUF stores this weight as {inputs.stored.ggml_type}"
    return None


def _ggml_q8_k(inputs: CandidateInputs) -> CandidateOutput:
    return ggml_cpu.mul_mat(inputs.weight_values(), ggml_cpu.quantize_q8_k(inputs.values(inputs.first())))


def _needs_q8_k_width(inputs: CandidateInputs) -> str | None:
    width = inputs.arrays[inputs.first()].shape[-1]
    return None if width % ggml_cpu.Q8_K_BLOCK == 0 else f"Q8_K blocks hold 256 values; this op's input width {width} is not a multiple of 256"


# -- SwiGLU ----------------------------------------------------------------------------------


def _silu_exp(inputs: CandidateInputs) -> CandidateOutput:
    gate, up = inputs.arrays["ffn_gate"], inputs.arrays["ffn_up"]
    with mx.stream(CPU):
        return (gate / (mx.array(1.0, dtype=gate.dtype) + mx.exp(-gate))) * up


def _swiglu_f32(inputs: CandidateInputs) -> CandidateOutput:
    gate, up = inputs.arrays["ffn_gate"].astype(mx.float32), inputs.arrays["ffn_up"].astype(mx.float32)
    with mx.stream(CPU):
        return gate * mx.sigmoid(gate) * up


def _ggml_swiglu(inputs: CandidateInputs) -> CandidateOutput:
    return ggml_cpu.swiglu(inputs.values("ffn_gate"), inputs.values("ffn_up"))


# -- RoPE ------------------------------------------------------------------------------------


def _rope_input(inputs: CandidateInputs) -> mx.array:
    return inputs.arrays["q_norm" if inputs.key.op == "q_rope" else "k_norm"]


def _mlx_rope(traditional: bool, from_zero: bool) -> Callable[[CandidateInputs], CandidateOutput]:
    def run(inputs: CandidateInputs) -> CandidateOutput:
        x = _rope_input(inputs)
        offset = 0 if from_zero else inputs.params["offset"]
        return rerun_ops.rope(x[None], dims=inputs.params["dims"], base=inputs.params["base"], offset=offset, traditional=traditional, device=CPU)[0]

    return run


def _rope_from_zero_unavailable(inputs: CandidateInputs) -> str | None:
    return "the cache offset is 0 here: positions from 0 are the captured positions" if inputs.params["offset"] == 0 else None


def _table_rope(table_dtype: mx.Dtype | None) -> Callable[[CandidateInputs], CandidateOutput]:
    """cos/sin tables computed in float32 and rounded once to `table_dtype` (None: the input's dtype)."""

    def run(inputs: CandidateInputs) -> CandidateOutput:
        x = _rope_input(inputs)
        rows, offset = x.shape[1], inputs.params["offset"]
        dtype = table_dtype or x.dtype
        with mx.stream(CPU):
            cos, sin = rope_tables(mx.arange(offset, offset + rows), x.shape[-1], inputs.params["base"], dtype)
            return rope_neox(x.transpose(1, 0, 2).astype(dtype), cos, sin).transpose(1, 0, 2)

    return run


def _ggml_rope(fused: bool) -> Callable[[CandidateInputs], CandidateOutput]:
    def run(inputs: CandidateInputs) -> CandidateOutput:
        x = np.array(_rope_input(inputs).astype(mx.float32))
        return ggml_cpu.rope(x, offset=inputs.params["offset"], base=inputs.params["base"], neox=True, fused=fused)

    return run


# -- attention -------------------------------------------------------------------------------


def _attention_in(inputs: CandidateInputs, dtype: mx.Dtype) -> tuple[mx.array, mx.array, mx.array]:
    k, v = kv_with_history(inputs.arrays, inputs.history, inputs.params["kv_heads"])
    return inputs.arrays["q_rope"][None].astype(dtype), k[None].astype(dtype), v[None].astype(dtype)


def _attention_out(out: mx.array) -> mx.array:
    return out[0].transpose(1, 0, 2).reshape(out.shape[2], -1)


def _single_range_in(dtype: mx.Dtype) -> Callable[[CandidateInputs], CandidateOutput]:
    """The single-range reduction carried out in `dtype` (f16 or f32 scores and sums)."""

    def run(inputs: CandidateInputs) -> CandidateOutput:
        q, k, v = _attention_in(inputs, dtype)
        with mx.stream(CPU):
            out = contracts.single_range_attention(q, k, v, scale=inputs.params["scale"], causal=inputs.params["mask"] == "causal")
        return _attention_out(out)

    return run


def _auto_qtile64(inputs: CandidateInputs) -> CandidateOutput:
    """The switch is on the call's query rows, not on the rows compared: a window of runs cut
    differently (5 rows of an 83-row call) took the single-range side of the switch."""
    rows = inputs.call_rows or inputs.arrays["q_rope"].shape[1]
    return _mlx(Routes(attention=contracts.auto_qtile64_contract(rows), head_chunk=False))(inputs)


def _contract_mask_unavailable(inputs: CandidateInputs) -> str | None:
    mask = inputs.params["mask"]
    return None if mask in (None, "causal") else f"this contract takes a causal mask or none; the call has a {mask} mask"


def _cache_unavailable(inputs: CandidateInputs) -> str | None:
    """A candidate that pads the cache to the call's cells: not when they would not fit in memory."""
    return inputs.kv_cells_problem or _contract_mask_unavailable(inputs)


def _ggml_attention(f16_cache: bool) -> Callable[[CandidateInputs], CandidateOutput]:
    def run(inputs: CandidateInputs) -> CandidateOutput:
        k, v = kv_with_history(inputs.arrays, inputs.history, inputs.params["kv_heads"])
        q32 = np.array(inputs.arrays["q_rope"].astype(mx.float32))
        out = ggml_cpu.attention(
            q32, np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32)), scale=inputs.params["scale"],
            causal=inputs.params["mask"] == "causal", kv_cells=inputs.kv_cells or k.shape[1], f16_cache=f16_cache,
            call_rows=inputs.call_rows // inputs.streams if inputs.call_rows else None,  # each KV stream's products are a matmul of their own
        )
        return out.transpose(1, 0, 2).reshape(out.shape[1], -1)

    return run


def _flash_cells(inputs: CandidateInputs, filled: int) -> int:
    """The cells the call attended over: the recorder's padded count, else the filled length."""
    return inputs.kv_cells or filled


def _ggml_flash_attention(inputs: CandidateInputs) -> CandidateOutput:
    k, v = kv_with_history(inputs.arrays, inputs.history, inputs.params["kv_heads"])
    out = ggml_cpu.flash_attention(
        np.array(inputs.arrays["q_rope"].astype(mx.float32)), np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32)),
        scale=inputs.params["scale"], causal=inputs.params["mask"] == "causal", call_rows=inputs.call_rows,
        cells=_flash_cells(inputs, k.shape[1]), threads=inputs.threads, streams=inputs.streams,
    )
    return out.transpose(1, 0, 2).reshape(out.shape[1], -1)


def _flash_unavailable(inputs: CandidateInputs) -> str | None:
    if inputs.kv_cells_problem is not None:
        return inputs.kv_cells_problem
    rows = (inputs.call_rows or inputs.arrays["q_rope"].shape[1]) // inputs.streams
    history = inputs.history.get("k")
    cells = _flash_cells(inputs, inputs.arrays["k_rope"].shape[1] + (history.shape[1] if history is not None else 0))
    if rows == 1 and inputs.streams == 1 and cells >= ggml_cpu.FLASH_SPLIT_CELLS and inputs.threads is None:
        return (
            f"a one-row call over {cells} cache cells splits them across llama.cpp's threads, and the capture does not say "
            "how many (provenance `threads`)"
        )
    return _contract_mask_unavailable(inputs)


# -- copies ----------------------------------------------------------------------------------


def _plus_zero(inputs: CandidateInputs) -> CandidateOutput:
    assert inputs.route_output is not None
    copy = bits_array(inputs.route_output, inputs.dtype)
    with mx.stream(CPU):
        return copy + mx.array(0.0, dtype=copy.dtype)


def _needs_route_output(inputs: CandidateInputs) -> str | None:
    return None if inputs.route_output is not None else "needs the oracle route's output on these inputs, which the rerun could not compute"


NORM_OPS = frozenset((*NORMS, *HEAD_NORMS))
LINEAR_OPS = frozenset(LINEARS)

REGISTRY: tuple[Candidate, ...] = (
    Candidate(
        "rms_norm.mlx", NORM_OPS,
        "mx.fast.rms_norm: on a CPU stream float32 mean of squares, rsqrt, cast to the input dtype, then times the weight in that dtype",
        f"{MLX_SOURCE} mlx/fast.cpp rms_norm (CPU fallback); mlx-lm nn.RMSNorm", _mlx(Routes()),
    ),
    Candidate(
        "rms_norm.f32.weight_after_cast", NORM_OPS,
        "float32 x * rsqrt(mean(x^2) + eps), rounded to the input dtype, then times the weight in that dtype (two roundings)",
        "the MLX CPU fallback's order written out op by op (parity-xray demo native engine)", _rms_weight_after_cast,
    ),
    Candidate(
        "rms_norm.f32.weight_before_cast", NORM_OPS,
        "float32 x * rsqrt(mean(x^2) + eps) * weight, rounded once to the output dtype",
        f"{MLX_SOURCE} Metal rms_norm kernel (one rounding); fused GPU norms", _rms_weight_before_cast,
    ),
    Candidate(
        "ggml.rms_norm", NORM_OPS,
        "float32 squares summed in double left to right, mean to float, 1.0f/sqrtf(mean + eps), x * scale, then a float32 multiply by the weight",
        f"{GGML_SOURCE}/ops.cpp ggml_compute_forward_rms_norm_f32, then ggml_mul (llama.cpp build_norm)", _ggml_rms_norm,
    ),
    Candidate("linear.mlx", LINEAR_OPS, "x @ W.T through MLX in the input dtype (nn.Linear)", f"{MLX_SOURCE} matmul; mlx-lm nn.Linear", _mlx(Routes())),
    Candidate(
        "linear.f32_accumulate", LINEAR_OPS, "inputs widened to float32, x @ W.T through MLX in float32, rounded once to the output dtype",
        f"{MLX_SOURCE} float32 matmul; engines that accumulate wide and round once", _f32_matmul,
    ),
    Candidate(
        "ggml.mul_mat.f32", LINEAR_OPS,
        "ggml F32 mul_mat: from 2 activation rows tinyBLAS (8 FMA lanes per output, then hsum), for 1 row ggml_vec_dot_f32 (4 x 8 FMA lanes)",
        f"{GGML_SOURCE}/llamafile/sgemm.cpp tinyBLAS (n >= 2), vec.cpp ggml_vec_dot_f32", _ggml_mul_mat(None), follows=("call_rows",),
    ),
    Candidate(
        "ggml.mul_mat.f32.no_fma", LINEAR_OPS,
        "ggml F32 mul_mat with FMA contraction off: every lane product rounded before it is added",
        f"{GGML_SOURCE}/llamafile/sgemm.cpp madd() without __FMA__", _ggml_mul_mat(None, fused=False), follows=("call_rows",),
    ),
    Candidate(
        "ggml.mul_mat.f16", LINEAR_OPS,
        "activations converted to F16 first (vec_dot_type of F16 weights), then ggml's float mul_mat order",
        f"{GGML_SOURCE}/ggml-cpu.c ggml_compute_forward_mul_mat (from_float to F16); sgemm.cpp tinyBLAS<ggml_fp16_t>", _ggml_mul_mat(np.dtype(np.float16)), follows=("call_rows",),
    ),
    Candidate(
        "ggml.mul_mat.bf16", LINEAR_OPS,
        "activations rounded to bfloat16 first (vec_dot_type of BF16 weights), then ggml's float mul_mat order",
        f"{GGML_SOURCE}/ggml-cpu.c ggml_compute_forward_mul_mat (from_float to BF16); sgemm.cpp tinyBLAS<ggml_bf16_t>", _ggml_mul_mat(np.dtype(ml_dtypes.bfloat16)), follows=("call_rows",),
    ),
    Candidate(
        "ggml.mul_mat.q8_0", LINEAR_OPS,
        "activations quantized to Q8_0 blocks (d = max/127, x * 127/max rounded to even), integer dot per 4 bytes, scaled by the block scales, 8 FMA lanes",
        f"{GGML_SOURCE}/arch/x86/quants.c quantize_row_q8_0; sgemm.cpp tinyBLAS_Q0_AVX; ggml_vec_dot_q8_0_q8_0",
        _ggml_q8_0(reference=False), _needs_q8_0_blocks,
    ),
    Candidate(
        "ggml.mul_mat.q8_0.ref_quantizer", LINEAR_OPS,
        "as ggml.mul_mat.q8_0, but activations quantized by the reference quantizer (x * 1/d, rounded half away from zero)",
        "ggml-org/llama.cpp ggml/src/ggml-quants.c quantize_row_q8_0_ref (the gguf-py quantizer's rule)", _ggml_q8_0(reference=True), _needs_q8_0_blocks,
    ),
    Candidate(
        "ggml.act.q8_k", LINEAR_OPS,
        "activations rounded through Q8_K blocks of 256 (iscale = -127/max, nearest_int), then ggml's float mul_mat order with the float weights: "
        "tests the K-quant activation boundary, not the integer K-quant dot",
        "ggml-org/llama.cpp ggml/src/ggml-quants.c quantize_row_q8_K_ref (vec_dot_type of Q4_K/Q6_K)", _ggml_q8_k, _needs_q8_k_width,
    ),
    Candidate(
        "swiglu.silu_then_mul", frozenset({"ffn_act"}), "silu(gate) * up in the input dtype: gate * sigmoid(gate) rounded, then times up (mlx-lm's compiled swiglu)",
        "ml-explore/mlx-lm mlx_lm/models/activations.py swiglu", _mlx(Routes(swiglu=rerun_ops.SILU_THEN_MUL)),
    ),
    Candidate(
        "swiglu.mul_then_sigmoid", frozenset({"ffn_act"}), "(gate * up) * sigmoid(gate) in the input dtype: the product rounded first",
        "an engine that multiplies the projections first (the swiglu-order demo native)", _mlx(Routes(swiglu=rerun_ops.MUL_THEN_SIGMOID)),
    ),
    Candidate(
        "swiglu.silu_exp", frozenset({"ffn_act"}), "SiLU through exp: gate / (1 + exp(-gate)), then times up, in the input dtype",
        "the textbook SiLU (torch.nn.functional.silu's formula; ggml_silu_f32's order)", _silu_exp,
    ),
    Candidate(
        "swiglu.f32", frozenset({"ffn_act"}), "gate * sigmoid(gate) * up in float32, rounded once to the output dtype",
        "fused GPU SwiGLU kernels (float32 registers, one store)", _swiglu_f32,
    ),
    Candidate(
        "ggml.swiglu", frozenset({"ffn_act"}),
        "ggml's order: x / (1 + ggml_v_expf(-x)) * g in 8-lane blocks, ggml's polynomial exp (1.45 ULP), expf for the tail",
        f"{GGML_SOURCE}/vec.cpp ggml_vec_swiglu_f32, vec.h ggml_v_expf / ggml_v_silu", _ggml_swiglu,
    ),
    Candidate(
        "rope.mlx.neox", frozenset(ROPES), "mx.fast.rope on halves (NeoX) at the cache offset: on a CPU stream each step rounds in the input dtype",
        f"{MLX_SOURCE} mlx/fast.cpp rope (CPU fallback); mlx-lm nn.RoPE", _mlx(Routes()),
    ),
    Candidate(
        "rope.mlx.interleaved", frozenset(ROPES), "mx.fast.rope on interleaved pairs (traditional=True) at the cache offset",
        f"{MLX_SOURCE} mlx/fast.cpp rope traditional; GPT-J / original LLaMA layout", _mlx_rope(traditional=True, from_zero=False),
    ),
    Candidate(
        "rope.mlx.neox.position0", frozenset(ROPES), "mx.fast.rope on halves with positions from 0: the cache offset ignored",
        "a segmented prefill that restarts positions per call (seed 002, defect 4)", _mlx_rope(traditional=False, from_zero=True), _rope_from_zero_unavailable,
    ),
    Candidate(
        "rope.tables.input_dtype", frozenset(ROPES), "cos/sin tables computed in float32, rounded to the input dtype, rotation in the input dtype",
        "explicit RoPE tables in the activation dtype (parity-xray demo native engine)", _table_rope(None),
    ),
    Candidate(
        "rope.tables.f32", frozenset(ROPES), "float32 cos/sin tables and a float32 rotation, rounded once to the output dtype",
        "RoPE with float32 tables (Metal rope kernel; engines that keep f32 tables)", _table_rope(mx.float32),
    ),
    Candidate(
        "ggml.rope.neox", frozenset(ROPES),
        "ggml NeoX RoPE: theta *= powf(base, -2/n) per pair, cosf/sinf, x0*cos - x1*sin contracted to fma(x0, cos, -(x1*sin)) by the compiler",
        f"{GGML_SOURCE}/ops.cpp ggml_rope_cache_init, rotate_pairs (GCC -ffp-contract=fast)", _ggml_rope(fused=True),
    ),
    Candidate(
        "ggml.rope.neox.no_fma", frozenset(ROPES), "ggml NeoX RoPE with contraction off: both products rounded before the add",
        f"{GGML_SOURCE}/ops.cpp rotate_pairs built with -ffp-contract=off", _ggml_rope(fused=False),
    ),
    Candidate(
        "attn.mlx_sdpa.head_chunked", frozenset({"sdpa"}), "mx.fast.scaled_dot_product_attention, query heads split by the MTPLX head-chunk rule",
        "youssofal/MTPLX _verify_sdpa over ml-explore/mlx scaled_dot_product_attention", _mlx(Routes(attention=rerun_ops.MLX_SDPA, head_chunk=True)),
        head_split=True,
    ),
    Candidate(
        "attn.mlx_sdpa.unchunked", frozenset({"sdpa"}), "mx.fast.scaled_dot_product_attention, one call over all heads",
        f"{MLX_SOURCE} mlx/fast.cpp scaled_dot_product_attention", _mlx(Routes(attention=rerun_ops.MLX_SDPA, head_chunk=False)),
        head_split=False,
    ),
    Candidate(
        contracts.SINGLE_RANGE, frozenset({"sdpa"}),
        "single range in the input dtype: q scaled and rounded, scores over the whole key range, finfo.min mask, precise softmax, then P.V",
        "llama.cpp Q < 64 single-range contract (seed 002); the MLX CPU fallback's order", _mlx(Routes(attention=contracts.SINGLE_RANGE, head_chunk=False)),
        _contract_mask_unavailable,
    ),
    Candidate(
        "attn.f16.single_range", frozenset({"sdpa"}), "the single-range reduction carried out in float16 (f16 scores and sums), rounded to the output dtype",
        "llama.cpp F16 single-range online softmax (seed 002: FP16 accumulation)", _single_range_in(mx.float16), _contract_mask_unavailable,
    ),
    Candidate(
        "attn.f32.single_range", frozenset({"sdpa"}), "the single-range reduction carried out in float32 (f32 accumulation), rounded once to the output dtype",
        "float32-accumulating attention kernels", _single_range_in(mx.float32), _contract_mask_unavailable,
    ),
    Candidate(
        contracts.TILED_64, frozenset({"sdpa"}), "64-row query tiles over 64-column key tiles, FP32 scores and online softmax, one final division and rounding",
        "llama.cpp Q >= 64 tiled flash attention (seed 002)", _mlx(Routes(attention=contracts.TILED_64, head_chunk=False)), _contract_mask_unavailable,
    ),
    Candidate(
        contracts.AUTO_QTILE64, frozenset({"sdpa"}), "composite: attn.bf16.single_range below 64 query rows, attn.f32.tiled64x64 from 64",
        "seed 002 f16_flash_auto_qtile64 (llama.cpp's switch at Q = 64)", _auto_qtile64, _contract_mask_unavailable, follows=("call_rows",),
    ),
    Candidate(
        "ggml.attn.f32", frozenset({"sdpa"}),
        "llama.cpp without flash attention: kq by ggml_vec_dot_f32, soft_max (scale, -inf mask over the padded cache, ggml_v_expf, 1/sum in double), kqv by mul_mat",
        f"{GGML_SOURCE}/ops.cpp ggml_compute_forward_soft_max_f32, ggml-cpu.c mul_mat; llama.cpp build_attn_mha", _ggml_attention(False), _cache_unavailable,
        follows=("call_rows", "kv_cells", "streams"),
    ),
    Candidate(
        "ggml.attn.f16_cache", frozenset({"sdpa"}),
        "llama.cpp without flash attention over an F16 KV cache (its default type): K and V stored as F16, q rounded to F16 for kq, "
        "soft_max in float32, the probabilities rounded to F16 for kqv; float32 accumulation (tinyBLAS from two query rows, vec_dot_f16 for one)",
        f"{GGML_SOURCE}/ggml-cpu.c mul_mat (vec_dot_type F16), vec.cpp ggml_vec_dot_f16, llamafile/sgemm.cpp; llama.cpp type_k/type_v f16",
        _ggml_attention(True), _cache_unavailable, follows=("call_rows", "kv_cells", "streams"),
    ),
    Candidate(
        "ggml.attn.flash", frozenset({"sdpa"}),
        "llama.cpp flash attention on the CPU, K and V in F16: below 64 query rows q rounded to F16, vec_dot_f16 scores, an online "
        "softmax cell by cell with libm expf into an F16 accumulator (one row over 512 cells or more: a run of cells per thread, "
        "merged in order); from 64 rows, tiles of 64 cells with float32 FMA chains, ggml_v_expf and a float32 accumulator; "
        "then times 1/sum",
        f"{GGML_SOURCE}/ops.cpp ggml_compute_forward_flash_attn_ext_f16_one_chunk, _tiled and ggml_flash_attn_ext_reduce_partials, "
        "simd-gemm.h; llama.cpp build_attn_mha "
        "(an F32 cache cast to F16 for the kernel)",
        _ggml_flash_attention, _flash_unavailable, follows=CALL_SHAPE,
    ),
    Candidate("residual.add", frozenset(ADDS), "a + b in the input dtype, one rounding", "every engine's residual add", _mlx(Routes())),
    Candidate(
        "cache.store", frozenset(CACHES),
        "the step's post-RoPE keys / projected values stored as they are, rounded once (to nearest even) when the cache's dtype is narrower",
        "mlx-lm KVCache.update_and_fetch (a slice assignment); ggml set_rows (GGML_CPU_FP32_TO_FP16 for an F16 cache)", _mlx(Routes()),
    ),
    Candidate(
        "copy.plus_zero", ALL_OPS,
        "the op as the oracle's route computes it, then an extra x + 0.0 copy: every -0.0 becomes +0.0, nothing else changes",
        "seed 001: a deep clone taken as x + 0 (the signed-zero trap)", _plus_zero, _needs_route_output, of_route=True,
    ),
)

_ids = [c.id for c in REGISTRY]
assert len(set(_ids)) == len(_ids), "candidate ids must be unique"


DECLARED_AS: dict[str, str] = {f"swiglu.{dtype}.{order}": f"swiglu.{order}" for dtype in ("bf16", "f16") for order in rerun_ops.SWIGLU_ORDERS}
"""Contract ids records declare for arithmetic a candidate computes under another id. The demo
engines name their SwiGLU order with its dtype (`swiglu.bf16.silu_then_mul`); the candidate
names the order alone, since it computes in whatever the input dtype is. Every other declared id
a candidate computes is its id (`attn.bf16.single_range`)."""


HEAD_SPLIT: dict[str, bool | None] = {c.id: c.head_split for c in REGISTRY}
"""Each candidate's `head_split`, by id."""


OF_THE_INPUT_DTYPE = frozenset({*DECLARED_AS, contracts.SINGLE_RANGE})
"""Declared ids whose dtype is the data's, computed by a candidate in whatever dtype its input
has (the SwiGLU orders; the single range "in the input dtype"). On data of another dtype they
name arithmetic no candidate computes here: a bf16 record declaring `swiglu.f16.mul_then_sigmoid`
read as bit-exactly reproduced, where f16 arithmetic differs in 1,946 of 5,120 elements."""
DTYPE_TOKENS = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def registry_id(declared: str, dtype: str) -> str | None:
    """The candidate that computes the contract a record of `dtype` declares; None when it
    declares none, or one no candidate computes on data of that dtype (`OF_THE_INPUT_DTYPE`). A
    `bf16` id on float32 data is taken as the arithmetic it names in the input's dtype: the demo
    engines and the MLX recorder name their contracts so whatever the dtype, after the seed."""
    named = DTYPE_TOKENS.get(declared.split(".")[1]) if declared in OF_THE_INPUT_DTYPE else dtype
    if named != dtype and not (named == "bfloat16" and dtype == "float32"):
        return None
    name = DECLARED_AS.get(declared, declared)
    return name if name in _ids else None


def candidates_for(op: str) -> list[Candidate]:
    """The registry's candidates for a canonical op, in registry order."""
    return [c for c in REGISTRY if op in c.ops]


def declared_candidate(session: RerunSession, side: str, key: OpKey) -> str | None:
    """The candidate that computes what `side`'s record declares, on data of the record's dtype
    (`registry_id`), or None."""
    mapped = session.captured[side].find(key.step, key.segment, key.layer, key.op, key.positions)
    return None if mapped is None else registry_id(mapped.record.effective_contract_id or "", mapped.record.dtype)
