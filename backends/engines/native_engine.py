"""The demo native engine: the same Qwen3 written independently with MLX array ops.

It plays the part of an engine under test, so it shares no module code with mlx-lm: it
keeps llama.cpp's row-major layouts ([rows, X], [rows, heads, dim]) and names
(`attn_norm-3`, `Qcur-3` after projection and again after RoPE, `kqv_out-3`, ...), and writes
RMSNorm, RoPE and attention out as explicit op sequences. Where the arithmetic order matches
the MLX CPU fallbacks it matches the oracle bit for bit; each scenario changes one thing.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from backends.engines.capture_sink import CaptureSink
from backends.engines.demo_model import DemoConfig
from backends.engines.demo_scenarios import (
    SWIGLU_CONTRACT,
    SWIGLU_MUL_THEN_SIGMOID,
    EngineOptions,
)
from backends.kernels import attention_contracts as contracts
from backends.kernels.head_chunk import (
    SdpaCall,
    plan_calls,
    plan_head_chunks,
    run_calls,
)

ATTENTION_KERNEL = "native.attention"
SWIGLU_KERNEL = "native.swiglu"


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """Normalise in FP32, round to the weight's dtype, then scale: one rounding per stage."""
    x32 = x.astype(mx.float32)
    normed = x32 * mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + mx.array(eps, dtype=mx.float32))
    return normed.astype(weight.dtype) * weight


def rope_tables(positions: mx.array, dims: int, base: float, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """cos/sin per (position, frequency), computed in FP32 and rounded once to `dtype`."""
    half = dims // 2
    step = np.float32(np.log(np.float32(base))) / np.float32(half)
    inv_freq = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * mx.array(step, dtype=mx.float32))
    theta = positions.astype(mx.float32)[:, None] * inv_freq
    return mx.cos(theta).astype(dtype), mx.sin(theta).astype(dtype)


