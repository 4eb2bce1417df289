"""`parity-xray validate` lists every problem with its place and exits 0 only when every file is valid."""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import pytest

from sessions.capture import format as cf
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.commands import validate as validate_command
from viewer.cli import main


def validate(*files: Path, deep: bool = False) -> int:
    parser = argparse.ArgumentParser()
    validate_command.add_arguments(parser)
    return validate_command.run(parser.parse_args([*(["--deep"] if deep else []), *(str(f) for f in files)]))


def good_capture(path: Path, finish: bool = True) -> Path:
    writer = CaptureWriter(path, CaptureMeta(role="oracle", engine_name="validate"), layout="datasets")
    for step in range(2):
        seq = writer.add_tensor("kqv_out-0", np.zeros((4, 64), np.float32), step=step, segment="decode", layer=0)
        writer.add_dispatch(index_seq=seq, call=0, kv_group=0, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=1, kv_len=3 + step, head_dim=64, primitive="fallback")
        writer.add_token(step=step, segment="decode", token_id=7, is_stop=step == 1)
        writer.end_step()
    writer.close() if finish else writer.abandon()
    return path


def test_a_valid_capture_prints_what_it_holds_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = good_capture(tmp_path / "good.h5")
    assert validate(path) == 0
    assert capsys.readouterr().out == f"{path}: valid (2 records, 2 token steps, 2 tokens, 2 dispatch events)\n"


def test_every_problem_is_listed_with_its_location_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = good_capture(tmp_path / "bad.h5")
    with h5py.File(path, "r+") as f:
        del f[cf.tensor_path(0)]
        f.create_dataset(cf.tensor_path(0), data=np.zeros((4, 64), np.float32), chunks=(2, 64), fletcher32=True).attrs.create(
            cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float32")
        )
        f[cf.tensor_path(1, 1)].attrs.create(cf.ATTR_LOGICAL_DTYPE, np.bytes_(b"float16"))
        dispatch = f[cf.DISPATCH_PATH][()]
        dispatch["index_seq"][1] = 9
        f[cf.DISPATCH_PATH][...] = dispatch
    assert validate(path) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: invalid (3 problems)"
    assert lines[1].startswith(f"  {cf.tensor_path(0)}: uses filter id 3 (fletcher32)")
    assert lines[2] == f"  {cf.tensor_path(1, 1)} attribute 'logical_dtype': is 'float16'; the index row says 'float32'"
    assert lines[3] == "  /dispatch row 1: index_seq 9 is not a record (0..1)"


def test_each_file_gets_its_own_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = good_capture(tmp_path / "good.h5")
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(500))
    missing = tmp_path / "missing.h5"
    assert validate(garbage, good, missing) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{garbage}: invalid (1 problem)"
    assert out[1].startswith("  file: not a readable HDF5 file")
    assert out[2].startswith(f"{good}: valid (")
    assert out[3:] == [f"{missing}: invalid (1 problem)", "  file: does not exist"]


def test_an_unfinished_capture_is_not_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = good_capture(tmp_path / "unfinished.h5", finish=False)
    assert validate(path) == 2
    assert capsys.readouterr().out.splitlines()[1] == (
        "  / attribute 'complete': is not 1: incomplete: the writer did not finish; "
        "it holds 2 records, 2 token steps, 2 tokens, 2 dispatch events"
    )


def test_broken_occurrence_counts_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = good_capture(tmp_path / "occ.h5")
    with h5py.File(path, "r+") as f:
        index = f[cf.INDEX_PATH][()]
        index["occurrence"][1] = 3
        f[cf.INDEX_PATH][...] = index
    assert validate(path) == 2
    assert "  /index row 1 (kqv_out-0): occurrence is 3; 0 earlier rows have this name in step 1, segment 'decode', layer 0, so it should be 0" in capsys.readouterr().out


def _bad_type_under_tensors(f: h5py.File) -> None:
    f.create_dataset("/tensors/b05/refs", data=np.array([f[cf.INDEX_PATH].ref], dtype=h5py.ref_dtype))


def _vlen_ggml_src(f: h5py.File) -> None:
    f[cf.tensor_path(0)].attrs.create("ggml_src", '["blk.0.attn_output.weight"]', dtype=h5py.string_dtype())


