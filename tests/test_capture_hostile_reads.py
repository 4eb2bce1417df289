"""Reads that a hostile capture must not turn into memory, a wrong "absent", or an exception's own words.

Every file here is a real HDF5 file: chunks are written raw with `write_direct_chunk` (a real
zlib bomb, a stream that stops short, an LZF stream that runs past its chunk), attributes are
made larger than a lowered budget, and an attribute's dataspace is corrupted byte for byte.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quantize
from hand_captures import T, write_capture

from sessions.capture import chunk_read
from sessions.capture import format as cf
from sessions.capture import writer as writer_module
from sessions.capture.chunk_read import BadChunk, ChunkedReader, liblzf, unlzf_python
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.capture.writer import CaptureWriter
from sessions.child_env import PROJECT_ROOT, child_env

ELEMENTS = 960
"""float32 elements of the bombed tensor: one chunk of 3,840 bytes, as in the report that found the bomb."""
CHUNK_BYTES = ELEMENTS * 4


def zlib_bomb(inflated_mib: int) -> bytes:
    """A valid zlib stream of `inflated_mib` MiB of zeros, about 1,000 times smaller, built in milliseconds.

    After a full flush deflate restarts from an empty window, so compressing the same MiB again
    gives the same bytes: the stream is the header, that block repeated, an empty final block
    and the Adler-32 of everything.
    """
    zero = bytes(1 << 20)
    compressor = zlib.compressobj(9)
    first = compressor.compress(zero) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(zero) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert first[2:] == block
    adler = 1
    for _ in range(inflated_mib):
        adler = zlib.adler32(zero, adler)
    return first[:2] + block * inflated_mib + b"\x03\x00" + adler.to_bytes(4, "big")


LZF_CASES = [
    (b"\x00A" + b"\xe0\xff\x00" * 20, f"its LZF stream decodes past the chunk's declared {CHUNK_BYTES} bytes"),
    (b"\x00A\xe0\xff\x05" + bytes(44), "its LZF stream is corrupt (a reference before the chunk's start, or a run past the stream's end)"),
    ((b"\x1f" + bytes(32)) * 2 + b"\x05AB", "its LZF stream is corrupt (a reference before the chunk's start, or a run past the stream's end)"),
    (b"\x00A\xe0\xff\x00" + (b"\x1f" + bytes(32)) * 2, f"its LZF stream ends after 329 of the chunk's {CHUNK_BYTES} bytes"),
]
"""Hostile LZF streams for a chunk of CHUNK_BYTES: one a bomb, two corrupt, one short; each long
enough that it could decode to CHUNK_BYTES, so the decoder itself finds what is wrong."""


def pair_with_raw_chunk(tmp_path: Path, stored: bytes, compression: str = "gzip", elements: int = ELEMENTS) -> tuple[Path, Path]:
    """(hostile, twin): the same one-tensor capture, the hostile one's tensor a chunked dataset
    whose single chunk holds `stored` as written, whatever it decodes to. Other than ELEMENTS,
    `elements` is declared by the hostile file's dataset and index row alone (the twin keeps ELEMENTS)."""
    tensors = [T("l_out-0", np.zeros(ELEMENTS, np.float32), layer=0)]
    hostile = write_capture(tmp_path / "hostile.h5", "native", tensors, [(0, 1, False)], layout="datasets")
    twin = write_capture(tmp_path / "twin.h5", "oracle", tensors, [(0, 1, False)])
    with h5py.File(hostile, "r+") as f:
        row = f[cf.INDEX_PATH][0]
        path = cf.decode_field(row["path"])
        row["shape"][0] = elements
        f[cf.INDEX_PATH][0] = row
        del f[path]
        ds = f.create_dataset(path, shape=(elements,), dtype=np.float32, chunks=(elements,), compression=compression)
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))
        ds.id.write_direct_chunk((0,), stored)
    return hostile, twin


