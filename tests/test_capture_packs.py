"""Packs: many tensors' bytes in one 1-D byte dataset, placed by each index row's offset and nbytes.

The same tensors written in packs and in datasets of their own read back the same bits, whole
and in any slice, and compare as parity; a pack is checked once however many records it holds;
and every way a hostile file can misplace a record's bytes is refused by name, place and reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quantize
from hand_captures import T, bf16_bits, write_capture

from sessions.capture import format as cf
from sessions.capture.columns import IndexColumns
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.reader import (
    CaptureError,
    RecordReader,
    load_capture,
    stored_span,
)
from sessions.capture.record_attributes import record_attributes
from sessions.capture.record_scan import RecordScan
from sessions.capture.records import (
    record_from_row,
    records_from_columns,
    records_from_index,
)
from sessions.capture.structure_check import (
    SHARDING_MIN_DATASETS,
    check_here,
    occurrence_counts,
)
from sessions.capture.writer import OWN_PACK_BYTES, CaptureWriter
from sessions.compare.comparison import CompareOptions, iter_compare
from sessions.compare.record_sources import record_sources
from sessions.compare.verdict import PARITY
from sessions.progress import run_to_end

SELECTIONS: list[tuple[slice | int, ...] | None] = [
    None,
    (slice(1, 3),),
    (2,),
    (slice(None), slice(1, 4)),
    (slice(0, 4, 2), slice(None, None, 3)),
    (slice(None), 1),
    (slice(3, 3),),
]


def every_kind() -> dict[str, tuple[np.ndarray, dict[str, object]]]:
    """Tensors of every stored kind, with the writer arguments each needs; the last, of 4 MiB, a pack of its own."""
    rng = np.random.default_rng(5)
    blocks = quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    return {
        "bf16": (bf16_bits(rng.standard_normal((4, 6))), {"dtype": "bfloat16"}),
        "f16": (np.array([0x0000, 0x8000, 0x7E01, 0xFC00, 0x0001, 0x7BFF] * 4, np.uint16).view(np.float16).reshape(4, 6), {}),
        "f32": (rng.standard_normal((4, 6, 5)).astype(np.float32), {}),
        "f64": (rng.standard_normal((5, 6)), {}),
        "i8": (rng.integers(-128, 127, size=(4, 6), dtype=np.int8), {}),
        "u64": (rng.integers(0, 2**63, size=(4, 6), dtype=np.uint64), {}),
        "mask": (rng.random((4, 6)) > 0.5, {}),
        "scalar": (np.float32(2.5), {}),
        "empty": (np.zeros((0, 6), np.float32), {}),
        "q8": (blocks, {"dtype": "q8_0", "logical_shape": (4, 64)}),
        "big": (rng.standard_normal((1024, 1024)).astype(np.float32), {}),
    }


def write_every_kind(path: Path, layout: str, compression: str | None = None) -> dict[str, np.ndarray]:
    tensors = every_kind()
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="packs"), compression=compression, layout=layout) as writer:
        for step in range(2):
            for name, (array, extra) in tensors.items():
                if step == 0 or name != "big":
                    writer.add_tensor(name, array, step=step, segment="prefill" if step == 0 else "decode", **extra)  # type: ignore[arg-type]
            writer.end_step()
    return {name: array for name, (array, _) in tensors.items()}


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
def test_both_layouts_read_back_the_same_bits_whole_and_in_every_slice(tmp_path: Path, compression: str | None) -> None:
    written = write_every_kind(tmp_path / "packed.h5", "packed", compression)
    write_every_kind(tmp_path / "datasets.h5", "datasets", compression)
    with open_capture(tmp_path / "packed.h5", check_in_child=False) as packed, open_capture(tmp_path / "datasets.h5", check_in_child=False) as datasets:
        assert all(r.packed for r in packed.records) and not any(r.packed for r in datasets.records)
        assert len({r.path for r in packed.records}) == 3, "one pack per step, and one of its own for the 4 MiB tensor"
        for mine, theirs in zip(packed.records, datasets.records):
            original = written[mine.name]
            assert packed.read_bits(mine).tobytes() == datasets.read_bits(theirs).tobytes() == np.asarray(original).tobytes(), mine.name
            assert packed.read_values(mine).tobytes() == datasets.read_values(theirs).tobytes(), mine.name
            if mine.name in ("q8", "scalar"):
                continue
            for selection in SELECTIONS:
                if selection is not None and len(selection) > len(mine.shape):
                    continue
                if mine.shape[0] == 0 and selection == (2,):
                    for capture, record in ((packed, mine), (datasets, theirs)):
                        with pytest.raises(CaptureError, match="data cannot be read"):
                            capture.read_bits(record, selection)
                    continue
                mine_bits, their_bits = packed.read_bits(mine, selection), datasets.read_bits(theirs, selection)
                assert (mine_bits.shape, mine_bits.tobytes()) == (their_bits.shape, their_bits.tobytes()), (mine.name, selection)
        q8 = next(r for r in packed.records if r.name == "q8")
        assert packed.read_bits(q8).shape == (4, 68), "GGML blocks as quantize returns them: one row of block bytes per row"


def test_strided_and_odd_sized_tensors_are_packed_in_their_logical_order(tmp_path: Path) -> None:
    """A recorder hands the writer views of permuted tensors: their bytes land in the pack in
    the logical (C) order, whatever the strides, next to records of odd byte counts."""
    base = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    tensors = [
        T("odd", np.arange(3, dtype=np.uint8), dtype="uint8"),
        T("permuted", base.transpose(2, 0, 1)),
        T("strided", base[:, ::2, 1::2]),
        T("bf16-permuted", bf16_bits(base).transpose(1, 2, 0), dtype="bfloat16"),
        T("empty", np.zeros((0, 4), np.float32)),
    ]
    path = write_capture(tmp_path / "strided.h5", "native", tensors)
    with open_capture(path) as capture:
        read = {r.name: capture.read_bits(r) for r in capture.records}
        assert [r.offset for r in capture.records] == [0, 3, 99, 131, 179]
    assert read["permuted"].tobytes() == np.ascontiguousarray(base.transpose(2, 0, 1)).tobytes()
    assert read["strided"].tobytes() == np.ascontiguousarray(base[:, ::2, 1::2]).tobytes()
    assert read["bf16-permuted"].tobytes() == np.ascontiguousarray(bf16_bits(base).transpose(1, 2, 0)).tobytes()
    assert read["odd"].tolist() == [0, 1, 2] and read["empty"].shape == (0, 4)


def test_a_packed_record_is_read_into_the_callers_buffer_and_its_span_is_its_bytes_in_the_file(tmp_path: Path) -> None:
    written = write_every_kind(tmp_path / "packed.h5", "packed")
    raw = (tmp_path / "packed.h5").read_bytes()
    with open_capture(tmp_path / "packed.h5") as capture:
        for record in capture.records[:11]:
            span = stored_span(capture, record)
            assert span is not None and span[1] == record.nbytes
            assert raw[span[0] : span[0] + span[1]] == np.asarray(written[record.name]).tobytes(), record.name
        record = capture.records[2]
        reader = RecordReader(capture, record)
        out = np.empty((2, 6, 5), np.float32)
        assert reader.read_into(out, (slice(1, 3),)) is out
        assert np.array_equal(out, written["f32"][1:3])
        columns = np.empty((4, 6, 2), np.float32)
        assert np.array_equal(reader.read_into(columns, (slice(None), slice(None), slice(3, 5))), written["f32"][:, :, 3:5])


def test_a_compressed_pack_keeps_its_bounded_chunk_decoding(tmp_path: Path) -> None:
    """A pack's chunk whose stream inflates past its declared size is refused at that chunk."""
    path = tmp_path / "gzip.h5"
    write_every_kind(path, "packed", "gzip")
    pack = cf.pack_path(0)
    with h5py.File(path, "r+") as f:
        chunk = f[pack].id.get_chunk_info(0).chunk_offset
        f[pack].id.write_direct_chunk(chunk, b"\x78\x9c" + bytes(40))
    with open_capture(path) as capture, pytest.raises(CaptureError) as refused:
        capture.read_bits(capture.records[0])
    assert (refused.value.location, refused.value.problem) == (f"{pack} chunk at {chunk}", "its deflate stream is corrupt (invalid stored block lengths)")


