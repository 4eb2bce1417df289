"""GGUF export: llama.cpp's file holds the demo weights, and reading it back gives MLX the same values."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from backends.demo.llama_pairs import demo_weights_f32
from backends.engines.gguf_export import (
    GgufExportError,
    export_gguf,
    gguf_name,
    gguf_to_hf_names,
    read_gguf_weights,
)
from tests.test_mlx_recorder import TINY


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return demo_weights_f32(TINY, 5)


@pytest.mark.parametrize(("variant", "exact"), [("f32", True), ("bf16", True), ("f16", False), ("q8_0", False)])
def test_a_variant_reads_back_as_the_values_llama_cpp_holds(weights: dict[str, np.ndarray], tmp_path: Path, variant: str, exact: bool) -> None:
    path = export_gguf(TINY.as_dict(), weights, tmp_path / "m.gguf", variant)
    back = gguf_to_hf_names(read_gguf_weights(path), list(weights), TINY.num_hidden_layers)
    assert set(back) == set(weights)
    for name, values in weights.items():
        assert back[name].shape == values.shape
        if exact or values.ndim == 1:
            assert back[name].tobytes() == values.tobytes(), name
    q = "model.layers.0.self_attn.q_proj.weight"
    if variant == "f16":
        assert back[q].tobytes() == values_as(weights[q], np.float16)
    if variant == "q8_0":
        blocks = gguf.quants.quantize(weights[q], gguf.GGMLQuantizationType.Q8_0)
        assert back[q].tobytes() == gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).astype(np.float32).tobytes()


def values_as(values: np.ndarray, dtype: type) -> bytes:
    return values.astype(dtype).astype(np.float32).tobytes()


def test_the_header_carries_the_minimal_metadata_llama_cpp_needs(weights: dict[str, np.ndarray], tmp_path: Path) -> None:
    reader = gguf.GGUFReader(str(export_gguf(TINY.as_dict(), weights, tmp_path / "m.gguf", "q8_0")))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "qwen3"
    assert fields["tokenizer.ggml.model"] == "none"
    assert fields["qwen3.vocab_size"] == TINY.vocab_size
    assert fields["qwen3.attention.head_count_kv"] == TINY.num_key_value_heads
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


def test_names_follow_ggufs_qwen3_map_and_unknown_ones_are_refused(weights: dict[str, np.ndarray], tmp_path: Path) -> None:
    assert gguf_name("model.layers.1.self_attn.o_proj.weight", 2) == "blk.1.attn_output.weight"
    assert gguf_name("lm_head.weight", 2) == "output.weight"
    with pytest.raises(GgufExportError, match="'model.vision.patch' has no Qwen3 GGUF name"):
        gguf_name("model.vision.patch", 2)
    with pytest.raises(GgufExportError, match="unknown GGUF variant 'q4_k'"):
        export_gguf(TINY.as_dict(), weights, tmp_path / "m.gguf", "q4_k")