PEAK_REPORTING_CLI = """
import atexit, os, sys
def peak():
    with open("/proc/self/status") as status, open(os.environ["PARITY_XRAY_TEST_PEAK"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
atexit.register(peak)
from viewer.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""`parity-xray` that writes its own peak RSS (kB) on exit. The rusage of a child counts the memory of the
process it was forked from (the test run, hundreds of MB late in the suite); VmHWM starts at exec."""


def cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str, int]:
    """Run `parity-xray ARGV` as its own process: (exit status, stdout, stderr, its peak RSS in MiB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile() as peak:
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_REPORTING_CLI, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={**(env or child_env()), "PARITY_XRAY_TEST_PEAK": peak.name},
            cwd=PROJECT_ROOT,
        )
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), int(Path(peak.name).read_text()) // 1024


def test_a_zlib_bomb_is_refused_at_its_chunk_and_never_inflated(tmp_path: Path) -> None:
    """A 3,840-byte chunk whose 1 MB stream inflates to 1 GiB: structurally valid, refused on reading."""
    hostile, twin = pair_with_raw_chunk(tmp_path, zlib_bomb(1024))
    assert hostile.stat().st_size < 2 * 1024**2
    status, out, _, _ = cli("validate", str(hostile))
    assert status == 0 and "valid (1 records" in out, "its metadata declares nothing wrong"
    tensor = cf.tensor_path(0)
    located = f"{tensor} chunk at (0,): its deflate stream inflates past the chunk's declared {CHUNK_BYTES} bytes (a decompression bomb)"
    status, out, _, _ = cli("validate", "--deep", str(hostile))
    assert (status, out.splitlines()) == (2, [f"{hostile}: invalid (1 problem)", f"  {located}"])
    status, out, err, peak_mib = cli("report", "--no-cache", str(hostile), str(twin))
    assert (status, out) == (2, "")
    assert err == f"parity-xray report: unusable input: {hostile}: {located}\n"
    assert peak_mib < 400, f"reading the bomb took {peak_mib} MiB"


def test_an_lzf_chunk_declared_far_larger_than_its_stream_is_refused_before_its_size_is_taken(tmp_path: Path) -> None:
    """A flipped byte in a chunk's declared size (the mutation corpus found one): 512 MiB declared,
    a 2-byte stream. Decoding into a buffer of the declared size would take the 512 MiB first."""
    elements = 2**27
    hostile, _ = pair_with_raw_chunk(tmp_path, b"\x00A", "lzf", elements)
    status, out, _, peak_mib = cli("validate", "--deep", str(hostile))
    problem = f"its LZF stream of 2 bytes cannot decode to the chunk's declared {elements * 4} bytes (at most 88 per stored byte)"
    assert (status, out.splitlines()) == (2, [f"{hostile}: invalid (1 problem)", f"  {cf.tensor_path(0)} chunk at (0,): {problem}"])
    assert peak_mib < 300, f"refusing the chunk took {peak_mib} MiB"


@pytest.mark.parametrize(
    ("compression", "stored", "problem"),
    [
        ("gzip", zlib.compress(bytes(100)), f"its deflate stream ends after 100 of the chunk's {CHUNK_BYTES} bytes"),
        ("gzip", zlib.compress(bytes(CHUNK_BYTES))[:-4], "its deflate stream is cut off before its end"),
        ("gzip", b"\x78\x9c" + bytes(40), "its deflate stream is corrupt (invalid stored block lengths)"),
        *(("lzf", stream, problem) for stream, problem in LZF_CASES),
        ("lzf", b"\x00A\xe0\xff\x00", f"its LZF stream of 5 bytes cannot decode to the chunk's declared {CHUNK_BYTES} bytes (at most 88 per stored byte)"),
    ],
)
def test_a_chunk_that_does_not_decode_to_its_declared_size_is_located(tmp_path: Path, compression: str, stored: bytes, problem: str) -> None:
    hostile, _ = pair_with_raw_chunk(tmp_path, stored, compression)
    with open_capture(hostile) as capture, pytest.raises(CaptureError) as refused:
        capture.read_bits(capture.records[0])
    assert (refused.value.path, refused.value.location, refused.value.problem) == (str(hostile), f"{cf.tensor_path(0)} chunk at (0,)", problem)


@pytest.mark.parametrize(("stream", "problem"), LZF_CASES)
def test_the_python_lzf_decoder_refuses_asliblzf_does(stream: bytes, problem: str) -> None:
    """The fallback where h5py does not export liblzf (Windows) words every refusal the same way."""
    with pytest.raises(BadChunk, match=re.escape(problem)):
        unlzf_python(stream, CHUNK_BYTES)
    assert liblzf() is not None, "this h5py exports liblzf, so the reads above went through it"


def test_the_python_lzf_decoder_decodes_what_h5py_wrote(tmp_path: Path) -> None:
    values = np.repeat(np.arange(64, dtype=np.float32), 64).reshape(64, 64)
    with h5py.File(tmp_path / "lzf.h5", "w") as f:
        ds = f.create_dataset("x", data=values, chunks=(16, 64), compression="lzf")
        for index in range(ds.id.get_num_chunks()):
            offset = ds.id.get_chunk_info(index).chunk_offset
            mask, stored = ds.id.read_direct_chunk(offset)
            assert mask == 0 and len(stored) < 16 * 64 * 4
            decoded = np.frombuffer(unlzf_python(stored, 16 * 64 * 4), np.float32).reshape(16, 64)
            assert np.array_equal(decoded, values[offset[0] : offset[0] + 16])


@pytest.mark.parametrize("filters", [{"compression": "gzip", "shuffle": True}, {"compression": "lzf"}, {"compression": "gzip", "compression_opts": 9}])
def test_bounded_chunk_reads_equal_what_libhdf5_reads(tmp_path: Path, filters: dict[str, object]) -> None:
    """Edge chunks, a chunk never written (fill value), ints and strided slices, decoded here as libhdf5 decodes them."""
    values = np.arange(35 * 6, dtype=np.float32).reshape(35, 6) * 1.5
    path = tmp_path / "chunked.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(35, 6), dtype=np.float32, chunks=(4, 4), fillvalue=-7.0, **filters)[:28] = values[:28]
    with h5py.File(path, "r") as f:
        ds = f["x"]
        reader = ChunkedReader(ds, "/x", budget=2**20, file_size=path.stat().st_size)
        for selection in [None, (slice(3, 30),), (29,), (slice(0, 35, 3), slice(1, 6)), (slice(30, 35), 5), (slice(10, 10),)]:
            expected = ds[()] if selection is None else ds[selection]
            assert np.array_equal(reader.read(selection), expected), selection
        assert (reader.read((34,)) == -7.0).all()


def test_an_attribute_over_the_budget_is_refused_before_its_value_is_read(tmp_path: Path) -> None:
    """A 200 kB provenance_json (dense attribute storage, libver latest) against a 64 KiB budget."""
    source = write_capture(tmp_path / "small.h5", "native", [T("l_out-0", np.zeros(4, np.float32), layer=0)])
    large = tmp_path / "large.h5"
    with h5py.File(source, "r") as src, h5py.File(large, "w", libver="latest") as dst:
        for name in src.attrs:
            dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)
        for name in src:
            src.copy(src[name], dst, name)
        del dst.attrs[cf.ATTR_PROVENANCE]
        dst.attrs.create(cf.ATTR_PROVENANCE, np.frombuffer(json.dumps({"env": "x" * 200_000}).encode(), np.uint8))
    assert len(open_capture(large).meta.provenance["env"]) == 200_000, "the budget is what refuses it, nothing else"
    with pytest.raises(CaptureError) as refused:
        open_capture(large, memory_budget=65536)
    assert refused.value.location == "/ attribute 'provenance_json'"
    assert refused.value.problem == "declares 200011 bytes, over the attribute budget of 65536 bytes"
    status, out, _, _ = cli("validate", "--memory-budget", "65536", str(large))
    assert status == 2 and "  / attribute 'provenance_json': declares 200011 bytes, over the attribute budget of 65536 bytes" in out


@pytest.mark.parametrize("dims", [2**31, 2**40])
def test_an_attribute_that_cannot_be_read_is_refused_never_taken_as_absent(tmp_path: Path, dims: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """provenance_json's dataspace rewritten in the file to `dims` elements: libhdf5 runs off its buffer.

    Taken as "absent", the file compared as PARITY (and its `complete` marker read as unset). The
    file is in libhdf5's earliest format, as another engine's writer may leave it, whose object
    headers carry no checksum that would catch the rewrite."""
    monkeypatch.setattr(writer_module, "FILE_FORMAT", ("earliest", "v108"))
    tensors = [T("l_out-0", np.zeros(4, np.float32), layer=0)]
    twin = write_capture(tmp_path / "twin.h5", "oracle", tensors, [(0, 1, False)])
    path = write_capture(tmp_path / "corrupt.h5", "native", tensors, [(0, 1, False)])
    data = bytearray(path.read_bytes())
    length = len(json.dumps({}).encode())
    name = data.find(b"provenance_json\0")
    space = data.find(b"\x01\x01\x01\x00\x00\x00\x00\x00" + length.to_bytes(8, "little") * 2, name)  # dataspace v1, rank 1
    assert 0 < name < space < name + 64
    data[space + 8 : space + 24] = dims.to_bytes(8, "little") * 2  # size and maximum size
    path.write_bytes(bytes(data))
    located = "/ attribute 'provenance_json': cannot be read (Can't synchronously determine if attribute exists by name (ran off end of input buffer while decoding))"
    status, out, _, _ = cli("validate", str(path))
    assert (status, out.splitlines()) == (2, [f"{path}: invalid (1 problem)", f"  {located}"])
    status, _, err, _ = cli("report", "--no-cache", str(path), str(twin))
    assert (status, err) == (2, f"parity-xray report: unusable input: {path}: {located}\n")


def test_a_flipped_bit_in_the_root_header_of_the_writers_format_is_a_located_refusal(tmp_path: Path) -> None:
    """The writer's 1.8 format checksums its object headers: a bit flipped in the prompt is caught
    where the root's attributes are read, never read as another prompt."""
    path = write_capture(tmp_path / "flipped.h5", "native", [T("l_out-0", np.zeros(4, np.float32), layer=0)], [(0, 1, False)], prompt="a prompt to flip")
    data = bytearray(path.read_bytes())
    data[data.find(b"a prompt to flip")] ^= 1
    path.write_bytes(bytes(data))
    status, out, _, _ = cli("validate", str(path))
    assert status == 2
    assert out.splitlines()[1].startswith("  / attribute 'format': cannot be read (") and "checksum" in out


