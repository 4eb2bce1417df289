"""Importers turn engine dumps into captures that keep every bit, and refuse bad manifests by entry."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.commands import import_dump as import_command
from sessions.importers import iter_import
from sessions.importers.manifest import MAX_MANIFEST_BYTES, infer_layer
from sessions.importers.sources import MAX_IMPORT_BYTES
from tests.side_files import fifo_without_writer, sparse_file
from viewer.cli import build_parser


def _import(kind: str, source: Path, out: Path, **kwargs: object) -> Path:
    work = iter_import(kind, source, out, **kwargs)  # type: ignore[arg-type]
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


def _manifest(directory: Path, entries: object) -> Path:
    path = directory / "manifest.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def test_a_directory_of_npy_and_bin_files_imports_in_step_and_order(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    q = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(dump / "q.npy", q)
    k_bits = np.array([0x8000, 0x7FC1, 0x3F80, 0x0001], dtype="<u2")
    k_bits.tofile(dump / "k.bin")
    _manifest(dump, {
        "meta": {"engine_name": "my-engine", "role": "native"},
        "entries": [
            {"name": "Qcur-0", "file": "q.npy", "step": 0, "order": 2},
            {"name": "Kcur-0", "file": "k.bin", "dtype": "bfloat16", "shape": [2, 2], "step": 0, "order": 1},
            {"name": "l_out-0", "file": "q.npy", "step": 1, "segment": "decode", "order": 0},
        ],
        "tokens": [{"step": 0, "segment": "prefill", "token_id": 7}],
    })
    with open_capture(_import("dir", dump, tmp_path / "x.h5"), check_in_child=False) as capture:
        records = capture.records
        assert [(r.step, r.name, r.layer, r.dtype) for r in records] == [
            (0, "Kcur-0", 0, "bfloat16"), (0, "Qcur-0", 0, "float32"), (1, "l_out-0", 0, "float32"),
        ]
        assert capture.read_bits(records[0]).ravel().tolist() == k_bits.tolist()
        assert np.array_equal(capture.read_values(records[1]), q)
        assert capture.meta.engine_name == "my-engine"
        assert [int(t) for t in capture.tokens["token_id"]] == [7]


def test_a_token_row_without_a_segment_takes_the_entries_default_segment(tmp_path: Path) -> None:
    """It took "" and report keyed the step's logits `0::-1:logits`."""
    dump = tmp_path / "dump"
    dump.mkdir()
    np.save(dump / "logits.npy", np.zeros((1, 4), np.float32))
    _manifest(dump, {"entries": [{"name": "result_output", "file": "logits.npy"}], "tokens": [{"step": 0, "token_id": 3}]})
    with open_capture(_import("dir", dump, tmp_path / "x.h5"), check_in_child=False) as capture:
        assert [(r.segment, t) for r, t in zip(capture.records, capture.tokens["segment"].tolist())] == [("prefill", b"prefill")]


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_manifest_provenance_may_nest_as_deep_as_a_captures_and_no_deeper(tmp_path: Path) -> None:
    """The depth limit counted the manifest's own two levels: a provenance 63 deep was refused on
    import, as "not valid JSON", though a capture may hold one 64 deep."""
    dump = tmp_path / "dump"
    dump.mkdir()
    np.save(dump / "q.npy", np.zeros(4, np.float32))
    manifest = {"meta": {"provenance": _nested(64)}, "entries": [{"name": "l_out-0", "file": "q.npy"}]}
    _manifest(dump, manifest)
    with open_capture(_import("dir", dump, tmp_path / "x.h5"), check_in_child=False) as capture:
        assert capture.meta.provenance["a"] == _nested(63)
    manifest["meta"]["provenance"] = _nested(65)  # type: ignore[index]
    path = _manifest(dump, manifest)
    with pytest.raises(CaptureError) as refused:
        _import("dir", dump, tmp_path / "y.h5")
    assert (refused.value.path, refused.value.location, refused.value.problem) == (str(path), "file", "its values nest 67 levels deep, past the 66 a reader follows")


