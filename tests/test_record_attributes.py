"""A record's raw HDF5 attributes are listed as the file states them; what cannot be shown is a row saying why."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from sessions.capture import format as cf
from sessions.capture.meta import CaptureMeta
from sessions.capture.reader import load_capture
from sessions.capture.record_attributes import MAX_SHOWN_BYTES, record_attributes
from sessions.capture.writer import CaptureWriter
from tests.hand_captures import bf16_bits

SOURCES = ["blk.0.ffn_gate.weight", "ffn_norm-0"]


def _capture(path: Path, layout: str = "datasets") -> Path:
    """Two bfloat16 records as the llama.cpp recorder writes them (each with `ggml_src`)."""
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="hand llama.cpp"), layout=layout) as writer:
        for name in ("ffn_gate-0", "ffn_up-0"):
            writer.add_tensor(name, bf16_bits([[1.0, 2.0], [3.0, 4.0]]), step=0, segment="prefill", layer=0, dtype="bfloat16",
                              kernel_id="MUL_MAT", attrs={"ggml_src": json.dumps(SOURCES)})
        writer.end_step()
    return path


def test_a_recorders_attributes_and_the_index_row_are_listed_with_type_shape_and_value(tmp_path: Path) -> None:
    with load_capture(_capture(tmp_path / "llama.h5")) as capture:
        shown = record_attributes(capture, capture.records[1], "native")

    assert shown.path == cf.tensor_path(1)
    assert dict(shown.index_row)["name"] == "ffn_up-0" and dict(shown.index_row)["kernel_id"] == "MUL_MAT"
    assert dict(shown.index_row)["shape"] == "(2, 2)"
    assert shown.stored == "uint16 little-endian, shape (2, 2)"
    rows = {row.name: row for row in shown.attributes}
    assert (rows["logical_dtype"].hdf5_type, rows["logical_dtype"].shape, rows["logical_dtype"].value) == ("fixed-length string, 8 bytes (UTF-8)", "scalar", "bfloat16")
    assert json.loads(rows["ggml_src"].value) == SOURCES
    assert not any(row.problem for row in shown.attributes)


def test_a_packed_record_shows_its_own_attributes_of_the_pack_and_not_its_neighbours(tmp_path: Path) -> None:
    with load_capture(_capture(tmp_path / "packed.h5", layout="packed")) as capture:
        first, second = (record_attributes(capture, capture.records[i], "native") for i in (0, 1))
    assert first.path == second.path
    assert [row.name for row in first.attributes] == ["ggml_src[] element 0"]
    assert [row.name for row in second.attributes] == ["ggml_src[] element 1"]
    assert second.attributes[0].shape == "(2,)" and not second.attributes[0].problem
    assert json.loads(second.attributes[0].value) == SOURCES
    assert dict(second.index_row)["name"] == "ffn_up-0"


def test_hostile_and_oversized_attributes_become_rows_that_say_why_and_nothing_is_read(tmp_path: Path) -> None:
    path = _capture(tmp_path / "hostile.h5")
    with h5py.File(path, "r+", libver="latest") as f:
        old = f[cf.tensor_path(0)]
        data, kept = old[()], dict(old.attrs)
        del f[cf.tensor_path(0)]
        target = f.create_dataset(cf.tensor_path(0), data=data)  # a new object header: attributes over 64 KiB fit
        for name, value in kept.items():
            target.attrs[name] = value
        target.attrs.create("notes", "kept in the global heap", dtype=h5py.string_dtype())
        target.attrs.create("blob", np.zeros(4 * MAX_SHOWN_BYTES, dtype=np.uint8))
        target.attrs.create(b"\xffname", np.int64(3))
        target.attrs.create("scale", np.float32(0.5))
        del f[cf.tensor_path(1)]
        f[cf.tensor_path(1)] = h5py.ExternalLink("/etc/hostname", "/data")

    with load_capture(path) as capture:  # the structure check refuses this file; the listing must still not fail
        first = record_attributes(capture, capture.records[0], "native")
        linked = record_attributes(capture, capture.records[1], "native")

    rows = {row.name: row for row in first.attributes}
    assert rows["notes"].problem and rows["notes"].hdf5_type == "variable-length string (UTF-8)"
    assert "variable-length string" in rows["notes"].value
    assert rows["blob"].problem and rows["blob"].shape == f"({4 * MAX_SHOWN_BYTES},)"
    assert f"declares {4 * MAX_SHOWN_BYTES} bytes" in rows["blob"].value
    assert rows["\ufffdname"].problem and "not UTF-8" in rows["\ufffdname"].value
    assert (rows["scale"].hdf5_type, rows["scale"].value, rows["scale"].problem) == ("float32 little-endian", "0.5", False)
    assert rows["ggml_src"].value == json.dumps(SOURCES)
    [refused] = linked.attributes
    assert refused.problem and "external link to /etc/hostname" in refused.value and linked.stored == "not opened"
