"""Captures written by CaptureWriter read back bit for bit, through the same checks untrusted files get."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from sessions.capture import format as cf
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.writer import CaptureWriter

BF16_SPECIALS = np.array([0x0000, 0x8000, 0x7FC1, 0xFFC3, 0x7F80, 0xFF80, 0x0001, 0x3F80], dtype=np.uint16)
F32_SPECIALS = np.array([0x00000000, 0x80000000, 0x7FC00001, 0xFFA5A5A5, 0x7F800000, 0x00000001], dtype=np.uint32)
F16_SPECIALS = np.array([0x0000, 0x8000, 0x7E01, 0xFC00, 0x0001, 0x7BFF], dtype=np.uint16)
F64_SPECIALS = np.array([0, 1 << 63, 0x7FF8000000000001, 0xFFF0000000000000, 1], dtype=np.uint64)


def tensors() -> dict[str, np.ndarray]:
    """One array per dtype the format stores, with the bit patterns a careless copy would lose."""
    rng = np.random.default_rng(7)
    return {
        "bfloat16": BF16_SPECIALS.view(ml_dtypes.bfloat16).reshape(2, 4),
        "float16": F16_SPECIALS.view(np.float16),
        "float32": F32_SPECIALS.view(np.float32).reshape(3, 2),
        "float64": F64_SPECIALS.view(np.float64),
        **{
            name: rng.integers(np.iinfo(name).min, np.iinfo(name).max, size=(3, 5), dtype=name, endpoint=True)
            for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
        },
        "bool": np.array([[True, False, True], [False, False, True]]),
    }


def write_capture(path: Path, compression: str | None = None) -> dict[str, tuple[int, np.ndarray]]:
    written: dict[str, tuple[int, np.ndarray]] = {}
    meta = CaptureMeta(role="native", engine_name="roundtrip", prompt="grüße", seed=3, provenance={"k": [1, 2]})
    with CaptureWriter(path, meta, compression=compression) as writer:
        for name, array in tensors().items():
            written[name] = (writer.add_tensor(f"t-{name}", array, step=0, segment="text-before", layer=2), array)
        writer.add_token(step=0, segment="text-before", token_id=11, is_stop=False)
        writer.end_step()
    return written


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
def test_every_dtype_reads_back_bit_exact(tmp_path: Path, compression: str | None) -> None:
    path = tmp_path / "cap.h5"
    written = write_capture(path, compression)
    with open_capture(path) as capture:
        assert capture.complete
        by_seq = {r.seq: r for r in capture.records}
        for name, (seq, array) in written.items():
            record = by_seq[seq]
            assert record.dtype == name
            assert record.shape == array.shape
            values = capture.read_values(record)
            assert values.dtype == array.dtype
            assert values.tobytes() == array.tobytes(), name


def test_bfloat16_keeps_signed_zero_and_nan_payloads(tmp_path: Path) -> None:
    path = tmp_path / "cap.h5"
    written = write_capture(path)
    with open_capture(path) as capture:
        record = capture.records[written["bfloat16"][0]]
        bits = capture.read_bits(record)
    assert bits.dtype == np.uint16
    assert bits.reshape(-1).tolist() == BF16_SPECIALS.tolist()
    assert {0x8000, 0x7FC1, 0xFFC3} <= set(bits.reshape(-1).tolist())


def test_slices_read_only_the_selected_part(tmp_path: Path) -> None:
    path = tmp_path / "cap.h5"
    written = write_capture(path, "gzip")
    seq, array = written["int32"]
    with open_capture(path) as capture:
        record = capture.records[seq]
        assert capture.read_values(record, (slice(1, 3), slice(None, None, 2))).tolist() == array[1:3, ::2].tolist()
        assert capture.read_values(record, (2,)).tolist() == array[2].tolist()


def test_q8_0_blocks_are_stored_raw_and_decoded_with_gguf(tmp_path: Path) -> None:
    weights = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    blocks = quantize(weights, GGMLQuantizationType.Q8_0)
    path = tmp_path / "q.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        seq = writer.add_tensor("blk.0.attn_q.weight", blocks, step=0, segment="prefill", dtype="q8_0", logical_shape=(4, 64))
        writer.end_step()
    with open_capture(path) as capture:
        record = capture.records[seq]
        assert record.shape == (4, 64)
        assert capture.read_bits(record).tobytes() == blocks.tobytes()
        values = capture.read_values(record)
        assert values.shape == (4, 64)
        assert values.tobytes() == dequantize(blocks, GGMLQuantizationType.Q8_0).tobytes()
        assert np.abs(values - weights).max() < 0.05
        assert capture.read_values(record, (1,)).tolist() == values[1].tolist()


def test_root_attributes_and_tables_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cap.h5"
    with CaptureWriter(path, CaptureMeta(role="oracle", engine_name="mlx-lm", model_id="qwen3-tiny", seed=42, provenance={"sha": "ab"})) as writer:
        first = writer.add_tensor("q", np.zeros((2, 64), np.float32), step=0, segment="visual", layer=0, kernel_id="k1", contract_id="c1", effective_contract_id="c2")
        writer.add_tensor("q", np.ones((2, 64), np.float32), step=0, segment="visual", layer=0)
        writer.add_dispatch(index_seq=first, call=0, kv_group=1, head_start=4, head_count=4, q_heads=8, kv_heads=2, q_rows=2, kv_len=9, head_dim=64, mask_kind="causal", primitive="fallback", metal_primitive="sdpa_vector")
        writer.add_token(step=0, segment="visual", token_id=99, is_stop=True)
        writer.end_step()
    with open_capture(path) as capture:
        assert (capture.meta.role, capture.meta.engine_name, capture.meta.model_id, capture.meta.seed) == ("oracle", "mlx-lm", "qwen3-tiny", 42)
        assert capture.meta.provenance == {"sha": "ab"}
        assert [r.occurrence for r in capture.records] == [0, 1]
        assert (capture.records[0].kernel_id, capture.records[0].effective_contract_id) == ("k1", "c2")
        event = capture.dispatch[0]
        assert (int(event["kv_group"]), int(event["head_start"]), cf.decode_field(event["metal_primitive"])) == (1, 4, "sdpa_vector")
        assert capture.tokens.tolist()[0][2:] == (99, 1)
        assert capture.describe() == "2 records, 1 token steps, 1 tokens, 1 dispatch events"


def test_strings_are_fixed_length_utf8_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "cap.h5"
    write_capture(path)
    with h5py.File(path, "r") as f:
        for name in ("format", *cf.STRING_ATTRS):
            tid = h5py.h5a.open(f.id, name.encode()).get_type()
            assert tid.get_class() == h5py.h5t.STRING and not tid.is_variable_str(), name
            assert tid.get_cset() == h5py.h5t.CSET_UTF8, name
        index_type = f[cf.INDEX_PATH].id.get_type()
        name_field = index_type.get_member_type(index_type.get_member_index(b"name"))
        assert not name_field.is_variable_str() and name_field.get_cset() == h5py.h5t.CSET_UTF8
        assert f[cf.INDEX_PATH].dtype == cf.INDEX_DTYPE
        assert f.attrs[cf.ATTR_PROVENANCE].dtype == np.uint8


def test_writer_refuses_unknown_primitives(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path / "c.h5", CaptureMeta(role="native")) as writer:
        with pytest.raises(ValueError, match="primitive"):
            writer.add_dispatch(index_seq=0, call=0, kv_group=0, head_start=0, head_count=1, q_heads=1, kv_heads=1, q_rows=1, kv_len=1, head_dim=64, primitive="flash")


def test_writing_a_capture_leaves_other_files_beside_it_alone_and_keeps_the_usual_permissions(tmp_path: Path) -> None:
    """The skeleton is written under a fresh hidden name, then renamed to the capture's own: a
    fixed temporary name (".x.h5.partial") replaced whatever file had that name."""
    stray = tmp_path / ".x.h5.partial"
    stray.write_bytes(b"a file of the user's")
    write_capture(tmp_path / "x.h5")
    assert stray.read_bytes() == b"a file of the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.h5.partial", "x.h5"]
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "x.h5").stat().st_mode & 0o777 == 0o666 & ~umask
    with open_capture(tmp_path / "x.h5") as capture:
        assert len(capture.records) == len(tensors())


def test_a_capture_that_cannot_be_created_is_named_by_its_own_path_not_the_hidden_one(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(OSError) as refused:
        CaptureWriter(blocked / "x.h5", CaptureMeta(role="native", engine_name="e"))
    assert str(refused.value) == f"{blocked / 'x.h5'}: cannot be written (Not a directory)"


def test_the_prompt_and_provenance_of_a_run_of_thirty_thousand_tokens_are_written_and_read_back(tmp_path: Path) -> None:
    """libhdf5's earliest file format holds no attribute over 64 KiB: recording a prompt of about
    8,000 real token ids or more failed with "object header message is too large"."""
    tokens = list(range(100_000, 130_000))
    prompt = ",".join(map(str, tokens))
    meta = CaptureMeta(role="native", engine_name="e", prompt=prompt, provenance={"prompt_tokens": tokens})
    with CaptureWriter(tmp_path / "long.h5", meta) as writer:
        writer.add_tensor("l_out", np.ones((2, 4), np.float32), step=0, segment="prefill", layer=0)
        writer.end_step()
    with open_capture(tmp_path / "long.h5") as capture:
        assert len(prompt) == 209_999 and capture.meta.prompt == prompt
        assert capture.meta.provenance["prompt_tokens"] == tokens
        assert capture.complete and len(capture.records) == 1