def test_safetensors_keep_bfloat16_bits_and_read_layers_from_names(tmp_path: Path) -> None:
    bits = np.array([0x8000, 0x0000, 0x7FC1, 0xFFC3], dtype=np.uint16)
    source = tmp_path / "dump.safetensors"
    save_file({"model.layers.3.mlp.down_proj": bits.view(ml_dtypes.bfloat16), "lm_head": np.ones((1, 2), np.float16)}, str(source))
    with open_capture(_import("safetensors", source, tmp_path / "x.h5"), check_in_child=False) as capture:
        by_name = {r.name: r for r in capture.records}
        assert by_name["model.layers.3.mlp.down_proj"].layer == 3
        assert by_name["model.layers.3.mlp.down_proj"].dtype == "bfloat16"
        assert capture.read_bits(by_name["model.layers.3.mlp.down_proj"]).tolist() == bits.tolist()
        assert by_name["lm_head"].layer == -1
        assert capture.meta.provenance == {"imported_from": str(source.resolve()), "import_kind": "safetensors"}, "no manifest was given: the source is none"


def test_npz_with_a_manifest_reinterprets_a_same_width_dtype(tmp_path: Path) -> None:
    source = tmp_path / "dump.npz"
    np.savez(source, a=np.array([0x3C00, 0x8000], dtype=np.uint16))
    manifest = _manifest(tmp_path, [{"name": "attn_norm-2", "key": "a", "dtype": "float16", "shape": [2]}])
    with open_capture(_import("npz", source, tmp_path / "x.h5", manifest=manifest), check_in_child=False) as capture:
        (record,) = capture.records
        assert (record.name, record.layer, record.dtype) == ("attn_norm-2", 2, "float16")
        values = capture.read_values(record)
        assert values.tolist() == [1.0, 0.0] and np.signbit(values[1])
        assert capture.meta.provenance["manifest"] == str(Path(manifest).resolve())


def test_quantized_bin_blocks_are_kept_raw_with_their_logical_shape(tmp_path: Path) -> None:
    import gguf

    values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    blocks.tofile(tmp_path / "w.bin")
    _manifest(tmp_path, [{"name": "w", "file": "w.bin", "dtype": "q8_0", "shape": [2, 32]}])
    with open_capture(_import("dir", tmp_path, tmp_path / "x.h5"), check_in_child=False) as capture:
        (record,) = capture.records
        assert record.shape == (2, 32)
        assert np.array_equal(capture.read_values(record), gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0))