def test_the_same_tensors_in_either_layout_compare_as_parity(tmp_path: Path) -> None:
    """The comparison reads canonical row ranges in chunks: from a pack, through a layout
    transform whose rows are the third stored axis, and from datasets of their own; GGML
    blocks whole, as bytes."""
    rng = np.random.default_rng(3)
    sdpa = bf16_bits(rng.standard_normal((64, 4, 8)))
    residual = rng.standard_normal((64, 32)).astype(np.float32)
    blocks = quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    llama = [
        T("kqv_out-0", sdpa.reshape(64, 32), layer=0, dtype="bfloat16"),
        T("l_out-0", residual, layer=0),
        T("ffn_out-0", blocks, layer=0, dtype="q8_0", logical_shape=(4, 64)),
    ]
    mlx = [
        T("model.layers.0.self_attn.sdpa", sdpa.transpose(1, 0, 2)[None].copy(), layer=0, dtype="bfloat16"),
        T("model.layers.0", residual[None].copy(), layer=0),
    ]
    for native_layout, oracle_layout in (("packed", "datasets"), ("datasets", "packed")):
        for oracle, ops in ((mlx, ["layer_out", "sdpa"]), (llama, ["ffn_down", "layer_out", "sdpa"])):
            n = write_capture(tmp_path / f"n-{native_layout}.h5", "native", llama, layout=native_layout)
            o = write_capture(tmp_path / f"o-{oracle_layout}-{len(oracle)}.h5", "oracle", oracle, layout=oracle_layout)
            with open_capture(n, check_in_child=False) as native_capture, open_capture(o, check_in_child=False) as oracle_capture:
                comparison = run_to_end(iter_compare(native_capture, oracle_capture, CompareOptions(chunk_bytes=7 * 64)))
            assert sorted(p.key.op for p in comparison.pairs) == ops
            assert all(p.metrics.bit_exact for p in comparison.pairs), (native_layout, oracle_layout, ops)
            if oracle is llama:
                assert comparison.verdict.word == PARITY


