"""Hostile and broken files are refused by name, place and reason, before any tensor data is read."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from sessions.capture import format as cf
from sessions.capture.hdf5_safety import (
    FILTERED_CHUNK_FLOOR_BYTES,
    MAX_ATTRIBUTES,
    MAX_CHUNKS,
    MIN_FILTERED_CHUNK_BYTES,
    SMALL_FILTERED_CHUNKS,
)
from sessions.capture.meta import CaptureMeta
from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.capture.structure_check import (
    already_checked,
    check_in_child,
    ensure_checked,
    iter_ensure_checked,
)
from sessions.capture.writer import CaptureWriter
from tests.child_processes import child_reading

VICTIM = cf.tensor_path(0)


def base_capture(path: Path, records: int = 2) -> None:
    """Tensors in datasets of their own: the cases below replace one (tests/test_capture_packs.py has the packs' cases)."""
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="hostile-base"), layout="datasets") as writer:
        for i in range(records):
            writer.add_tensor(f"t{i}", np.arange(16, dtype=np.float32), step=0, segment="prefill")
        writer.end_step()


def other_file(tmp_path: Path) -> Path:
    """A second HDF5 file a hostile capture reaches for; it holds a group and a dataset like a capture's."""
    path = tmp_path / "elsewhere.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.full(16, 7, np.float32))
        f.create_dataset(VICTIM, data=np.full(16, 7, np.float32))
    return path


def mutated(tmp_path: Path, mutate: Callable[[h5py.File, Path], None]) -> Path:
    path = tmp_path / "hostile.h5"
    base_capture(path)
    with h5py.File(path, "r+") as f:
        mutate(f, tmp_path)
    return path


def refusal(path: Path) -> CaptureError:
    with pytest.raises(CaptureError) as info:
        open_capture(path).close()
    assert info.value.path == str(path)
    return info.value


def replace_victim(f: h5py.File, make: Callable[[h5py.File], None]) -> None:
    del f[VICTIM]
    make(f)


def test_external_link_to_a_tensor_is_refused(tmp_path: Path) -> None:
    other = other_file(tmp_path)
    path = mutated(tmp_path, lambda f, _: replace_victim(f, lambda g: g.__setitem__(VICTIM, h5py.ExternalLink(str(other), "/data"))))
    error = refusal(path)
    assert error.location.endswith(VICTIM)
    assert "external link" in error.problem and "elsewhere.h5" in error.problem


def test_external_link_as_an_intermediate_group_is_refused(tmp_path: Path) -> None:
    other = other_file(tmp_path)

    def swap_group(f: h5py.File, _: Path) -> None:
        del f[cf.TENSORS_GROUP]
        f[cf.TENSORS_GROUP] = h5py.ExternalLink(str(other), cf.TENSORS_GROUP)

    error = refusal(mutated(tmp_path, swap_group))
    assert error.location.endswith(cf.TENSORS_GROUP)
    assert "external link" in error.problem


def test_virtual_dataset_is_refused(tmp_path: Path) -> None:
    other = other_file(tmp_path)

    def make_vds(f: h5py.File) -> None:
        layout = h5py.VirtualLayout(shape=(16,), dtype=np.float32)
        layout[:] = h5py.VirtualSource(str(other), "data", shape=(16,))
        ds = f.create_virtual_dataset(VICTIM, layout)
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, make_vds)))
    assert error.location == VICTIM and "virtual dataset" in error.problem


def test_external_raw_storage_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "secret.bin"
    raw.write_bytes(bytes(range(64)))

    def make_external(f: h5py.File) -> None:
        ds = f.create_dataset(VICTIM, shape=(16,), dtype=np.float32, external=[(str(raw), 0, h5py.h5f.UNLIMITED)])
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, make_external)))
    assert error.location == VICTIM and "external file" in error.problem


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"compression": 32001, "allow_unknown_filter": True}, "filter id 32001 (unknown)"),
        ({"fletcher32": True}, "filter id 3 (fletcher32)"),
    ],
)
def test_filters_outside_the_allow_list_are_refused(tmp_path: Path, options: dict, expected: str) -> None:
    def make_filtered(f: h5py.File) -> None:
        ds = f.create_dataset(VICTIM, data=np.arange(16, dtype=np.float32), chunks=(8,), **options)
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, make_filtered)))
    assert error.location == VICTIM and expected in error.problem


def test_a_tensor_declaring_2_pow_40_elements_is_refused_before_reading(tmp_path: Path) -> None:
    def make_huge(f: h5py.File) -> None:
        ds = f.create_dataset(VICTIM, shape=(2**40,), dtype=np.float32, chunks=(1024,))
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, make_huge)))
    assert error.location == VICTIM
    assert f"{2**42} bytes, over the memory budget" in error.problem


def test_an_index_declaring_2_pow_40_rows_is_refused_before_reading(tmp_path: Path) -> None:
    error = refusal(mutated(tmp_path, lambda f, _: f[cf.INDEX_PATH].resize((2**40,))))
    assert error.location == cf.INDEX_PATH and "over the memory budget" in error.problem