def test_deeply_nested_provenance_is_a_located_refusal_not_a_recursion_error(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "nested.h5", "native", [T("l_out-0", np.zeros(4, np.float32), layer=0)])
    with h5py.File(path, "r+") as f:
        del f.attrs[cf.ATTR_PROVENANCE]
        f.attrs.create(cf.ATTR_PROVENANCE, np.frombuffer(b"[" * 30_000 + b"]" * 30_000, np.uint8))
    with pytest.raises(CaptureError) as refused:
        open_capture(path)
    assert (refused.value.location, refused.value.problem) == ("/ attribute 'provenance_json'", "is not JSON (it nests deeper than a reader follows)")


def test_provenance_nested_past_what_a_reader_follows_is_refused_by_validate_and_report_alike(tmp_path: Path) -> None:
    """900 levels parse, and `validate` said valid; `report` then broke with a RecursionError
    copying the capture's metadata (from 500 levels on)."""
    paths = []
    for role in ("native", "oracle"):
        path = write_capture(tmp_path / f"deep.{role}.h5", role, [T("l_out-0", np.zeros(4, np.float32), layer=0)])
        with h5py.File(path, "r+") as f:
            del f.attrs[cf.ATTR_PROVENANCE]
            f.attrs.create(cf.ATTR_PROVENANCE, np.frombuffer(b'{"deep": ' + b'{"a": ' * 900 + b"1" + b"}" * 901, np.uint8))
        paths.append(path)
    located = "/ attribute 'provenance_json': its values nest 901 levels deep, past the 64 a reader follows"
    status, out, _, _ = cli("validate", str(paths[0]))
    assert (status, out.splitlines()) == (2, [f"{paths[0]}: invalid (1 problem)", f"  {located}"])
    status, _, err, _ = cli("report", "--no-cache", *map(str, paths))
    assert (status, err) == (2, f"parity-xray report: unusable input: {paths[0]}: {located}\n")


