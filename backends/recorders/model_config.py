"""A model's hyperparameters as a capture's provenance `config` carries them.

A rerun recomputes norms and RoPE, so it needs the scalars the engine ran with (RMSNorm's eps,
RoPE's base). The recorders write them beside the tensors, so that a capture describes its
model; a capture recorded without them takes them from the weights file it references.
Names are Hugging Face's (config.json), the names the demo engines and docs/capture-format.md
use, whatever file the values came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GGUF_KEYS = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
}
"""Config name -> its GGUF metadata key below `<general.architecture>.`."""


class ModelConfigError(ValueError):
    """A weights file whose model config cannot be read, with the file and what is wrong."""


def _scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, (bool, int, float, str))}


def hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's scalars; a multimodal model keeps its language model's in `text_config`,
    which fill what the top level lacks (the rerun recomputes the language model)."""
    text = config.get("text_config")
    return {**(_scalars(text) if isinstance(text, Mapping) else {}), **_scalars(config)}


def gguf_config(path: Path) -> dict[str, Any]:
    """The GGUF's hyperparameters under their config.json names; keys the file lacks are absent."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
        arch = fields["general.architecture"].contents() if "general.architecture" in fields else None
        found = {name: fields[f"{arch}.{key}"].contents() for name, key in GGUF_KEYS.items() if f"{arch}.{key}" in fields}
    except (OSError, KeyError, IndexError, ValueError) as exc:
        raise ModelConfigError(f"{path}: GGUF metadata cannot be read ({exc})") from None
    if not isinstance(arch, str):
        raise ModelConfigError(f"{path}: GGUF metadata has no general.architecture")
    return {"model_type": arch, **_scalars(found)}


def weights_file_config(weights: Path) -> dict[str, Any]:
    """The config of the model whose weights are `weights`: a GGUF's metadata, or the config.json
    beside a safetensors file; {} when there is none to read."""
    if weights.suffix == ".gguf":
        return gguf_config(weights) if weights.is_file() else {}
    beside = weights.parent / "config.json"
    if not beside.is_file():
        return {}
    try:
        loaded = json.loads(beside.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"{beside}: cannot be read as JSON ({type(exc).__name__}: {exc})") from None
    return hf_config(loaded) if isinstance(loaded, dict) else {}