def test_a_decompression_bomb_chunk_is_refused_by_its_declared_chunk_size(tmp_path: Path) -> None:
    path = tmp_path / "bomb.h5"
    base_capture(path)
    with h5py.File(path, "r+") as f:
        del f[VICTIM]
        ds = f.create_dataset(
            VICTIM, data=np.arange(16, dtype=np.float32), maxshape=(None,), chunks=(2**24,), compression="gzip"
        )
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))
    with pytest.raises(CaptureError, match=r"declares chunks of \(16777216,\) = 67108864 bytes \(twice: a filtered chunk is decoded into a second buffer\), over the memory budget"):
        open_capture(path, memory_budget=2**20).close()
    assert path.stat().st_size < 2**20


def test_variable_length_string_attribute_is_refused_unread(tmp_path: Path) -> None:
    error = refusal(mutated(tmp_path, lambda f, _: f.attrs.create("prompt", "vlen text", dtype=h5py.string_dtype())))
    assert error.location == "/ attribute 'prompt'" and "variable-length string" in error.problem


def test_an_object_with_more_attributes_than_the_format_carries_is_refused_by_count_not_opened_one_by_one(tmp_path: Path) -> None:
    def crowd(f: h5py.File, _: Path) -> None:
        for i in range(MAX_ATTRIBUTES + 1):
            f["/tensors"].attrs[f"a{i}"] = np.int8(1)

    error = refusal(mutated(tmp_path, crowd))
    assert (error.location, error.problem) == ("/tensors", "has 16,385 attributes; an object of the format carries at most 16,384")


def test_a_dataset_cut_into_more_chunks_than_the_format_allows_is_refused_before_any_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tiny-chunks.h5"
    base_capture(path)
    with h5py.File(path, "r+") as f:
        ds = f.create_dataset(VICTIM + "-crumbs", shape=(MAX_CHUNKS + 1,), dtype=np.uint8, chunks=(1,))
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"uint8"))
    error = refusal(path)
    assert (error.location, error.problem) == (VICTIM + "-crumbs", "is cut into 1,048,577 chunks of (1,); a dataset of the format is cut into at most 1,048,576")


def test_soft_link_loop_is_refused(tmp_path: Path) -> None:
    def loop(f: h5py.File) -> None:
        f[VICTIM] = h5py.SoftLink("/tensors/loop")
        f["/tensors/loop"] = h5py.SoftLink(VICTIM)

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, loop)))
    assert "soft links nest deeper" in error.problem


def test_soft_link_inside_the_file_is_followed(tmp_path: Path) -> None:
    def alias(f: h5py.File) -> None:
        f[VICTIM] = h5py.SoftLink(cf.tensor_path(1))

    path = mutated(tmp_path, lambda f, _: replace_victim(f, alias))
    with open_capture(path) as capture:
        assert capture.read_values(capture.records[0]).tolist() == list(range(16))


def test_index_row_pointing_at_a_dataset_of_another_shape_is_refused(tmp_path: Path) -> None:
    def reshape(f: h5py.File) -> None:
        ds = f.create_dataset(VICTIM, data=np.zeros((4, 4), np.float32))
        ds.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, reshape)))
    assert error.location == VICTIM and "has shape (4, 4); the index row says (16,)" in error.problem


def test_truncated_files_are_refused_saying_how_much_of_them_is_there(tmp_path: Path) -> None:
    whole = tmp_path / "whole.h5"
    base_capture(whole, records=40)
    data = whole.read_bytes()
    for keep in (len(data) // 3, len(data) - 100, 1000):
        cut = tmp_path / f"cut-{keep}.h5"
        cut.write_bytes(data[:keep])
        assert refusal(cut).problem == f"cut short: {keep:,} of its {len(data):,} bytes are there (a copy or download that did not finish)"


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.h5"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    assert "not a readable HDF5 file" in refusal(path).problem


def test_plain_hdf5_file_is_not_a_capture(tmp_path: Path) -> None:
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(3))
    error = refusal(path)
    assert error.location == "/ attribute 'format'" and "not a Parity X-ray capture" in error.problem


def test_other_format_version_is_refused(tmp_path: Path) -> None:
    error = refusal(mutated(tmp_path, lambda f, _: f.attrs.create(cf.ATTR_VERSION, np.int64(2))))
    assert error.location == "/ attribute 'format_version'" and "version 2 is not supported" in error.problem


def test_a_check_out_of_time_is_reported_without_blaming_the_file_and_the_caller_survives(tmp_path: Path) -> None:
    path = tmp_path / "slow.h5"
    base_capture(path)
    with pytest.raises(CaptureError) as info:
        open_capture(path, check_timeout_s=0.01)
    assert info.value.path == str(path)
    assert info.value.problem.startswith("did not finish within the 0.01 s allowed (")
    assert "nothing wrong with the file was found" in info.value.problem
    assert "allow more time with PARITY_XRAY_CHECK_TIMEOUT_S=SECONDS (validate: --timeout SECONDS)" in info.value.problem
    assert "hang" not in info.value.problem
    assert not already_checked(path)


