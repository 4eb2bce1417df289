"""The comparison cache: where it lives, what invalidates a result, how large it grows, and `parity-xray cache`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.opening import open_capture
from sessions.capture.reader import stored_span
from sessions.compare.comparison import iter_compare
from sessions.compare.document import document_bytes
from sessions.compare.options import CompareOptions
from sessions.compare.result_cache import entries, iter_document_cached, load, store
from sessions.progress import run_to_end
from viewer.cli import main


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(folder))
    return folder


def pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two bit-identical one-tensor captures (llama.cpp names on both sides)."""
    bits = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "native.h5", "native", [T("l_out-0", bits, layer=0, dtype="bfloat16")], [(0, 1, False)])
    oracle = write_capture(tmp_path / "oracle.h5", "oracle", [T("l_out-0", bits.copy(), layer=0, dtype="bfloat16")], [(0, 1, False)])
    return native, oracle


def report(native: Path, oracle: Path) -> int:
    return main(["report", str(native), str(oracle)])


def test_results_are_kept_in_the_folder_parity_xray_cache_dir_names(tmp_path: Path, cache_dir: Path) -> None:
    assert report(*pair(tmp_path)) == 0
    assert len(list((cache_dir / "comparisons").glob("*.json"))) == 1


def test_a_tensor_edited_in_place_with_its_mtime_restored_is_compared_again(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same size, same index, same mtime: only the change time (which no user can set) tells."""
    native, oracle = pair(tmp_path)
    assert report(native, oracle) == 0
    with open_capture(native) as capture:
        span = stored_span(capture, capture.records[0])
    assert span is not None
    before = os.stat(native)
    with open(native, "r+b") as handle:
        handle.seek(span[0])
        byte = handle.read(1)
        handle.seek(span[0])
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(native, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(native)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    capsys.readouterr()
    assert report(native, oracle) == 1
    assert "First finding: diverged at 0:prefill:0:layer_out" in capsys.readouterr().out


def test_the_least_recently_used_results_are_evicted_past_the_size_cap(tmp_path: Path) -> None:
    native, oracle = pair(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    folder = tmp_path / "comparisons"
    store(folder, "a", comparison, 1 << 30)
    cap = entries(folder)[0][1] * 5 // 2  # room for two results
    time.sleep(0.05)  # file times tick in milliseconds
    store(folder, "b", comparison, cap)
    time.sleep(0.05)
    assert load(folder, "a") == comparison  # a is now the most recently used
    time.sleep(0.05)
    store(folder, "c", comparison, cap)
    assert [path.stem for _, _, path in entries(folder)] == ["a", "c"]
    assert load(folder, "b") is None


def test_cache_summarises_and_clears_only_its_own_entries(tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report(*pair(tmp_path)) == 0
    (cache_dir / "notes.txt").write_text("the user's own file")
    capsys.readouterr()
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache: {cache_dir} ($PARITY_XRAY_CACHE_DIR)"
    assert lines[1].startswith("  comparison results: 1 entries, ") and lines[1].endswith(" MiB, limit 256.0 MiB")
    assert lines[2].startswith("  passed structure checks: 2 entries, ")
    assert lines[3] == "  weights hashes of recorded models: 0 entries, 0.0 MiB"
    assert lines[4] == "  judged gate cases: 0 entries, 0.0 MiB"
    assert main(["cache", "--clear"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  comparison results: removed 1 entries (")
    assert lines[2].startswith("  passed structure checks: removed 2 entries (")
    assert sorted(p.name for p in cache_dir.rglob("*") if p.is_file()) == ["notes.txt"]


def test_the_document_passed_on_is_the_entry_as_stored_and_a_damaged_entry_is_compared_again(tmp_path: Path) -> None:
    native, oracle = pair(tmp_path)
    folder = tmp_path / "comparisons"
    with open_capture(native) as n, open_capture(oracle) as o:
        computed = run_to_end(iter_compare(n, o))
        first = run_to_end(iter_document_cached(n, o, CompareOptions(), folder))
        (entry,) = folder.glob("*.json")
        assert first == entry.read_bytes() == document_bytes(computed)
        assert [p.label for p in iter_document_cached(n, o, CompareOptions(), folder)] == ["cached result"]
        assert run_to_end(iter_document_cached(n, o, CompareOptions(), folder)) == first
        entry.write_bytes(first[: len(first) // 2])
        labels = [p.label for p in iter_document_cached(n, o, CompareOptions(), folder)]
        assert labels != ["cached result"] and labels[0] == "aligning records", "a damaged entry is not passed on"
        assert entry.read_bytes() == first, "and is written again"


def test_a_result_is_found_again_whatever_number_of_workers_is_asked_for_and_not_for_other_tolerances(tmp_path: Path) -> None:
    native, oracle = pair(tmp_path)
    folder = tmp_path / "comparisons"
    with open_capture(native) as n, open_capture(oracle) as o:
        run_to_end(iter_document_cached(n, o, CompareOptions(workers=1), folder))
        assert [p.label for p in iter_document_cached(n, o, CompareOptions(workers=8), folder)] == ["cached result"]
        assert [p.label for p in iter_document_cached(n, o, CompareOptions(max_ulp=1), folder)] != ["cached result"]
