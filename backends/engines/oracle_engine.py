"""The demo oracle: mlx-lm's own Qwen3 forward pass, recorded op by op.

Nothing of the model is re-implemented. Recording wraps `__call__` on the module classes
(assigning on an instance does nothing for `module(x)`), names each output by
`named_modules()`, and replaces `mx.fast.scaled_dot_product_attention` with a spy for the
duration of a forward call. The spy is also where MTPLX's head-chunk rule sits, exactly as
`_verify_sdpa` wraps the SDPA call in MTPLX, and where the attention-contract scenario swaps
in the composite reduction. Two stages have no module of their own and are read from the
input of the module that consumes them: the attention residual (input of
post_attention_layernorm) and the SwiGLU output (input of down_proj); hooks change no bits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3
from mlx_lm.models.cache import KVCache

from backends.engines.capture_sink import CaptureSink
from backends.engines.demo_scenarios import SWIGLU_CONTRACT, EngineOptions
from backends.kernels import attention_contracts as contracts
from backends.kernels.head_chunk import (
    SdpaCall,
    plan_calls,
    plan_head_chunks,
    run_calls,
)

SDPA_KERNEL = "mlx.fast.scaled_dot_product_attention"
COMPOSITE_KERNEL = "oracle.attn_auto_qtile64"
SWIGLU_KERNEL = "mlx_lm.activations.swiglu"
SDPA_ROUTED_CONTRACT = "mlx.sdpa.routed"
"""MLX's SDPA declares no fixed arithmetic: the route picks it. On CPU the fallback runs,
whose arithmetic is the single-range contract (attention_contracts.SINGLE_RANGE)."""

_LAYER = re.compile(r"^model\.layers\.(\d+)(?:\.|$)")
_WRAPPED: tuple[type[nn.Module], ...] = (nn.Embedding, nn.Linear, nn.RMSNorm, nn.RoPE, qwen3.TransformerBlock)
_READ_FROM_INPUT = {"mlp.down_proj": "mlp.swiglu", "post_attention_layernorm": "attn_residual"}


def layer_of(name: str) -> int:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else -1


class OracleEngine:
    """Runs the real mlx-lm model segment by segment with a KV cache, recording everything."""

    def __init__(self, model: qwen3.Model, options: EngineOptions, sink: CaptureSink) -> None:
        self.model = model
        self.options = options
        self.sink = sink
        self.names = {id(module): name for name, module in model.named_modules() if name}
        self.cache = [KVCache() for _ in model.layers]
        self._attention_layer = -1
        self._sdpa = mx.fast.scaled_dot_product_attention

    def forward(self, tokens: list[int]) -> mx.array:
        """One segment or decode step; returns the logits [rows, vocab] (bf16)."""
        with self._instrumented():
            logits = self.model(mx.array(tokens)[None], cache=self.cache)
        return logits[0]

    @contextmanager
    def _instrumented(self) -> Iterator[None]:
        originals: dict[type[nn.Module], Callable[..., Any]] = {cls: cls.__call__ for cls in _WRAPPED}
        attention_call = qwen3.Attention.__call__
        for cls, original in originals.items():
            cls.__call__ = self._recording(original)
        qwen3.Attention.__call__ = self._entering_attention(attention_call)
        mx.fast.scaled_dot_product_attention = self._spy_sdpa
        try:
            yield
        finally:
            mx.fast.scaled_dot_product_attention = self._sdpa
            qwen3.Attention.__call__ = attention_call
            for cls, original in originals.items():
                cls.__call__ = original

    def _recording(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            name = self.names.get(id(module))
            if name is None:
                return original(module, *args, **kwargs)
            layer = layer_of(name)
            for suffix, stage in _READ_FROM_INPUT.items():
                if name.endswith("." + suffix):
                    self._record_input(name[: -len(suffix)] + stage, args[0], layer)
            start = self.sink.now_ns()
            out = original(module, *args, **kwargs)
            self.sink.tensor(name, out, layer=layer, t_start_ns=start)
            return out

        return call

    def _record_input(self, name: str, array: mx.array, layer: int) -> None:
        if name.endswith(".swiglu"):
            self.sink.tensor(name, array, layer=layer, kernel_id=SWIGLU_KERNEL, contract_id=SWIGLU_CONTRACT, effective_contract_id=SWIGLU_CONTRACT)
        else:
            self.sink.tensor(name, array, layer=layer)

    def _entering_attention(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self._attention_layer = layer_of(self.names[id(module)])
            return original(module, *args, **kwargs)

        return call

    def _spy_sdpa(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        *,
        scale: float,
        mask: mx.array | str | None = None,
        sinks: mx.array | None = None,
        **kwargs: Any,
    ) -> mx.array:
        if sinks is not None or kwargs:
            raise ValueError("the demo oracle's SDPA spy handles q, k, v, scale and mask only")
        composite = self.options.attention_contract == contracts.AUTO_QTILE64
        _, q_heads, q_rows, head_dim = q.shape
        plan = plan_head_chunks(q_rows, q_heads, k.shape[1], enabled=self.options.head_chunk)
        calls = plan_calls(plan, q_rows, q_heads, k.shape[2])
        timed: list[tuple[SdpaCall, int, int]] = []
        effective = contracts.auto_qtile64_contract(q_rows) if composite else _mlx_effective_contract()

        def kernel(call: SdpaCall, qc: mx.array, kc: mx.array, vc: mx.array, m: mx.array | str | None) -> mx.array:
            start = self.sink.now_ns()
            if effective == contracts.TILED_64:
                causal = isinstance(m, str) and m == "causal"
                if m is not None and not causal:
                    raise ValueError("the tiled attention contract takes a causal mask or none")
                out = contracts.tiled_attention(qc, kc, vc, scale=scale, causal=causal)
            else:
                out = self._sdpa(qc, kc, vc, scale=scale, mask=m)
            mx.eval(out)
            timed.append((call, start, self.sink.now_ns()))
            return out

        start = self.sink.now_ns()
        out = run_calls(q, k, v, mask, calls, kernel)
        layer = self._attention_layer
        seq = self.sink.tensor(
            f"model.layers.{layer}.self_attn.sdpa",
            out,
            layer=layer,
            t_start_ns=start,
            kernel_id=COMPOSITE_KERNEL if composite else SDPA_KERNEL,
            contract_id=contracts.AUTO_QTILE64 if composite else SDPA_ROUTED_CONTRACT,
            effective_contract_id=effective,
        )
        self.sink.dispatch(seq, timed, q_heads=q_heads, kv_heads=k.shape[1], head_dim=head_dim, mask=mask, dtype=_dtype_name(q))
        return out


def _mlx_effective_contract() -> str:
    """MLX's SDPA on a CPU stream always runs the fallback, i.e. the single-range arithmetic;
    on a GPU the fused kernels have their own, which this demo does not model."""
    if mx.default_device().type == mx.cpu:
        return contracts.SINGLE_RANGE
    return SDPA_ROUTED_CONTRACT


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).removeprefix("mlx.core.")