def test_a_pack_is_checked_once_and_no_row_needs_a_dataset_check(tmp_path: Path) -> None:
    path = tmp_path / "packed.h5"
    write_every_kind(path, "packed")
    with load_capture(path) as capture:
        scan = RecordScan(capture)
        assert scan.problems(0, len(capture.index)) == [] and scan.thorough_rows == 0
    assert check_here(path).problems == []


def test_recorder_attributes_of_packed_records_are_one_table_per_pack_with_an_element_per_record(tmp_path: Path) -> None:
    path = tmp_path / "sources.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        for i in range(3):
            sources = {"ggml_src": f'["blk.{i}.attn_output.weight", "kqv_out-{i}"]'} if i != 1 else None
            writer.add_tensor(f"node_{i}", np.ones(4, np.float32), step=0, segment="prefill", layer=i, attrs=sources)
        writer.end_step()
    with h5py.File(path, "r") as f:
        pack = f[cf.pack_path(0)]
        assert list(pack.attrs) == ["ggml_src[]"]
        table = pack.attrs["ggml_src[]"]
        assert table.shape == (3,) and table[1] == b""
        assert pack.attrs.get_id("ggml_src[]").get_type().get_cset() == h5py.h5t.CSET_UTF8
    with open_capture(path) as capture:
        assert record_sources(capture) == {0: ("blk.0.attn_output.weight", "kqv_out-0"), 2: ("blk.2.attn_output.weight", "kqv_out-2")}


