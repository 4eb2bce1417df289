"""Export Qwen3 weights in mlx-lm naming to a GGUF file llama.cpp loads, and read one back.

The llama-vs-mlx scenarios need both engines to start from the same numbers. Exporting the
demo's weights to GGUF (F32, F16, BF16 or Q8_0) gives llama.cpp its model; reading that same
file back with the `gguf` package's own dequantizers gives MLX the exact values llama.cpp
holds, so any divergence the report shows comes from arithmetic, not from the weights.

Tensor names come from `gguf`'s own name map for the QWEN3 architecture. The only tokenizer
metadata llama.cpp needs for token-id input is `tokenizer.ggml.model = "none"` plus
`qwen3.vocab_size`. Qwen3 uses NEOX RoPE, which llama.cpp applies to Q/K as stored, so the
projection weights are written without the permutation LLaMA-style exports need. Norm weights
(1-D) stay F32 in every variant, as llama.cpp's own converter keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

ARCH = gguf.MODEL_ARCH.QWEN3
ARCH_NAME = gguf.MODEL_ARCH_NAMES[ARCH]

VARIANTS: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
"""GGUF variant name -> (type of the 2-D weights, file type recorded in the header)."""

CONFIG_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
)


class GgufExportError(ValueError):
    """Weights or a config that cannot be written as a Qwen3 GGUF, with what is wrong."""


def _name_map(layers: int) -> gguf.TensorNameMap:
    return gguf.get_tensor_name_map(ARCH, layers)


def gguf_name(hf_name: str, layers: int) -> str:
    """The GGUF tensor name of an mlx-lm / Hugging Face weight name (`blk.3.attn_q.weight`)."""
    name = _name_map(layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise GgufExportError(f"weight {hf_name!r} has no Qwen3 GGUF name")
    return name


def _encode(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if qtype == GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values.astype(np.float32), qtype)


def export_gguf(config: dict[str, Any], weights: dict[str, np.ndarray], path: Path, variant: str) -> Path:
    """Write `weights` (float32 numpy, mlx-lm names) as a Qwen3 GGUF of `variant` at `path`."""
    if variant not in VARIANTS:
        raise GgufExportError(f"unknown GGUF variant {variant!r}; known: {', '.join(VARIANTS)}")
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise GgufExportError(f"config lacks {', '.join(missing)}")
    qtype, file_type = VARIANTS[variant]
    layers = int(config["num_hidden_layers"])
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), ARCH_NAME)
    try:
        writer.add_name(str(config.get("model_id", "parity-xray qwen3")))
        writer.add_context_length(int(config["max_position_embeddings"]))
        writer.add_embedding_length(int(config["hidden_size"]))
        writer.add_block_count(layers)
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_head_count(int(config["num_attention_heads"]))
        writer.add_head_count_kv(int(config["num_key_value_heads"]))
        writer.add_key_length(int(config["head_dim"]))
        writer.add_value_length(int(config["head_dim"]))
        writer.add_rope_freq_base(float(config["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
        writer.add_vocab_size(int(config["vocab_size"]))
        writer.add_tokenizer_model("none")
        writer.add_file_type(file_type)
        for hf_name in sorted(weights):
            values = np.asarray(weights[hf_name], dtype=np.float32)
            tensor_type = qtype if values.ndim == 2 else GGMLQuantizationType.F32
            encoded = _encode(values, tensor_type)
            raw = None if tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else tensor_type
            writer.add_tensor(gguf_name(hf_name, layers), encoded, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def read_gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file as float32 values, keyed by GGUF name, decoded by `gguf`."""
    reader = gguf.GGUFReader(str(path))
    weights: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights[tensor.name] = np.asarray(values, dtype=np.float32).reshape(shape)
    return weights


def gguf_to_hf_names(gguf_weights: dict[str, np.ndarray], hf_names: list[str], layers: int) -> dict[str, np.ndarray]:
    """The GGUF tensors renamed back to the mlx-lm names they were exported from."""
    by_gguf = {gguf_name(name, layers): name for name in hf_names}
    unknown = sorted(set(gguf_weights) - set(by_gguf))
    if unknown:
        raise GgufExportError(f"GGUF tensors with no mlx-lm name: {', '.join(unknown)}")
    return {by_gguf[name]: values for name, values in gguf_weights.items()}


def write_mlx_model_dir(config: dict[str, Any], weights: dict[str, np.ndarray], directory: Path) -> Path:
    """An mlx-lm model directory (config.json + model.safetensors, float32) that
    `mlx_lm.utils.load_model` loads locally: the MLX side of a llama-vs-mlx pair."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    full = {key: config[key] for key in CONFIG_KEYS}
    full.update(model_type="qwen3", tie_word_embeddings=False, torch_dtype="float32")
    (directory / "config.json").write_text(json.dumps(full, indent=1, sort_keys=True), encoding="utf-8")
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(directory / "model.safetensors"))
    return directory