@pytest.mark.parametrize("layout", ["packed", "datasets"])
def test_a_bool_stored_as_a_byte_other_than_0_or_1_is_a_located_refusal(tmp_path: Path, layout: str) -> None:
    """Byte 2 against byte 1 reads True against True: the bits differed, no element did, and
    `report` failed with an IndexError; `validate --deep` called the file valid."""
    mask = np.array([[True, False, True, True]] * 2)
    paths = [write_capture(tmp_path / f"mask.{role}.h5", role, [T("l_out-0", mask, layer=0, dtype="bool")], layout=layout) for role in ("native", "oracle")]
    with h5py.File(paths[0], "r+") as f:
        row = f[cf.INDEX_PATH][0]
        stored = f[cf.decode_field(row["path"])]
        if layout == "packed":
            stored[int(row["offset"])] = 2
        else:
            stored.id.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array([[2, 0, 1, 1]] * 2, np.uint8), mtype=h5py.h5t.STD_U8LE)
    wrong = 1 if layout == "packed" else 2
    located = f"/index row 0 (l_out-0): holds byte 0x02 for a bool ({wrong} of the 8 bytes read are neither 0 nor 1); a bool is stored as one byte, 0 or 1"
    status, out, _, _ = cli("validate", "--deep", str(paths[0]))
    assert (status, out.splitlines()[1:]) == (2, [f"  {located}"])
    status, _, err, _ = cli("report", "--no-cache", *map(str, paths))
    assert (status, err) == (2, f"parity-xray report: unusable input: {paths[0]}: {located}\n")