def rope_neox(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """NeoX-style rotation of [rows, heads, dim] (halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class NativeEngine:
    def __init__(self, config: DemoConfig, weights: dict[str, mx.array], options: EngineOptions, sink: CaptureSink) -> None:
        self.config = config
        self.w = weights
        self.options = options
        self.sink = sink
        self.k_cache: list[mx.array | None] = [None] * config.num_hidden_layers
        self.v_cache: list[mx.array | None] = [None] * config.num_hidden_layers
        self.position = 0

    def _linear(self, x: mx.array, name: str) -> mx.array:
        return x @ self.w[name].T

    def forward(self, tokens: list[int]) -> mx.array:
        """One segment or decode step; returns the logits [rows, vocab] (bf16)."""
        c, rec = self.config, self.sink.tensor
        rows = len(tokens)
        positions = mx.arange(self.position, self.position + rows)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta, mx.bfloat16)
        x = self.w["model.embed_tokens.weight"][mx.array(tokens)]
        rec("inp_embd", x)
        for layer in range(c.num_hidden_layers):
            x = self._layer(layer, x, cos, sin)
        self.position += rows
        out = rms_norm(x, self.w["model.norm.weight"], c.rms_norm_eps)
        rec("result_norm", out)
        logits = self._linear(out, "lm_head.weight")
        rec("result_output", logits)
        return logits

    def _layer(self, n: int, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        c, rec, p = self.config, self.sink.tensor, f"model.layers.{n}."
        rows = x.shape[0]
        h = rms_norm(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
        rec(f"attn_norm-{n}", h, layer=n)
        q = self._linear(h, p + "self_attn.q_proj.weight")
        rec(f"Qcur-{n}", q, layer=n)
        k = self._linear(h, p + "self_attn.k_proj.weight")
        rec(f"Kcur-{n}", k, layer=n)
        v = self._linear(h, p + "self_attn.v_proj.weight")
        rec(f"Vcur-{n}", v, layer=n)
        q = rms_norm(q.reshape(rows, c.num_attention_heads, c.head_dim), self.w[p + "self_attn.q_norm.weight"], c.rms_norm_eps)
        rec(f"Qcur_normed-{n}", q, layer=n)
        k = rms_norm(k.reshape(rows, c.num_key_value_heads, c.head_dim), self.w[p + "self_attn.k_norm.weight"], c.rms_norm_eps)
        rec(f"Kcur_normed-{n}", k, layer=n)
        q = rope_neox(q, cos, sin)
        rec(f"Qcur-{n}", q, layer=n)
        k = rope_neox(k, cos, sin)
        rec(f"Kcur-{n}", k, layer=n)
        attn = self._attention(n, q, k, v.reshape(rows, c.num_key_value_heads, c.head_dim))
        o = self._linear(attn, p + "self_attn.o_proj.weight")
        rec(f"attn_out-{n}", o, layer=n)
        x = x + o
        rec(f"ffn_inp-{n}", x, layer=n)
        h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        rec(f"ffn_norm-{n}", h, layer=n)
        gate = self._linear(h, p + "mlp.gate_proj.weight")
        rec(f"ffn_gate-{n}", gate, layer=n)
        up = self._linear(h, p + "mlp.up_proj.weight")
        rec(f"ffn_up-{n}", up, layer=n)
        act = self._swiglu(gate, up)
        rec(f"ffn_swiglu-{n}", act, layer=n, kernel_id=SWIGLU_KERNEL, contract_id=SWIGLU_CONTRACT, effective_contract_id=SWIGLU_CONTRACT)
        down = self._linear(act, p + "mlp.down_proj.weight")
        rec(f"ffn_out-{n}", down, layer=n)
        x = x + down
        rec(f"l_out-{n}", x, layer=n)
        return x

    def _swiglu(self, gate: mx.array, up: mx.array) -> mx.array:
        if self.options.swiglu_order == SWIGLU_MUL_THEN_SIGMOID:
            act = (gate * up) * mx.sigmoid(gate)
        else:
            act = (gate * mx.sigmoid(gate)) * up
        if self.options.plus_zero_copy:
            act = act + mx.array(0.0, dtype=act.dtype)
        return act

    def _attention(self, n: int, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        """Append to the cache, then the declared attention contract, head-chunked when enabled."""
        c = self.config
        rows = q.shape[0]
        k_all = k if self.k_cache[n] is None else mx.concatenate([self.k_cache[n], k], axis=0)
        v_all = v if self.v_cache[n] is None else mx.concatenate([self.v_cache[n], v], axis=0)
        self.k_cache[n], self.v_cache[n] = k_all, v_all
        qh = q.transpose(1, 0, 2)[None]
        kh, vh = k_all.transpose(1, 0, 2)[None], v_all.transpose(1, 0, 2)[None]
        scale = 1.0 / math.sqrt(c.head_dim)
        causal = rows > 1
        plan = plan_head_chunks(rows, c.num_attention_heads, c.num_key_value_heads, enabled=self.options.head_chunk)
        calls = plan_calls(plan, rows, c.num_attention_heads, k_all.shape[0])
        timed: list[tuple[SdpaCall, int, int]] = []
        declared = self.options.attention_contract
        effective = contracts.auto_qtile64_contract(rows) if declared == contracts.AUTO_QTILE64 else declared

        def kernel(call: SdpaCall, qc: mx.array, kc: mx.array, vc: mx.array, mask: str | None) -> mx.array:
            start = self.sink.now_ns()
            out = contracts.contract_attention(effective, qc, kc, vc, scale=scale, causal=causal)
            mx.eval(out)
            timed.append((call, start, self.sink.now_ns()))
            return out

        start = self.sink.now_ns()
        out = run_calls(qh, kh, vh, "causal" if causal else None, calls, kernel)
        attn = out[0].transpose(1, 0, 2).reshape(rows, c.num_attention_heads * c.head_dim)
        seq = self.sink.tensor(
            f"kqv_out-{n}",
            attn,
            layer=n,
            t_start_ns=start,
            kernel_id=ATTENTION_KERNEL,
            contract_id=declared,
            effective_contract_id=effective,
        )
        self.sink.dispatch(
            seq, timed, q_heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
            mask="causal" if causal else None, dtype="bfloat16",
        )
        return attn