def test_a_pack_is_closed_before_its_attribute_table_would_pass_what_libhdf5_stores(tmp_path: Path) -> None:
    path = tmp_path / "many.h5"
    text = json.dumps(["blk.0.ffn_down.weight", "x" * 170])
    per_pack = cf.ATTRIBUTE_TABLE_BYTES // len(text)
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        for i in range(per_pack + 5):
            given = None if i == per_pack else {"ggml_src": text}
            writer.add_tensor("node_1", np.full(4, i, np.float32), step=0, segment="prefill", layer=0, attrs=given)
        writer.add_tensor("big", np.zeros(OWN_PACK_BYTES // 4, np.float32), step=0, segment="prefill", layer=0, attrs={"ggml_src": "[]"})
        writer.end_step()
    with h5py.File(path, "r") as f:
        sizes = {name: len(pack.attrs["ggml_src[]"]) for name, pack in f[cf.step_group_path(0)].items()}
    assert sizes == {"p00000000": per_pack, f"p{per_pack:08d}": 5, f"p{per_pack + 5:08d}": 1}
    with open_capture(path) as capture:
        sources = record_sources(capture)
        assert [capture.read_bits(capture.records[seq])[0] for seq in (per_pack - 1, per_pack)] == [per_pack - 1, per_pack]
    assert len(sources) == per_pack + 5 and per_pack not in sources, "a record without the attribute still has its (empty) element"
    assert sources[per_pack + 1] == ("blk.0.ffn_down.weight", "x" * 170) and sources[per_pack + 5] == ()


def test_an_attribute_too_large_for_a_table_is_refused_when_added_with_its_name(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path / "refused.h5", CaptureMeta(role="native")) as writer:
        with pytest.raises(ValueError, match="node_0: attribute 'ggml_src' is 60001 bytes; an attribute holds at most 60000"):
            writer.add_tensor("node_0", np.ones(4, np.float32), step=0, segment="prefill", attrs={"ggml_src": "x" * 60_001})
        with pytest.raises(ValueError, match="node_0: attribute name 'nnnn.* is over 255 bytes"):
            writer.add_tensor("node_0", np.ones(4, np.float32), step=0, segment="prefill", attrs={"n" * 256: "[]"})
        writer.end_step()


def test_a_file_written_before_attribute_tables_still_gives_each_packed_records_own_attribute(tmp_path: Path) -> None:
    path = tmp_path / "before_tables.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        for i in range(2):
            writer.add_tensor(f"node_{i}", np.ones(4, np.float32), step=0, segment="prefill", layer=i)
        writer.end_step()
    with h5py.File(path, "r+") as f:
        f[cf.pack_path(0)].attrs.create("ggml_src[1]", np.bytes_(b'["blk.1.attn_output.weight"]'), dtype=cf.utf8(28))
    with open_capture(path) as capture:
        assert record_sources(capture) == {1: ("blk.1.attn_output.weight",)}


def test_a_pack_written_before_attribute_tables_with_a_thousand_records_attributes_is_read(tmp_path: Path) -> None:
    path = tmp_path / "before_tables.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        for i in range(1100):
            writer.add_tensor(f"node_{i}", np.ones(4, np.float32), step=0, segment="prefill", layer=0)
        writer.end_step()
    with h5py.File(path, "r+") as f:
        pack = f[cf.pack_path(0)]
        for seq in range(1100):
            pack.attrs.create(f"ggml_src[{seq}]", np.bytes_(b'["blk.0.attn_output.weight"]'), dtype=cf.utf8(28))
    with open_capture(path) as capture:
        assert len(record_sources(capture)) == 1100


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(lambda texts: (texts[:2], cf.utf8(18)), id="one element short"),
        pytest.param(lambda texts: (np.stack([texts, texts]), cf.utf8(18)), id="two-dimensional"),
        pytest.param(lambda texts: (texts[:1].reshape(()), cf.utf8(18)), id="scalar"),
        pytest.param(lambda texts: (np.arange(3, dtype=np.int64), None), id="integers"),
    ],
)
def test_a_table_that_does_not_fit_its_packs_records_gives_no_record_an_element_of_it(
    tmp_path: Path, table: Callable[[np.ndarray], tuple[np.ndarray, np.dtype | None]]
) -> None:
    path = tmp_path / "bad_table.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        for i in range(3):
            writer.add_tensor(f"node_{i}", np.ones(4, np.float32), step=0, segment="prefill", layer=i, attrs={"ggml_src": f'["blk.{i}.x.weight"]'})
        writer.end_step()
    with h5py.File(path, "r+") as f:
        pack = f[cf.pack_path(0)]
        value, dtype = table(pack.attrs["ggml_src[]"])
        pack.attrs.create("ggml_src[]", value, dtype=dtype)
    with open_capture(path) as capture:
        assert record_sources(capture) == {}
        shown = record_attributes(capture, capture.records[1], "native").attributes
    assert [(row.name, row.problem) for row in shown] == [("ggml_src[]", True)]