def test_a_table_field_name_that_is_not_utf8_is_a_located_refusal(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "names.h5", "native", [T("l_out-0", np.zeros(4, np.float32), layer=0)])
    with h5py.File(path, "r+") as f:
        del f[cf.TOKENS_PATH]
        tid = h5py.h5t.create(h5py.h5t.COMPOUND, 8)
        tid.insert(b"step\xff", 0, h5py.h5t.STD_I64LE)
        h5py.h5d.create(f.id, cf.TOKENS_PATH[1:].encode(), tid, h5py.h5s.create_simple((0,), (h5py.h5s.UNLIMITED,)), dcpl=chunked_dcpl())
    with pytest.raises(CaptureError) as refused:
        open_capture(path)
    assert (refused.value.location, refused.value.problem) == (cf.TOKENS_PATH, "cannot be read (a name or text in it is not UTF-8)")


def test_a_logical_shape_that_is_text_is_a_located_refusal(tmp_path: Path) -> None:
    blocks = quantize(np.ones((2, 64), np.float32), GGMLQuantizationType.Q8_0)
    path = tmp_path / "quantized.h5"
    with CaptureWriter(path, CaptureMeta(role="native"), layout="datasets") as writer:
        writer.add_tensor("ffn_gate-0", blocks, step=0, segment="prefill", layer=0, dtype="q8_0", logical_shape=(2, 64))
        writer.end_step()
    with h5py.File(path, "r+") as f:
        f[cf.tensor_path(0)].attrs.create(cf.ATTR_LOGICAL_SHAPE, np.bytes_(b"2x64"))
    status, out, _, _ = cli("validate", str(path))
    assert status == 2
    assert f"  {cf.tensor_path(0)} attribute 'logical_shape': is of type |S4; the format stores 64-bit integers" in out.splitlines()


def test_an_empty_file_is_named_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.h5"
    path.touch()
    with pytest.raises(CaptureError) as refused:
        open_capture(path)
    assert str(refused.value) == f"{path}: file: is empty (0 bytes); a capture is an HDF5 file"