UNUSED_BUT_REFUSED = {
    "external link nobody uses": (
        lambda f: f.__setitem__("/extra", h5py.ExternalLink("elsewhere.h5", "/x")),
        "/extra: is an external link to elsewhere.h5:/x; captures may not point at other files",
    ),
    "external link deep under /tensors": (
        lambda f: f.__setitem__("/tensors/b07/peek", h5py.ExternalLink("/etc/hostname", "/")),
        "/tensors/b07/peek: is an external link to /etc/hostname:/; captures may not point at other files",
    ),
    "dangling soft link": (
        lambda f: f.__setitem__("/tensors/b03/gone", h5py.SoftLink("/nowhere")),
        "/tensors/b03/gone -> /nowhere: does not exist (needed for /nowhere)",
    ),
    "variable-length string root attribute": (
        lambda f: f.attrs.create("notes", "free text", dtype=h5py.string_dtype()),
        "/ attribute 'notes': is a variable-length string; the format has fixed-length strings only",
    ),
    "object reference root attribute": (
        lambda f: f.attrs.create("points_at", f[cf.INDEX_PATH].ref, dtype=h5py.ref_dtype),
        "/ attribute 'points_at': is a reference (to an object or a region), which the format does not use",
    ),
    "region reference root attribute": (
        lambda f: f.attrs.create("rows", f[cf.INDEX_PATH].regionref[0:1], dtype=h5py.regionref_dtype),
        "/ attribute 'rows': is a reference (to an object or a region), which the format does not use",
    ),
    "opaque root attribute": (
        lambda f: f.attrs.create("blob", np.void(b"\x01\x02\x03")),
        "/ attribute 'blob': is an opaque type, which the format does not use",
    ),
    "object references under /tensors that no row uses": (
        _bad_type_under_tensors,
        "/tensors/b05/refs: element type is a reference (to an object or a region), which the format does not use",
    ),
    "variable-length ggml_src on a tensor": (
        _vlen_ggml_src,
        f"{cf.tensor_path(0)} attribute 'ggml_src': is a variable-length string; the format has fixed-length strings only",
    ),
    "named variable-length type": (
        lambda f: f.__setitem__("/tensors/b09/text", h5py.string_dtype()),
        "/tensors/b09/text: named type is a variable-length string; the format has fixed-length strings only",
    ),
}


@pytest.mark.parametrize("case", sorted(UNUSED_BUT_REFUSED))
def test_what_other_tools_would_follow_or_choke_on_is_refused_even_where_no_row_leads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """h5dump and HDFView open every link, object and attribute, not only what the index names."""
    mutate, problem = UNUSED_BUT_REFUSED[case]
    path = good_capture(tmp_path / "extra.h5")
    with h5py.File(path, "r+") as f:
        mutate(f)
    assert validate(path) == 2
    assert capsys.readouterr().out.splitlines() == [f"{path}: invalid (1 problem)", f"  {problem}"]


def test_hard_link_cycles_and_compact_storage_are_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = good_capture(tmp_path / "cycle.h5")
    with h5py.File(path, "r+") as f:
        f["/tensors/b04/up"] = f[cf.TENSORS_GROUP]
        space = h5py.h5s.create_simple((4,))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"/tensors/b06/small", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
    assert validate(path) == 0
    assert capsys.readouterr().out.startswith(f"{path}: valid (")


def test_deep_validation_reads_every_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored chunk that no longer inflates passes the metadata check and fails the deep one."""
    path = tmp_path / "gzip.h5"
    with CaptureWriter(path, CaptureMeta(role="oracle", engine_name="deep"), compression="gzip", layout="datasets") as writer:
        writer.add_tensor("l_out-0", np.arange(512, dtype=np.float32), step=0, segment="prefill", layer=0)
        writer.end_step()
    assert validate(path) == 0
    with h5py.File(path, "r+") as f:
        ds = f[cf.tensor_path(0)]
        chunk = ds.id.get_chunk_info(0).chunk_offset
        ds.id.write_direct_chunk(chunk, b"not a zlib stream")
    assert validate(path) == 0
    capsys.readouterr()
    assert validate(path, deep=True) == 2
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"  {cf.tensor_path(0)} chunk at {chunk}: its deflate stream is corrupt (incorrect header check)"
    ]


def test_a_control_character_from_the_file_is_refused_and_shown_escaped_so_each_problem_stays_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = good_capture(tmp_path / "newline.h5")
    with h5py.File(path, "r+") as f:
        index = f[cf.INDEX_PATH][()]
        index["path"][0] = b"/\nensors/b00/s0000000/t00000000"
        f[cf.INDEX_PATH][...] = index
    assert validate(path) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: invalid (1 problem)",
        "  /index row 0 (kqv_out-0): path holds a control character (\\n in '/\\nensors/b00/s0000000/t00000000')",
    ]


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--memory-budget", "0", "must be a whole number >= 1, not 0"),
        ("--memory-budget", str(10**23), f"must be a whole number <= {2**62}, not {10**23}"),
        ("--timeout", "nan", "must be a finite number of seconds > 0, not nan"),
        ("--timeout", "0", "must be a finite number of seconds > 0, not 0"),
    ],
)
def test_a_limit_no_check_can_use_is_refused_as_the_option_not_blamed_on_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, problem: str
) -> None:
    """A budget of 0 said the file was over it; `--timeout nan` checked with no limit at all."""
    capture = good_capture(tmp_path / "ok.h5")
    with pytest.raises(SystemExit) as exited:
        main(["validate", str(capture), option, value])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"parity-xray validate: error: argument {option}: {problem} (`parity-xray validate --help` lists the options)\n"


def test_a_check_that_runs_out_of_time_says_the_file_was_not_checked_never_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"invalid (1 problem)" above "nothing wrong with the file was found"."""
    path = good_capture(tmp_path / "good.h5")
    parser = argparse.ArgumentParser()
    validate_command.add_arguments(parser)
    assert validate_command.run(parser.parse_args(["--timeout", "0.000001", str(path)])) == validate_command.EXIT_INVALID
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: not checked" and out[1].startswith("  structure check: did not finish within the 1e-06 s allowed")
