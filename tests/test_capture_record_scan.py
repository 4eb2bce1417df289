"""The fast scan of index rows' datasets reports exactly what the thorough per-record check reports.

The scan proves the common clean case with a few low-level calls and sends every other row to
`Capture.record_problems`; each case below changes one dataset (or its index row) the way a
foreign writer or a hostile file would, and the two checks must agree word for word.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quantize

from sessions.capture import format as cf
from sessions.capture.hdf5_safety import Problem
from sessions.capture.meta import CaptureMeta
from sessions.capture.reader import load_capture
from sessions.capture.record_scan import RecordScan
from sessions.capture.writer import CaptureWriter

VICTIM = cf.tensor_path(1)
"""The float32 tensor [3, 4] below."""


def write_every_kind(path: Path) -> None:
    """One tensor of each kind a capture holds: every plain dtype, a scalar, an empty one, quantized blocks."""
    rng = np.random.default_rng(3)
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="scan"), layout="datasets") as writer:
        writer.add_tensor("bf16", rng.standard_normal((2, 8)).astype(ml_dtypes.bfloat16), step=0, segment="prefill")
        writer.add_tensor("f32", rng.standard_normal((3, 4)).astype(np.float32), step=0, segment="prefill")
        for dtype in ("float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
            writer.add_tensor(dtype, np.arange(6, dtype=dtype).reshape(2, 3), step=0, segment="prefill")
        writer.add_tensor("mask", np.array([True, False, True]), step=0, segment="prefill")
        writer.add_tensor("scalar", np.float32(2.5), step=0, segment="prefill")
        writer.add_tensor("empty", np.zeros((0, 4), np.float32), step=0, segment="prefill")
        blocks = quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
        writer.add_tensor("q", blocks, step=0, segment="prefill", dtype="q8_0", logical_shape=(2, 64))
        writer.end_step()


def thorough_problems(path: Path) -> list[Problem]:
    with load_capture(path) as capture:
        bad = capture.bad_rows.tolist()
        return [p for record in capture.records if not bad[record.seq] for p in capture.record_problems(record)]


def scanned(path: Path) -> tuple[list[Problem], int]:
    with load_capture(path) as capture:
        scan = RecordScan(capture)
        return scan.problems(0, len(capture.index)), scan.thorough_rows


def replace_victim(make: Callable[[h5py.File], h5py.Dataset | None]) -> Callable[[h5py.File], None]:
    def mutate(f: h5py.File) -> None:
        del f[VICTIM]
        ds = make(f)
        if ds is not None:
            ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    return mutate


def set_victim_path(text: str | bytes) -> Callable[[h5py.File], None]:
    def mutate(f: h5py.File) -> None:
        row = f[cf.INDEX_PATH][1]
        row["path"] = text.encode() if isinstance(text, str) else text
        f[cf.INDEX_PATH][1] = row

    return mutate


def invalid_utf8_name(f: h5py.File) -> None:
    """The dataset renamed to bytes that are not UTF-8, and the index row pointing at those bytes."""
    odd = b"/tensors/t\xff"
    f[odd] = f[VICTIM]
    del f[VICTIM]
    set_victim_path(odd)(f)


def victim_attr(value: object, dtype: object | None = None) -> Callable[[h5py.File], None]:
    def mutate(f: h5py.File) -> None:
        del f[VICTIM].attrs[cf.ATTR_LOGICAL_DTYPE]
        if value is not None:
            f[VICTIM].attrs.create(cf.ATTR_LOGICAL_DTYPE, value, dtype=dtype)

    return mutate


def ascii_attr(f: h5py.File) -> None:
    """The attribute as a C writer using H5T_C_S1 (ASCII, NUL-terminated) would store it."""
    del f[VICTIM].attrs[cf.ATTR_LOGICAL_DTYPE]
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(8)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    attr = h5py.h5a.create(f[VICTIM].id, cf.ATTR_LOGICAL_DTYPE.encode(), tid, space)
    attr.write(np.array(b"float32", dtype="S8"), mtype=tid)


def data() -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(3, 4)


def compact(f: h5py.File) -> h5py.Dataset:
    space = h5py.h5s.create_simple((3, 4))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    dsid = h5py.h5d.create(f.id, VICTIM.encode(), h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, data())
    return h5py.Dataset(dsid)


def group(f: h5py.File) -> None:
    f.create_group(VICTIM)


def soft_link_to_tensor_0(f: h5py.File) -> None:
    f[VICTIM] = h5py.SoftLink(cf.tensor_path(0))


def soft_link_to_twin(f: h5py.File) -> h5py.Dataset:
    f[VICTIM] = h5py.SoftLink("/tensors/twin")
    return f.create_dataset("/tensors/twin", data=data())


CASES: dict[str, Callable[[h5py.File], None]] = {
    "stored big-endian": replace_victim(lambda f: f.create_dataset(VICTIM, data=data().astype(">f4"))),
    "chunked and compressed": replace_victim(lambda f: f.create_dataset(VICTIM, data=data(), chunks=(1, 4), compression="gzip")),
    "compact layout": replace_victim(compact),
    "fletcher32 filter": replace_victim(lambda f: f.create_dataset(VICTIM, data=data(), chunks=(3, 4), fletcher32=True)),
    "other shape": replace_victim(lambda f: f.create_dataset(VICTIM, data=data().reshape(4, 3))),
    "other element type": replace_victim(lambda f: f.create_dataset(VICTIM, data=data().astype(np.float64))),
    "a group, not a dataset": replace_victim(group),
    "missing dataset": replace_victim(lambda f: None),
    "soft link to another tensor": replace_victim(soft_link_to_tensor_0),
    "soft link to a float32 twin": replace_victim(soft_link_to_twin),
    "attribute missing": victim_attr(None),
    "attribute says another dtype": victim_attr(np.bytes_(b"float16"), cf.utf8(7)),
    "attribute variable-length": victim_attr("float32", h5py.string_dtype()),
    "attribute one-element array": victim_attr(np.array([b"float32"]), cf.utf8(7)),
    "attribute an integer": victim_attr(np.int64(32)),
    "attribute ascii, as a C writer stores it": ascii_attr,
    "path through ..": set_victim_path(VICTIM.replace("/tensors/", "/tensors/../tensors/", 1)),
    "path with a doubled slash": set_victim_path(VICTIM.replace("/tensors/", "/tensors//", 1)),
    "path without a leading slash": set_victim_path(VICTIM[1:]),
    "path ending in a slash": set_victim_path("/tensors/"),
    "path to the root": set_victim_path("/"),
    "path not UTF-8": invalid_utf8_name,
}


def test_a_clean_capture_of_every_kind_passes_on_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "clean.h5"
    write_every_kind(path)
    problems, thorough = scanned(path)
    assert problems == [] == thorough_problems(path)
    assert thorough == 2, "only the empty (unallocated) tensor and the quantized one need the thorough check"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_scan_reports_what_the_thorough_check_reports(tmp_path: Path, case: str) -> None:
    path = tmp_path / "changed.h5"
    write_every_kind(path)
    with h5py.File(path, "r+") as f:
        CASES[case](f)
    problems, thorough = scanned(path)
    assert problems == thorough_problems(path)
    assert thorough >= 2


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("stored big-endian", "stored as >f4; logical float32 is stored as float32"),
        ("fletcher32 filter", "uses filter id 3 (fletcher32)"),
        ("attribute says another dtype", "is 'float16'; the index row says 'float32'"),
        ("attribute variable-length", "is a variable-length string"),
        ("path to the root", "is the root group, not a dataset"),
    ],
)
def test_what_the_thorough_check_finds_reaches_the_scan(tmp_path: Path, case: str, expected: str) -> None:
    path = tmp_path / "changed.h5"
    write_every_kind(path)
    with h5py.File(path, "r+") as f:
        CASES[case](f)
    problems, _ = scanned(path)
    assert any(expected in p.problem for p in problems), problems


def test_clean_cases_off_the_fast_path_stay_clean(tmp_path: Path) -> None:
    for case in ("chunked and compressed", "compact layout", "soft link to a float32 twin", "attribute ascii, as a C writer stores it", "path through .."):
        path = tmp_path / f"{case}.h5"
        write_every_kind(path)
        with h5py.File(path, "r+") as f:
            CASES[case](f)
        assert scanned(path)[0] == [], case
