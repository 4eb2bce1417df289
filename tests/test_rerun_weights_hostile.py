"""A weights file given to a rerun is someone else's file: whatever is wrong with it is one line
naming the file (and the tensor) with exit 2 -- never a traceback, a hang, or a rerun that
"does not reproduce" because of the file rather than the engine."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFWriter

from backends.recorders import model_config
from backends.recorders.model_config import ModelConfigError, gguf_config
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from viewer.cli import main

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 16)).astype(np.float32)
W = RNG.normal(size=(8, 16)).astype(np.float32)


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """A capture of attn_norm -> q_proj with no weight record, so the weight comes from --weights."""
    path = tmp_path / "canonical.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        writer.add_tensor("attn_norm", X, step=0, segment="prefill", layer=0)
        writer.add_tensor("q_proj", np.array(mx.array(X) @ mx.array(W).T), step=0, segment="prefill", layer=0)
    return path


def rerun(capture: Path, weights: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["rerun", str(capture), str(capture), "--op", "0:prefill:0:q_proj", "--from", "native", "--weights", str(weights)])
    return code, capsys.readouterr().err


def safetensors(path: Path, dtype: str, shape: list[int], data: bytes) -> Path:
    header = json.dumps({Q_PROJ: {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def gguf_bytes(n_kv: int, kvs: bytes, n_tensors: int = 0, tensors: bytes = b"", version: int = 3) -> bytes:
    """A GGUF header written by hand, so that its counts can lie."""
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + tensors + bytes(64)


def gguf_string(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


ARCH = gguf_string(b"general.architecture") + struct.pack("<I", 8) + gguf_string(b"qwen3")


def test_weights_of_the_right_shape_and_type_rerun_as_before(capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rerun(capture, safetensors(tmp_path / "w.safetensors", "F32", [8, 16], W.tobytes()), capsys)[0] == 0


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (gguf_bytes(1, gguf_string(b"", length=1 << 62)), "metadata key 0 is 4611686018427387904 bytes long; names are at most 65535"),
        (gguf_bytes(1 << 62, ARCH), "it declares 4611686018427387904 metadata entries and 0 tensors, more than its"),
        (gguf_bytes(1, ARCH, n_tensors=1 << 62), "it declares 1 metadata entries and 4611686018427387904 tensors, more than its"),
        (
            gguf_bytes(1, gguf_string(b"general.architecture") + struct.pack("<I", 8) + gguf_string(b"", length=1 << 62)),
            "general.architecture (4611686018427387904 bytes) would run past the end of the file",
        ),
        (
            gguf_bytes(1, gguf_string(b"x") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 9, 1)),
            "an element of an element of x nests arrays more than 2 deep",
        ),
        (gguf_bytes(1, ARCH, version=99), "version 99; a rerun reads versions 2 and 3"),
    ],
    ids=["key-length", "kv-count", "tensor-count", "string-length", "nested-arrays", "version"],
)
def test_a_malformed_gguf_header_is_refused_naming_the_file(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], header: bytes, problem: str
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(header)
    code, err = rerun(capture, path, capsys)
    assert code == 2
    assert err.startswith(f"parity-xray rerun: {path}: not a usable GGUF ({problem}") and err.count("\n") == 1
    with pytest.raises(ModelConfigError, match="not a usable GGUF"):
        gguf_config(path)


def _gguf(path: Path, q_proj: np.ndarray, tokens: list[str] | None = None) -> Path:
    """A GGUF written by the gguf package holding layer 0's q projection (and a vocabulary)."""
    writer = GGUFWriter(str(path), "qwen3")
    if tokens is not None:
        writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_tensor("blk.0.attn_q.weight", q_proj)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_arrays_past_the_budget_are_refused_before_they_are_built(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_config, "MAX_METADATA_ELEMENTS", 1000)
    path = _gguf(tmp_path / "vocab.gguf", W, tokens=[""] * 1001)
    code, err = rerun(capture, path, capsys)
    assert code == 2
    assert f"{path}: not a usable GGUF (its metadata arrays hold more than 1000 elements, more than a rerun walks (at array tokenizer.ggml.tokens))" in err


@pytest.mark.parametrize(("dtype", "data"), [("I64", np.zeros((8, 16), np.int64).tobytes()), ("F8_E4M3", bytes(8 * 16))])
def test_a_weight_stored_in_a_non_float_dtype_is_refused_naming_the_tensor(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: str, data: bytes
) -> None:
    path = safetensors(tmp_path / "w.safetensors", dtype, [8, 16], data)
    assert rerun(capture, path, capsys) == (
        2,
        f"parity-xray rerun: {path}: weight {Q_PROJ} is stored as {dtype}; a rerun computes with float weights "
        "(float32, float16, bfloat16 or GGUF quantized blocks)\n",
    )