def test_a_file_written_before_packs_existed_reads_every_row_as_a_dataset_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "old.h5"
    write_every_kind(path, "datasets")
    old_fields = [name for name in cf.INDEX_DTYPE.names or () if name not in cf.INDEX_OPTIONAL_FIELDS]
    with h5py.File(path, "r+") as f:
        rows = f[cf.INDEX_PATH][()]
        committed = f[cf.INDEX_PATH].attrs[cf.ATTR_COMMITTED_ROWS]
        del f[cf.INDEX_PATH]
        old = f.create_dataset(cf.INDEX_PATH, data=rows[old_fields], maxshape=(None,), chunks=(1024,))
        old.attrs.create(cf.ATTR_COMMITTED_ROWS, committed)
    with open_capture(path) as capture:
        assert {(r.position, r.offset, r.nbytes) for r in capture.records} == {(-1, -1, -1)}
        assert capture.read_bits(capture.records[2]).shape == (4, 6, 5)


def test_records_are_a_sequence_built_on_demand(tmp_path: Path) -> None:
    path = tmp_path / "packed.h5"
    write_every_kind(path, "packed")
    with open_capture(path) as capture:
        records = capture.records
        every = records_from_index(capture.index)
        assert len(records) == len(every) == 21
        assert records[-1] == every[-1] and records[3:5] == every[3:5] and list(records) == every
        with pytest.raises(IndexError):
            records[21]


@pytest.mark.parametrize("layout", ["packed", "datasets"])
def test_a_walk_of_every_record_builds_what_rows_one_by_one_build(tmp_path: Path, layout: str) -> None:
    """A whole walk builds every record at once from the columns' codes (records_from_columns):
    the same records, scalars and empty tensors and quantized blocks among them."""
    path = tmp_path / f"{layout}.h5"
    write_every_kind(path, layout)
    with open_capture(path) as capture:
        rows = [record_from_row(row) for row in capture.index]
        assert records_from_columns(capture.columns) == rows
        assert list(capture.records) == rows
        assert {r.name: r.shape for r in rows if r.step == 0} == {
            "bf16": (4, 6), "f16": (4, 6), "f32": (4, 6, 5), "f64": (5, 6), "i8": (4, 6), "u64": (4, 6), "mask": (4, 6),
            "scalar": (), "empty": (0, 6), "q8": (4, 64), "big": (1024, 1024),
        }


def test_a_walk_of_a_real_captures_records_builds_what_rows_one_by_one_build(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    for native, oracle in demo_pairs.values():
        for path in (native, oracle):
            with open_capture(path) as capture:
                assert records_from_columns(capture.columns) == records_from_index(capture.index), path.name


def test_occurrence_counts_over_the_columns_follow_the_occurrence_rule() -> None:
    rng = np.random.default_rng(9)
    index = np.zeros(500, cf.INDEX_DTYPE)
    index["step"] = rng.integers(0, 3, 500)
    index["layer"] = rng.integers(-1, 2, 500)
    index["segment"] = rng.choice([b"prefill", b"decode"], 500)
    index["name"] = rng.choice([b"a", b"b", b"Qcur-0"], 500)
    seen: dict[tuple[int, bytes, int, bytes], int] = {}
    expected = []
    for row in index:
        key = (int(row["step"]), bytes(row["segment"]), int(row["layer"]), bytes(row["name"]))
        expected.append(seen.get(key, 0))
        seen[key] = expected[-1] + 1
    assert occurrence_counts(IndexColumns(index)).tolist() == expected


def base(path: Path) -> Path:
    """Two steps of three float32 tensors [4, 8] (128 bytes each), one pack per step."""
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="hostile-packs")) as writer:
        for step in range(2):
            for i in range(3):
                writer.add_tensor(f"t{i}", np.full((4, 8), step * 10 + i, np.float32), step=step, segment="decode", layer=i)
            writer.end_step()
    return path


def set_rows(**fields: dict[int, object]) -> Callable[[h5py.File], None]:
    """Overwrite index fields of some rows: set_rows(offset={1: 64})."""

    def mutate(f: h5py.File) -> None:
        index = f[cf.INDEX_PATH][()]
        for field, rows in fields.items():
            for row, value in rows.items():
                index[field][row] = value
        f[cf.INDEX_PATH][...] = index

    return mutate