@pytest.mark.parametrize(
    ("entries", "where", "what"),
    [
        ([{"name": "Kcur-0", "file": "k.bin", "dtype": "float32", "shape": [4, 4]}], "entries[0] ('Kcur-0')", "needs 64 bytes, 'k.bin' holds 24"),
        ([{"name": "a", "file": "k.bin", "dtype": "float32", "shape": [6]}, {"name": "b", "file": "k.bin", "shape": [6]}], "entries[1] ('b')", "needs 'dtype' and 'shape'"),
        ([{"name": "a", "file": "k.bin", "dtype": "float33", "shape": [6]}], "entries[0] ('a')", "dtype \"float33\" is not a capture dtype"),
        ([{"name": "a", "file": "missing.bin", "dtype": "float32", "shape": [6]}], "entries[0] ('a')", "'missing.bin' does not exist"),
        ([{"name": "a", "dtype": "float32", "shape": [6]}], "entries[0] ('a')", "has no 'file'"),
        ([{"file": "k.bin"}], "entries[0]", "has no 'name'"),
        ([{"name": "a", "file": "k.bin", "dtype": "float32", "shape": [6], "step": -1}], "entries[0] ('a')", "step must be >= 0"),
        ([{"name": "a", "file": "k.bin", "dtype": "float32", "shape": [6], "colour": 1}], "entries[0] ('a')", "unknown key(s) colour"),
        ([{"name": "a", "file": "../k.bin", "dtype": "float32", "shape": [6]}], "entries[0] ('a')", "must be a path inside"),
        ([{"name": "a", "file": "k.bin", "dtype": "float32", "shape": [6]}, {"name": "b", "file": "k.bin", "dtype": "float32", "shape": [6], "order": 0}],
         "entries[1] ('b')", "step 0 order 0 is also given to entries[0] ('a')"),
        ({"entries": []}, "entries", "the list is empty"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_entry(tmp_path: Path, entries: object, where: str, what: str) -> None:
    np.arange(6, dtype=np.float32).tofile(tmp_path / "k.bin")
    manifest = _manifest(tmp_path, entries)
    out = tmp_path / "x.h5"
    with pytest.raises(CaptureError) as refused:
        _import("dir", tmp_path, out)
    assert refused.value.path == str(manifest)
    assert refused.value.location == where
    assert what in refused.value.problem
    assert not out.exists()


def test_a_manifest_that_is_not_json_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('[\n{"name": "a",,}\n]', encoding="utf-8")
    with pytest.raises(CaptureError, match=r"manifest.json: line 2 column \d+: not valid JSON"):
        _import("dir", tmp_path, tmp_path / "x.h5")


def test_an_npz_entry_naming_a_missing_array_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "dump.npz"
    np.savez(source, a=np.zeros(2, np.float32))
    manifest = _manifest(tmp_path, [{"name": "x", "key": "b"}])
    with pytest.raises(CaptureError, match=r"entries\[0\] \('x'\): dump.npz has no array 'b' \(it has 1: a\)"):
        _import("npz", source, tmp_path / "x.h5", manifest=manifest)


def test_an_existing_output_is_never_overwritten(tmp_path: Path) -> None:
    source = tmp_path / "dump.npz"
    np.savez(source, a=np.zeros(2, np.float32))
    out = tmp_path / "x.h5"
    out.write_bytes(b"user data")
    with pytest.raises(CaptureError, match="already exists"):
        _import("npz", source, out)
    assert out.read_bytes() == b"user data"


def test_an_output_that_is_a_link_to_nothing_is_refused_and_the_link_left_as_it_is(tmp_path: Path) -> None:
    """A dangling link at --out was replaced by the capture without a word, where the user meant its target."""
    source = tmp_path / "dump.npz"
    np.savez(source, a=np.zeros(2, np.float32))
    out = tmp_path / "x.h5"
    out.symlink_to(tmp_path / "runs" / "x.h5")
    with pytest.raises(CaptureError, match=r"x.h5: file: is a symbolic link to .*/runs/x.h5; an output would replace the link, not write where it leads"):
        _import("npz", source, out)
    assert out.is_symlink() and not (tmp_path / "runs").exists()


def test_import_command_reports_a_refusal_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _manifest(tmp_path, [{"name": "a", "file": "nope.bin", "dtype": "float32", "shape": [1]}])
    args = build_parser().parse_args(["import", "dir", str(tmp_path), "--out", str(tmp_path / "x.h5")])
    assert import_command.run(args) == import_command.EXIT_REFUSED
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.startswith("import refused: ") and "entries[0] ('a'): file 'nope.bin' does not exist" in printed.err


def test_layers_are_read_from_conventional_names() -> None:
    assert [infer_layer(n) for n in ("model.layers.12.mlp", "blk.3.attn_q.weight", "Qcur-7", "result_output", "h.0.attn")] == [12, 3, 7, -1, 0]


def test_a_number_in_a_name_past_any_layer_the_index_stores_is_no_layer(tmp_path: Path) -> None:
    """`x-99999999999` ended the import in an OverflowError traceback."""
    source = tmp_path / "dump.npz"
    np.savez(source, **{"x-99999999999": np.ones(3, np.float32), "Qcur-3": np.ones(3, np.float32)})
    with open_capture(_import("npz", source, tmp_path / "x.h5"), check_in_child=False) as capture:
        assert sorted((r.name, r.layer) for r in capture.records) == [("Qcur-3", 3), ("x-99999999999", -1)]


def _refused(kind: str, source: Path, **kwargs: object) -> CaptureError:
    """The refusal of an import, checked to have left no output behind."""
    out = source.parent / "refused.h5"
    with pytest.raises(CaptureError) as refused:
        _import(kind, source, out, **kwargs)
    assert not out.exists()
    return refused.value


X_NPY = {"name": "x-0", "file": "x.npy"}


@pytest.mark.parametrize(
    ("document", "where", "what"),
    [
        ({"meta": {"provenance": 5}, "entries": [X_NPY]}, "meta 'provenance'", "provenance must be a JSON object, not 5"),
        ({"meta": {"provenance": "abc"}, "entries": [X_NPY]}, "meta 'provenance'", 'provenance must be a JSON object, not "abc"'),
        ({"meta": {"role": "evil"}, "entries": [X_NPY]}, "meta 'role'", 'role must be one of native, oracle, rerun, not "evil"'),
        ({"meta": {"seed": "abc"}, "entries": [X_NPY]}, "meta 'seed'", 'seed must be an integer, not "abc"'),
        ({"meta": {"seed": 2**80}, "entries": [X_NPY]}, "meta 'seed'", f"seed must be <= {2**63 - 1} (the capture format's largest), not {2**80}"),
        ({"meta": {"prompt": [1, 2]}, "entries": [X_NPY]}, "meta 'prompt'", "prompt must be a string, not [1, 2]"),
        ({"meta": {"prompt": "p" * 10_000_000}, "entries": [X_NPY]}, "meta 'prompt'", "prompt is longer than the capture format's 60000 bytes"),
        ({"meta": {"engine_name": "a\x1b[2Jb"}, "entries": [X_NPY]}, "meta 'engine_name'", "engine_name holds a control character (\\x1b in 'a\\x1b[2Jb')"),
        ([{**X_NPY, "step": 2**40}], "entries[0] ('x-0')", f"step must be <= {2**31 - 1} (the capture format's largest), not {2**40}"),
        ([{**X_NPY, "layer": 2**31}], "entries[0] ('x-0')", f"layer must be <= {2**31 - 1} (the capture format's largest), not {2**31}"),
        ([{**X_NPY, "order": 2**63}], "entries[0] ('x-0')", f"order must be <= {2**63 - 1} (the capture format's largest), not {2**63}"),
        ([{**X_NPY, "name": "\x1b[2J"}], "entries[0] ('\\x1b[2J')", "'name' holds a control character (\\x1b in '\\x1b[2J')"),
        ([{**X_NPY, "segment": "pre\nfill"}], "entries[0] ('x-0')", "segment holds a control character (\\n in 'pre\\nfill')"),
        ({"tokens": [{"step": 0, "token_id": 2**80}], "entries": [X_NPY]}, "tokens[0]", f"token_id must be <= {2**63 - 1} (the capture format's largest), not {2**80}"),
        ({"tokens": [{"step": "0", "token_id": 1}], "entries": [X_NPY]}, "tokens[0]", 'step must be an integer, not "0"'),
        ([{**X_NPY, "name": "x\ud800-0"}], "entries[0] ('x\\ud800-0')", "'name' is not Unicode text (it holds a lone surrogate: 'x\\ud800-0')"),
        ([{**X_NPY, "shape": [2**62, 0]}], "entries[0] ('x-0')", f"shape [{2**62}, 0]'s non-zero sizes hold more than 2**58 elements, the most a capture holds"),
    ],
)
def test_manifest_values_the_capture_cannot_hold_are_refused_before_writing(tmp_path: Path, document: object, where: str, what: str) -> None:
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    manifest = _manifest(tmp_path, document)
    refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location, refused.problem) == (str(manifest), where, what)


def test_a_declared_shape_whose_size_overflows_is_refused_not_wrapped(tmp_path: Path) -> None:
    np.zeros(4, np.uint8).tofile(tmp_path / "x.bin")
    manifest = _manifest(tmp_path, [{"name": "x", "file": "x.bin", "dtype": "float32", "shape": [2**62, 2**62, 4]}])
    refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location) == (str(manifest), "entries[0] ('x')")
    assert refused.problem == f"shape [{2**62}, {2**62}, 4]'s non-zero sizes hold more than 2**58 elements, the most a capture holds"


def test_an_npy_with_more_dimensions_than_the_format_allows_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1,) * 32, np.float32))
    manifest = _manifest(tmp_path, [X_NPY])
    refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location) == (str(manifest), "entries[0] ('x-0')")
    assert refused.problem == "'x.npy' declares 32 dimensions; the capture format allows at most 8"


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    """The header of a float32 .npy of `shape`, with 100 bytes of data: what a small hostile file declares."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return header.getvalue() + bytes(100)


def test_an_npz_member_declaring_more_than_the_budget_is_refused_before_allocating(tmp_path: Path) -> None:
    source = tmp_path / "dump.npz"
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.npy", _npy_header_only((2**31,)))
    refused = _refused("npz", source)
    assert (refused.path, refused.location) == (str(source), "a")
    assert refused.problem == f"the declared float32 array of shape [{2**31}] is {2**33} bytes, over the {MAX_IMPORT_BYTES}-byte budget"


def test_an_npy_declaring_more_than_the_budget_is_refused_before_allocating(tmp_path: Path) -> None:
    (tmp_path / "x.npy").write_bytes(_npy_header_only((2**45,)))
    _manifest(tmp_path, [X_NPY])
    refused = _refused("dir", tmp_path)
    assert refused.location == "entries[0] ('x-0')"
    assert refused.problem == f"'x.npy' the declared float32 array of shape [{2**45}] is {2**47} bytes, over the {MAX_IMPORT_BYTES}-byte budget"


def test_a_safetensors_dtype_without_a_capture_dtype_is_refused_by_name(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}).encode()
    source = tmp_path / "w.safetensors"
    source.write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    refused = _refused("safetensors", source)
    assert (refused.path, refused.location) == (str(source), "w")
    assert refused.problem.startswith("dtype F8_E4M3 has no capture dtype (importable: BOOL, U8, ")


def test_a_safetensors_key_with_a_control_character_is_refused_not_imported(tmp_path: Path) -> None:
    source = tmp_path / "w.safetensors"
    save_file({"evil\x1b]0;title\x07": np.zeros(2, np.float32)}, str(source))
    refused = _refused("safetensors", source)
    assert (refused.path, refused.location) == (str(source), "entries[0] ('evil\\x1b]0;title\\x07')")
    assert refused.problem == "'name' holds a control character (\\x1b in 'evil\\x1b]0;title\\x07')"


def test_a_symlink_out_of_the_dump_folder_is_refused_and_its_target_never_read(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"SECRET-OUTSIDE!")
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "x.bin").symlink_to(tmp_path / "secret.bin")
    manifest = _manifest(dump, [{"name": "a", "file": "x.bin", "dtype": "uint8", "shape": [15]}])
    refused = _refused("dir", dump)
    assert (refused.path, refused.location) == (str(manifest), "entries[0] ('a')")
    assert refused.problem == f"file 'x.bin' resolves to {tmp_path / 'secret.bin'}, outside {dump}; a symlink may not lead out of the dump folder"


def test_a_symlink_loop_in_the_dump_folder_is_refused_by_name(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "q.npy").symlink_to(dump / "q.npy")
    manifest = _manifest(dump, [{"name": "q", "file": "q.npy"}])
    refused = _refused("dir", dump)
    assert (refused.path, refused.location) == (str(manifest), "entries[0] ('q')")
    assert refused.problem.startswith("file 'q.npy' cannot be followed to a file (Symlink loop from")


def test_an_npz_member_that_cannot_be_inflated_is_refused_by_name(tmp_path: Path) -> None:
    source = tmp_path / "dump.npz"
    np.savez_compressed(source, q=np.arange(4096, dtype=np.float32))
    data = bytearray(source.read_bytes())
    start = data.index(b"q.npy") + len(b"q.npy") + 40  # inside the member's deflated bytes
    data[start : start + 64] = bytes(64)
    source.write_bytes(bytes(data))
    refused = _refused("npz", source)
    assert (refused.path, refused.location) == (str(source), "q")
    assert refused.problem.startswith("is not a readable .npy array (Error -3 while decompressing data")


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (it nests deeper than a reader follows)"),
        ('[{"name": "a", "file": "x.npy", "step": ' + "9" * 5000 + "}]", "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion"),
        ('[{"name": "a", "file": "x.npy", "step": 0, "step": 5}]', "not valid JSON (key 'step' is given twice in one object)"),
    ],
)
def test_a_manifest_beyond_what_the_json_parser_reads_is_refused(tmp_path: Path, text: str, what: str) -> None:
    (tmp_path / "manifest.json").write_text(text, encoding="utf-8")
    refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location) == (str(tmp_path / "manifest.json"), "file")
    assert refused.problem.startswith(what)


def test_a_manifest_that_is_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    with fifo_without_writer(tmp_path, "manifest.json") as path:
        refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location, refused.problem) == (str(path), "file", "cannot read the manifest (not a regular file: a FIFO)")


def test_a_manifest_over_its_size_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    path = sparse_file(tmp_path / "manifest.json", MAX_MANIFEST_BYTES + 1)
    refused = _refused("dir", tmp_path)
    assert (refused.path, refused.location) == (str(path), "file")
    assert refused.problem == f"cannot read the manifest ({MAX_MANIFEST_BYTES + 1} bytes, over the {MAX_MANIFEST_BYTES}-byte limit for this kind of file)"


def _read_back(out: Path) -> list[tuple[str, tuple[int, ...], np.ndarray]]:
    with open_capture(out, check_in_child=False) as capture:
        return [(r.name, r.shape, capture.read_values(r)) for r in capture.records]


def test_a_big_endian_array_keeps_its_values_and_a_0d_array_stays_0d(tmp_path: Path) -> None:
    values = np.array([[0.5, -2.0, 3.25]], np.float32)
    np.save(tmp_path / "big.npy", values.astype(">f4"))
    np.save(tmp_path / "count.npy", np.array([7, -1], ">i4"))
    np.save(tmp_path / "scalar.npy", np.float32(2.5).reshape(()))
    _manifest(tmp_path, [{"name": "big-0", "file": "big.npy"}, {"name": "count-0", "file": "count.npy"}, {"name": "scalar-0", "file": "scalar.npy"}])
    (big, count, scalar) = _read_back(_import("dir", tmp_path, tmp_path / "out.h5"))
    assert big[1] == (1, 3) and big[2].tobytes() == values.tobytes()
    assert count[2].tolist() == [7, -1]
    assert scalar[1] == () and scalar[2].tolist() == 2.5


def test_an_npy_of_ml_dtypes_bfloat16_imports_when_the_manifest_declares_bfloat16(tmp_path: Path) -> None:
    values = np.array([1.5, -0.0, 3.0], ml_dtypes.bfloat16)
    np.save(tmp_path / "x.npy", values)
    _manifest(tmp_path, [{"name": "x-0", "file": "x.npy"}])
    assert _refused("dir", tmp_path).problem == "array dtype |V2 has no capture dtype; declare a same-width 'dtype' in the manifest"
    _manifest(tmp_path, [{"name": "x-0", "file": "x.npy", "dtype": "bfloat16"}])
    ((_, shape, read),) = _read_back(_import("dir", tmp_path, tmp_path / "out.h5"))
    assert shape == (3,) and read.view(np.uint16).tolist() == values.view(np.uint16).tolist()


def test_safetensors_without_a_manifest_go_layer_by_layer_not_in_the_files_name_order(tmp_path: Path) -> None:
    tensors = {f"attn_norm-{layer}": np.full(2, layer, np.float32) for layer in (0, 1, 2, 10, 11)}
    save_file({**tensors, "result_output": np.zeros(3, np.float32)}, str(tmp_path / "x.safetensors"))
    names = [name for name, _, _ in _read_back(_import("safetensors", tmp_path / "x.safetensors", tmp_path / "out.h5"))]
    assert names == ["attn_norm-0", "attn_norm-1", "attn_norm-2", "attn_norm-10", "attn_norm-11", "result_output"]


def test_a_name_longer_than_a_record_holds_is_refused_not_cut(tmp_path: Path) -> None:
    save_file({"a" * 70 + "-0": np.zeros(2, np.float32), "a" * 70 + "-1": np.ones(2, np.float32)}, str(tmp_path / "x.safetensors"))
    refused = _refused("safetensors", tmp_path / "x.safetensors")
    assert refused.location == f"array {'a' * 64!r}..."
    assert refused.problem.startswith("its name is longer than the 64 bytes a record's name holds; give a manifest (--manifest)")


def test_an_npz_holding_two_arrays_of_one_name_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", **{"x-0": np.zeros(2, np.float32)})
    second = io.BytesIO()
    np.save(second, np.ones(2, np.float32))
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(tmp_path / "x.npz", "a") as archive:
        archive.writestr("x-0.npy", second.getvalue())
    refused = _refused("npz", tmp_path / "x.npz")
    assert (refused.location, refused.problem) == ("member 'x-0.npy'", "the archive holds two arrays named 'x-0'")


def test_an_output_in_a_missing_folder_is_refused_by_name(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros(2, np.float32))
    _manifest(tmp_path, [X_NPY])
    out = tmp_path / "absent" / "x.h5"
    with pytest.raises(CaptureError) as refused:
        _import("dir", tmp_path, out)
    assert (refused.value.path, refused.value.problem) == (str(out), f"is in {out.parent}, which does not exist")


def test_a_report_of_two_imports_says_what_they_do_not_record_instead_of_calling_it_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Imports record no seed, engine or device: "same seed; same engine build and device" was said of their defaults."""
    from viewer.cli import main

    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.savez(tmp_path / "n.npz", **{"attn_norm-0": x})
    np.savez(tmp_path / "o.npz", **{"attn_norm-0": x})
    native, oracle = _import("npz", tmp_path / "n.npz", tmp_path / "n.h5"), _import("npz", tmp_path / "o.npz", tmp_path / "o.h5", meta={"role": "oracle"})
    main(["report", str(native), str(oracle)])
    assert "provenance weights unconfirmed; prompt not recorded; engine build and device not recorded" in capsys.readouterr().out.splitlines()


def test_an_archive_of_no_arrays_says_so_not_that_a_manifest_never_given_is_empty(tmp_path: Path) -> None:
    np.savez(tmp_path / "none.npz")
    with pytest.raises(CaptureError) as refused:
        _import("npz", tmp_path / "none.npz", tmp_path / "x.h5")
    assert (refused.value.location, refused.value.problem) == ("file", "holds no arrays, so there is nothing to import")
    assert not (tmp_path / "x.h5").exists()
