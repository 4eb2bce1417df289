"""The demo's tiny Qwen3: configuration, seeded bfloat16 weights, safetensors file and hash.

Small enough to run every scenario in seconds on two CPU cores, but shaped like the real
thing where parity depends on shape: GQA 6 with head dim 64 (so short segments cross the
q_len * GQA = 32 head-chunk boundary), and a few dead FFN gate channels, as pruned models
have, whose SwiGLU outputs are exact zeros carrying the sign of the up projection (the -0.0
values the signed-zero scenario needs come from that real arithmetic).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models import qwen3

from sessions.atomic_write import new_file_beside
from sessions.file_room import FileUnwritable, room_for


@dataclass(frozen=True)
class DemoConfig:
    hidden_size: int = 384
    num_hidden_layers: int = 2
    intermediate_size: int = 1024
    num_attention_heads: int = 12
    num_key_value_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 512
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    dead_gate_channels: int = 8

    @property
    def gqa(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def model_args(self) -> qwen3.ModelArgs:
        fields = asdict(self)
        fields.pop("dead_gate_channels")
        return qwen3.ModelArgs(model_type="qwen3", tie_word_embeddings=False, **fields)

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


MODEL_ID = "parity-xray/demo-qwen3-tiny"
WEIGHTS_FILE = "demo-qwen3-tiny.safetensors"


def _bf16(values: np.ndarray) -> mx.array:
    return mx.array(values.astype(np.float32)).astype(mx.bfloat16)


def seeded_weights(config: DemoConfig, seed: int) -> dict[str, mx.array]:
    """Weights in mlx-lm's naming, drawn from numpy's PCG64 so every platform gets the same bits."""
    rng = np.random.default_rng(seed)
    hidden, heads, kv, dim, ffn = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
    )

    def linear(out_features: int, in_features: int) -> mx.array:
        return _bf16(rng.normal(0.0, in_features**-0.5, (out_features, in_features)))

    def norm(size: int) -> mx.array:
        return _bf16(1.0 + rng.normal(0.0, 0.1, size))

    weights = {"model.embed_tokens.weight": _bf16(rng.normal(0.0, 1.0, (config.vocab_size, hidden)))}
    dead = rng.choice(ffn, size=config.dead_gate_channels, replace=False)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        weights[p + "input_layernorm.weight"] = norm(hidden)
        weights[p + "self_attn.q_proj.weight"] = linear(heads * dim, hidden)
        weights[p + "self_attn.k_proj.weight"] = linear(kv * dim, hidden)
        weights[p + "self_attn.v_proj.weight"] = linear(kv * dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = linear(hidden, heads * dim)
        weights[p + "self_attn.q_norm.weight"] = norm(dim)
        weights[p + "self_attn.k_norm.weight"] = norm(dim)
        weights[p + "post_attention_layernorm.weight"] = norm(hidden)
        gate = rng.normal(0.0, hidden**-0.5, (ffn, hidden))
        gate[dead] = 0.0
        weights[p + "mlp.gate_proj.weight"] = _bf16(gate)
        weights[p + "mlp.up_proj.weight"] = linear(ffn, hidden)
        weights[p + "mlp.down_proj.weight"] = linear(hidden, ffn)
    weights["model.norm.weight"] = norm(hidden)
    weights["lm_head.weight"] = linear(config.vocab_size, hidden)
    mx.eval(weights)
    return weights


def weights_hash(weights: dict[str, mx.array]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bits: independent of the file's byte layout."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = weights[name]
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(np.array(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array).tobytes())
    return digest.hexdigest()


def save_weights(weights: dict[str, mx.array], directory: Path) -> Path:
    """Written beside under a name of its own, then renamed: a write cut short (a full disk) left
    a truncated weights file that the captures' provenance still named."""
    path = directory / WEIGHTS_FILE
    descriptor, temp = new_file_beside(path, ".safetensors")  # MLX adds ".safetensors" to any other name
    os.close(descriptor)
    try:
        mx.save_safetensors(str(temp), weights, metadata={"model_id": MODEL_ID})
        os.replace(temp, path)
    except RuntimeError as exc:  # MLX's words never say why ("Unable to write 659706 bytes to file.")
        room = room_for(temp, temp.stat().st_size)
        temp.unlink(missing_ok=True)
        raise FileUnwritable(None, f"cannot be written ({exc}; {room:,} bytes of room left there, on its device or under the file size limit)", str(path)) from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def load_weights(path: Path) -> dict[str, mx.array]:
    return dict(mx.load(str(path)).items())


def build_oracle_model(config: DemoConfig, weights: dict[str, mx.array]) -> qwen3.Model:
    """mlx-lm's own Qwen3 module tree with the demo weights loaded (no download)."""
    model = qwen3.Model(config.model_args())
    model.set_dtype(mx.bfloat16)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model