def replace_pack(make: Callable[[h5py.File, str], None]) -> Callable[[h5py.File], None]:
    def mutate(f: h5py.File) -> None:
        data = f[cf.pack_path(0)][()]
        del f[cf.pack_path(0)]
        make(f, cf.pack_path(0))
        assert data.nbytes == 384

    return mutate


def external(f: h5py.File, path: str) -> None:
    f[path] = h5py.ExternalLink("elsewhere.h5", "/data")


PACK = cf.pack_path(0)
HOSTILE: dict[str, tuple[Callable[[h5py.File], None], str, str]] = {
    "nbytes not its dtype and shape": (
        set_rows(nbytes={1: 64}),
        "/index row 1 (t1)",
        "nbytes is not the byte count of its dtype and shape (64; a float32 tensor of shape (4, 8) takes 128)",
    ),
    "a range past the end of its pack": (set_rows(offset={2: 300}), "/index row 2 (t2)", f"its bytes [300, 428) end past its pack {PACK} (384 bytes)"),
    "a range overlapping another": (
        set_rows(offset={1: 64}),
        "/index row 1 (t1)",
        f"its bytes overlap another row's in the same pack ([64, 192) and /index row 0's [0, 128) in {PACK})",
    ),
    "an offset without nbytes": (
        set_rows(nbytes={0: -1}),
        "/index row 0 (t0)",
        "offset and nbytes are both -1 (the path names a dataset of its own) or both a byte range of a pack",
    ),
    "a pack named as a dataset of its own": (
        set_rows(offset={0: -1}, nbytes={0: -1}),
        "/index row 0 (t0)",
        "its dataset is also a pack of other rows' bytes",
    ),
    "a pack of float32": (
        replace_pack(lambda f, path: f.create_dataset(path, data=np.zeros(96, np.float32))),
        PACK,
        "is a pack of float32; a pack holds bytes (H5T_STD_U8LE)",
    ),
    "a 2-D pack": (
        replace_pack(lambda f, path: f.create_dataset(path, data=np.zeros((3, 128), np.uint8))),
        PACK,
        "is a pack of shape (3, 128); a pack is 1-D",
    ),
    "a fletcher32 pack": (
        replace_pack(lambda f, path: f.create_dataset(path, data=np.zeros(384, np.uint8), chunks=(128,), fletcher32=True)),
        PACK,
        "uses filter id 3 (fletcher32); allowed filters: deflate (gzip) (1), shuffle (2), lzf (32000)",
    ),
    "a pack that is an external link": (
        replace_pack(external),
        f"/index row 0 (t0) -> {PACK}",
        "is an external link to elsewhere.h5:/data; captures may not point at other files",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_misplaced_record_or_a_bad_pack_is_refused_by_place_and_reason(tmp_path: Path, case: str) -> None:
    mutate, location, problem = HOSTILE[case]
    path = base(tmp_path / "hostile.h5")
    with h5py.File(path, "r+") as f:
        mutate(f)
    found = check_here(path).problems
    assert (found[0].location, found[0].problem) == (location, problem), found
    assert len({(p.location, p.problem) for p in found}) == len(found), "a pack's problem is reported once, not per record"


def test_an_open_refuses_a_range_past_its_pack_naming_the_file(tmp_path: Path) -> None:
    path = base(tmp_path / "hostile.h5")
    with h5py.File(path, "r+") as f:
        set_rows(offset={5: 1 << 62})(f)
    with pytest.raises(CaptureError) as refused:
        open_capture(path)
    assert (refused.value.path, refused.value.location) == (str(path), "/index row 5 (t2)")
    assert refused.value.problem == f"its bytes [{1 << 62}, {(1 << 62) + 128}) end past its pack {cf.pack_path(3, 1)} (384 bytes)"


@pytest.mark.parametrize("check_in_child", [True, False], ids=["checked-in-a-child", "opened-without-the-check"])
def test_an_open_refuses_overlapping_rows_whether_or_not_the_child_checked_them(tmp_path: Path, check_in_child: bool) -> None:
    path = base(tmp_path / "hostile.h5")
    with h5py.File(path, "r+") as f:
        set_rows(offset={1: 64})(f)
    with pytest.raises(CaptureError) as refused:
        open_capture(path, check_in_child=check_in_child)
    assert (refused.value.location, refused.value.problem) == HOSTILE["a range overlapping another"][1:]


@pytest.mark.parametrize("layout", ["chunked", "compact"])
def test_packs_stored_chunked_or_compact_are_valid(tmp_path: Path, layout: str) -> None:
    path = base(tmp_path / f"{layout}.h5")
    with h5py.File(path, "r+") as f:
        data = f[PACK][()]
        del f[PACK]
        if layout == "chunked":
            f.create_dataset(PACK, data=data, chunks=(100,))
        else:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            h5py.h5d.create(f.id, PACK.encode(), h5py.h5t.STD_U8LE, h5py.h5s.create_simple((384,)), dcpl=dcpl).write(
                h5py.h5s.ALL, h5py.h5s.ALL, data
            )
    assert check_here(path).problems == []
    with open_capture(path) as capture:
        assert [float(capture.read_values(r)[1, 2]) for r in capture.records] == [0, 1, 2, 10, 11, 12]
        assert stored_span(capture, capture.records[0]) is None, "chunked and compact data is no single run of the file"


def test_bf16_bits_in_a_pack_keep_nan_payloads_and_signed_zero(tmp_path: Path) -> None:
    bits = np.array([0x0000, 0x8000, 0x7FC1, 0xFFC3, 0x7F80, 0xFF80, 0x0001, 0x3F80], np.uint16)
    path = tmp_path / "bf16.h5"
    with CaptureWriter(path, CaptureMeta(role="native")) as writer:
        writer.add_tensor("x", bits.view(ml_dtypes.bfloat16), step=0, segment="prefill")
        writer.end_step()
    with open_capture(path) as capture:
        assert capture.read_bits(capture.records[0]).tolist() == bits.tolist()


def test_only_many_datasets_of_their_own_are_shared_out_between_checking_children(tmp_path: Path) -> None:
    """Each checking child says how many rows name datasets of their own (each checked on its
    own); with fewer than SHARDING_MIN_DATASETS the first child checks every row and the parent
    starts no other, so a packed capture costs one child however large it is."""
    path = tmp_path / "datasets.h5"
    write_every_kind(path, "datasets")
    with h5py.File(path, "r+") as f:
        last = cf.decode_field(f[cf.INDEX_PATH][-1]["path"])
        f[last].attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float16"))
    said: list[int] = []
    first = check_here(path, shard=0, shards=2, announce=said.append)
    second = check_here(path, shard=1, shards=2, announce=said.append)
    assert said == [21, 21] and 21 < SHARDING_MIN_DATASETS
    assert [p.location for p in first.problems] == [f"{last} attribute 'logical_dtype'"] and second.problems == []
    write_every_kind(tmp_path / "packed.h5", "packed")
    assert check_here(tmp_path / "packed.h5", announce=said.append).problems == [] and said[-1] == 0


def test_a_pack_cut_short_after_its_check_is_a_located_read_error(tmp_path: Path) -> None:
    """Contiguous packs are read with pread: bytes the file no longer has are an error, never zeros."""
    path = base(tmp_path / "cut.h5")
    with open_capture(path) as capture:
        span = stored_span(capture, capture.records[4])
        assert span is not None
        os.truncate(path, span[0] + 10)
        with pytest.raises(CaptureError) as refused:
            capture.read_bits(capture.records[4])
    assert refused.value.location == cf.pack_path(3, 1)
    assert refused.value.problem == f"data cannot be read (the file ends at byte {span[0] + 10}, inside this record's bytes (cut short since it was checked))"


def test_a_capture_replaced_at_its_path_while_open_is_still_read_from_the_file_it_opened(tmp_path: Path) -> None:
    path = base(tmp_path / "first.h5")
    with open_capture(path) as capture:
        other = base(tmp_path / "other.h5")
        with h5py.File(other, "r+") as f:
            f[PACK][...] = np.zeros(384, np.uint8)
        os.replace(other, path)
        assert capture.read_values(capture.records[1]).tolist() == np.full((4, 8), 1, np.float32).tolist()