def test_the_check_time_limit_can_be_raised_from_the_environment(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "slow.h5", "native", [T("l_out-0", np.zeros(4, np.float32), layer=0)])
    status, out, _, _ = cli("validate", str(path), env={**child_env(), "PARITY_XRAY_CHECK_TIMEOUT_S": "0.001"})
    assert status == 2
    assert out.splitlines()[1].startswith("  structure check: did not finish within the 0.001 s allowed (")


def chunked_dcpl() -> h5py.h5p.PropDCID:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((16,))
    return dcpl


def test_source_names_are_read_from_the_checked_file_not_from_what_its_path_names_now(tmp_path: Path) -> None:
    """Sources were read by reopening the capture by name: a file put in its place after the
    check was read unchecked."""
    from sessions.compare.record_sources import record_sources

    path = write_capture(tmp_path / "native.h5", "native", [T("node_5", np.ones(8, np.float32), layer=0, attrs={"ggml_src": json.dumps(["blk.0.ffn_up.weight"])})])
    swapped = write_capture(tmp_path / "other.h5", "native", [T("node_5", np.ones(8, np.float32), layer=0, attrs={"ggml_src": json.dumps(["placed"])})])
    with open_capture(path) as capture:
        swapped.replace(path)
        assert record_sources(capture) == {0: ("blk.0.ffn_up.weight",)}
    with pytest.raises(CaptureError) as closed:
        record_sources(capture)
    assert closed.value.problem == "is closed: reading it again needs it opened again", "not quietly no sources"


def test_deeply_nested_source_names_are_no_sources_not_a_crash(tmp_path: Path) -> None:
    """`ggml_src` is what anchors an unnamed llama.cpp node; a JSON list nested 25,000 deep anchors nothing."""
    tensors = [T("node_5", np.ones(8, np.float32), layer=0, kernel_id="MUL_MAT")]
    native = write_capture(tmp_path / "native.h5", "native", tensors)
    oracle = write_capture(tmp_path / "oracle.h5", "oracle", tensors)
    with h5py.File(native, "r+") as f:
        nested = b"[" * 25_000 + b"]" * 25_000
        f[cf.pack_path(0)].attrs.create(cf.packed_attribute("ggml_src", 0), np.bytes_(nested), dtype=cf.utf8(len(nested)))
    status, out, err, _ = cli("report", "--native-profile", "llama.cpp", "--oracle-profile", "llama.cpp", str(native), str(oracle))
    assert (status, err) == (0, ""), "placed as a node without sources on both sides: the same bits"
    assert out.startswith("PARITY: ")


@pytest.mark.parametrize("compressible", [True, False])
def test_a_deflated_chunk_is_inflated_into_one_buffer_of_its_size_not_twice_its_size(compressible: bool) -> None:
    # zlib grows its output in blocks and joins them: a chunk of almost 2 GiB took 4.3 GB. Fed
    # whole, a stream that compresses poorly came back as a copy at every piece (256 MiB: 764 MiB more).
    size = 64 * 1024**2
    data = bytes(size) if compressible else np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes()
    stream = zlib_bomb(64) if compressible else zlib.compress(data, 1)
    tracemalloc.start()
    try:
        out = chunk_read._inflate(stream, size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out == data
    assert peak < size + 3 * chunk_read.INFLATE_PIECE_BYTES, f"inflating {size >> 20} MiB held {peak >> 20} MiB"


def test_a_stream_inflated_piece_by_piece_is_exact_and_a_bomb_is_still_caught_past_its_last_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_read, "INFLATE_PIECE_BYTES", 1000)
    data = np.random.default_rng(0).integers(0, 255, 10_000, dtype=np.uint8).tobytes()
    assert chunk_read._inflate(zlib.compress(data), len(data)) == data
    with pytest.raises(BadChunk, match="inflates past the chunk's declared 9999 bytes"):
        chunk_read._inflate(zlib.compress(data), len(data) - 1)
    with pytest.raises(BadChunk, match="ends after 10000 of the chunk's 10001 bytes"):
        chunk_read._inflate(zlib.compress(data), len(data) + 1)