def test_an_integer_gguf_tensor_is_refused_naming_the_tensor(capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _gguf(tmp_path / "int.gguf", np.zeros((8, 16), np.int32))
    code, err = rerun(capture, path, capsys)
    assert code == 2
    assert f"{path}: weight blk.0.attn_q.weight is stored as I32" in err


def test_an_all_nan_weight_is_a_broken_file_not_a_finding(capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = safetensors(tmp_path / "nan.safetensors", "F32", [8, 16], np.full((8, 16), np.nan, np.float32).tobytes())
    assert rerun(capture, path, capsys) == (
        2,
        f"parity-xray rerun: {path}: weight {Q_PROJ} is all NaN, which no trained checkpoint holds: the file is broken\n",
    )


def test_a_weight_of_the_wrong_shape_names_the_file_and_the_tensor(capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = safetensors(tmp_path / "w.safetensors", "F32", [2, 2], bytes(16))
    assert rerun(capture, path, capsys) == (
        2,
        f"parity-xray rerun: {path}: weight {Q_PROJ} has shape [2, 2]; q_proj of a 16-wide input needs [outputs, 16]\n",
    )


def test_a_directory_fifo_or_empty_file_given_as_weights_is_named_as_what_it_is_without_opening_it(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    for path, kind in ((folder, "a directory"), (fifo, "a FIFO")):
        assert rerun(capture, path, capsys) == (2, f"parity-xray rerun: weights file {path} (named for this rerun) is {kind}, not a regular file\n")
    empty = tmp_path / "empty.safetensors"
    empty.touch()
    assert rerun(capture, empty, capsys) == (2, f"parity-xray rerun: weights file {empty} (named for this rerun) is empty (0 bytes)\n")


def test_a_weights_file_that_is_not_safetensors_says_which_format_it_was_read_as_and_why(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "weights.bin"
    text.write_text("not weights\n")
    code, err = rerun(capture, text, capsys)
    assert code == 2 and err.startswith(
        f"parity-xray rerun: weights file {text} (named for this rerun) cannot be read as safetensors, which a weights file not named *.gguf is taken to be ("
    )


def test_a_config_json_beside_the_weights_is_read_only_when_it_is_a_small_regular_file(tmp_path: Path) -> None:
    weights = safetensors(tmp_path / "w.safetensors", "F32", [8, 16], W.tobytes())
    beside = tmp_path / "config.json"
    beside.write_text(json.dumps({"rms_norm_eps": 1e-6, "text_config": {"num_attention_heads": 4}}), encoding="utf-8")
    assert model_config.weights_file_config(weights) == {"rms_norm_eps": 1e-6, "num_attention_heads": 4}
    beside.write_bytes(b" " * (model_config.MAX_CONFIG_BYTES + 1))
    with pytest.raises(ModelConfigError) as huge:
        model_config.weights_file_config(weights)
    assert str(huge.value) == f"{beside}: cannot be read as JSON (SideFileError: {model_config.MAX_CONFIG_BYTES + 1} bytes, over the {model_config.MAX_CONFIG_BYTES}-byte limit for this kind of file)"
    beside.unlink()
    os.mkfifo(beside)
    with pytest.raises(ModelConfigError, match="not a regular file: a FIFO"):
        model_config.weights_file_config(weights)


@pytest.mark.parametrize(
    ("named", "problem"),
    [
        ("a\0b.safetensors", "holds a NUL, so it names no file ('a\\x00b.safetensors')"),
        ("\ud800x.safetensors", "is not a file name this system can spell ('\\ud800x.safetensors')"),
        (12, "is 12, not a file name"),
    ],
)
def test_a_weights_file_the_provenance_cannot_name_is_refused_by_capture_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], named: object, problem: str) -> None:
    """A NUL or a lone surrogate failed in the system's call ("embedded null byte", naming no
    file), and a number was passed over: the weight-taking op then read as held by neither capture."""
    path = tmp_path / "named.h5"
    with CaptureWriter(path, CaptureMeta(role="native", provenance={"weights_file": named})) as writer:
        writer.add_tensor("attn_norm", X, step=0, segment="prefill", layer=0)
        writer.add_tensor("q_proj", np.array(mx.array(X) @ mx.array(W).T), step=0, segment="prefill", layer=0)
    assert main(["rerun", str(path), str(path), "--op", "0:prefill:0:q_proj", "--from", "native"]) == 2
    assert capsys.readouterr().err == f"parity-xray rerun: {path}: / attribute 'provenance_json' key 'weights_file': {problem}; the command's --weights names the weights file instead\n"


def test_a_weights_file_the_provenance_cannot_name_leaves_a_rerun_given_weights_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --weights given, the provenance's other names are not needed: a NUL in one still refused the rerun."""
    path = tmp_path / "named.h5"
    with CaptureWriter(path, CaptureMeta(role="native", provenance={"weights_from": ["a\0b.safetensors"]})) as writer:
        writer.add_tensor("attn_norm", X, step=0, segment="prefill", layer=0)
        writer.add_tensor("q_proj", np.array(mx.array(X) @ mx.array(W).T), step=0, segment="prefill", layer=0)
    weights = safetensors(tmp_path / "w.safetensors", "F32", [8, 16], W.tobytes())
    assert rerun(path, weights, capsys) == (0, "")
    assert main(["rerun", str(path), str(path), "--op", "0:prefill:0:q_proj", "--from", "native"]) == 2
    assert "key 'weights_from': holds a NUL, so it names no file ('a\\x00b.safetensors')" in capsys.readouterr().err
