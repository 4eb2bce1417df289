"""A quantized pair in the viewer: decoded values as heatmaps, the raw block in the inspector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from pytestqt.qtbot import QtBot

from sessions.bits.quant_blocks import block_of
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

BLOCK, QUANT = 5, 3
"""The oracle's quant 3 of block 5 is changed: element 5 * 32 + 3 = 163, at (2, 35) of [4, 64]."""


def _pair(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    weights = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    native = quantize(weights, GGMLQuantizationType.Q8_0).reshape(-1)
    oracle = native.copy()
    oracle[BLOCK * 34 + 2 + QUANT] ^= 0x04
    paths = []
    for role, blocks in (("native", native), ("oracle", oracle)):
        path = tmp_path / f"{role}.h5"
        with CaptureWriter(path, CaptureMeta(role=role, engine_name=f"hand-{role}", weights_hash="sha256:aa")) as writer:
            writer.add_tensor("ffn_down", blocks, step=0, segment="prefill", layer=0, dtype="q8_0", logical_shape=(4, 64))
            writer.end_step()
        paths.append(path)
    return paths[0], paths[1], native, oracle


def test_the_block_of_an_element_names_the_differing_byte() -> None:
    native = np.arange(2 * 34, dtype=np.uint8)
    oracle = native.copy()
    oracle[34 + 2] ^= 1
    block = block_of(native, oracle, "q8_0", 33)
    assert (block.index, block.first_element, block.elements, block.differing_bytes) == (1, 32, 32, (2,))
    assert block.native_hex == native[34:].tobytes().hex()
    assert block_of(native, oracle, "q8_0", 31).differing_bytes == ()


def test_a_q8_0_pair_shows_decoded_values_and_the_raw_block(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    native_path, oracle_path, native_blocks, oracle_blocks = _pair(tmp_path)
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(1440, 900)
    window.show()
    window.open_pair(native_path, oracle_path)
    qtbot.waitUntil(lambda: window.tensor_view.data is not None and not window.tasks.busy, timeout=60_000)
    data = window.tensor_view.data
    assert data.dtype == "float32" and data.differing == 1
    assert "q8_0 decoded to float32 for display" in window.tensor_view.title.text()
    decoded_native = dequantize(native_blocks, GGMLQuantizationType.Q8_0).reshape(4, 64)
    decoded_oracle = dequantize(oracle_blocks, GGMLQuantizationType.Q8_0).reshape(4, 64)
    assert np.array_equal(data.native_bits.view(np.float32), decoded_native)
    assert np.array_equal(data.oracle_bits.view(np.float32), decoded_oracle)
    element = window.tensor_view.inspector.current
    assert element is not None and element.coordinate == (2, 35)
    assert element.native.decimal != element.oracle.decimal
    assert element.block is not None and (element.block.index, element.block.differing_bytes) == (BLOCK, (2 + QUANT,))
    assert window.tensor_view.inspector.block.isVisible()
    assert "q8_0 block #5" in window.tensor_view.inspector.block.text()
    window.grab().save(str(artifacts_dir / "viewer-quantized.png"))
    window.close()