def test_a_failed_check_is_remembered_for_the_run_while_the_file_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "slow.h5"
    base_capture(path)
    first = ensure_checked(path, timeout_s=0.01)
    assert first is not None
    again = iter_ensure_checked(path, timeout_s=0.01)
    with pytest.raises(StopIteration) as remembered:
        next(again)  # no progress at all: no checking child was started
    assert remembered.value.value == first
    assert ensure_checked(path) is None, "a longer time limit checks the file again"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child through /proc")
def test_a_check_that_crashes_is_reported_by_file_name_and_the_caller_survives(tmp_path: Path) -> None:
    path = tmp_path / "crashing.h5"
    base_capture(path, records=400)
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(check_in_child(path)))
    worker.start()
    deadline = time.monotonic() + 20
    pid = None
    while pid is None and time.monotonic() < deadline:
        pid = child_reading(path)
    assert pid is not None, "the check never ran in a child process"
    os.kill(pid, signal.SIGSEGV)
    worker.join(30)
    report = outcome[0]
    assert len(report.problems) == 1
    assert "crashed the checking process (SIGSEGV)" in report.problems[0].problem


def test_passing_files_are_checked_once_until_they_change(tmp_path: Path) -> None:
    path = tmp_path / "ok.h5"
    base_capture(path)
    assert not already_checked(path)
    open_capture(path).close()
    assert already_checked(path)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not already_checked(path)


def _deflated(tmp_path: Path, elements: int, chunk: int) -> Path:
    """A capture of one tensor of `elements` float32 values, stored deflated in chunks of `chunk`
    elements (written with the low-level API, which takes any chunk whatever the data's extent)."""
    path = tmp_path / f"deflated-{elements}-{chunk}.h5"
    with CaptureWriter(path, CaptureMeta(role="native", engine_name="hostile-base"), layout="datasets") as writer:
        writer.add_tensor("t0", np.arange(elements, dtype=np.float32), step=0, segment="prefill")
        writer.end_step()
    with h5py.File(path, "r+") as f:
        del f[VICTIM]
        _deflated_victim(f, elements, chunk)
    return path


def _deflated_victim(f: h5py.File, elements: int, chunk: int) -> None:
    values = np.arange(elements, dtype=np.float32)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((chunk,))
    dcpl.set_deflate(1)
    space = h5py.h5s.create_simple((elements,), (h5py.h5s.UNLIMITED,))
    dataset = h5py.Dataset(h5py.h5d.create(f.id, VICTIM.encode(), h5py.h5t.IEEE_F32LE, space, dcpl=dcpl))
    dataset[...] = values
    dataset.attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))


def test_a_dataset_cut_into_many_tiny_filtered_chunks_is_refused_before_any_is_decoded(tmp_path: Path) -> None:
    # Filtered chunks are decoded one by one (0.3 ms each): 800,000 deflated 4-byte chunks of a
    # 3.2 MB pack kept report busy for over 25 minutes.
    chunks = SMALL_FILTERED_CHUNKS + 1
    error = refusal(_deflated(tmp_path, chunks, 1))
    assert error.location == VICTIM
    assert error.problem == (
        f"is cut into {chunks:,} filtered chunks of 4 bytes; past {SMALL_FILTERED_CHUNKS:,}, "
        f"a filtered chunk of the format holds at least {MIN_FILTERED_CHUNK_BYTES} bytes (each is decoded on its own)"
    )
    with open_capture(_deflated(tmp_path, SMALL_FILTERED_CHUNKS, 1)) as capture:
        assert capture.read_values(capture.records[0]).tolist() == list(range(SMALL_FILTERED_CHUNKS)), "a short table chunked row by row is read"


def test_a_filtered_chunk_far_larger_than_its_dataset_is_refused_and_one_within_the_floor_is_read(tmp_path: Path) -> None:
    # A chunk is decoded whole: a 3.2 MB pack declaring one chunk of almost 2 GiB inflated 2 GiB per read.
    chunk = FILTERED_CHUNK_FLOOR_BYTES // 4 + 1
    error = refusal(_deflated(tmp_path, 1000, chunk))
    assert error.location == VICTIM
    assert error.problem == (
        f"declares filtered chunks of {chunk * 4} bytes for 4000 bytes of data; a filtered chunk is decoded whole, "
        f"so the format's are at most the dataset's size or {FILTERED_CHUNK_FLOOR_BYTES // 1024**2} MiB"
    )
    with open_capture(_deflated(tmp_path, 1000, 4096)) as capture:
        assert capture.read_values(capture.records[0]).tolist() == list(range(1000)), "one chunk size for every pack, small ones too"


def test_a_dataset_with_an_empty_dataspace_is_refused_by_the_check_that_report_trusts(tmp_path: Path) -> None:
    def empty(f: h5py.File) -> None:
        f.create_dataset(VICTIM, data=h5py.Empty("<f4")).attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32"))

    error = refusal(mutated(tmp_path, lambda f, _: replace_victim(f, empty)))
    assert (error.location, error.problem) == (VICTIM, "has no data at all (an empty dataspace); a tensor with no elements has a shape with a 0 in it")
