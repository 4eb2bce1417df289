"""`parity-xray report`: readable summary, JSON document, and exit codes 0 / 1 / 2."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import ml_dtypes
import numpy as np
import pytest
from hand_captures import T, bf16_bits, pair_session, write_capture

from sessions.capture import format as cf
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.commands import report as report_command
from sessions.compare.document import ReportFormatError, loads
from sessions.compare.json_plain import plain
from sessions.compare.tensor_diff import TensorMetrics
from sessions.investigation.model import SavedTolerance
from sessions.investigation.schema import SCHEMA_VERSION
from sessions.investigation.store import SessionDocument
from sessions.machine import WORKERS_PER_CORE, usable_cores
from sessions.printable import printable


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    return report_command.run(parser.parse_args(list(argv)))


def _pair(tmp_path: Path, flip: bool, weights: str = "sha256:aa") -> tuple[str, str]:
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    y = x.copy()
    if flip:
        y[2, 5] ^= 1
    n = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", x, layer=0, dtype="bfloat16")], [(0, 1, False)])
    o = write_capture(
        tmp_path / "o.h5", "oracle", [T("model.layers.0", y[None].copy(), layer=0, dtype="bfloat16")], [(0, 1, False)], weights_hash=weights
    )
    return str(n), str(o)


def test_bit_exact_pair_exits_zero_and_says_parity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(*_pair(tmp_path, flip=False)) == 0
    out = capsys.readouterr().out
    assert out.startswith("PARITY: ") and "First finding: none" in out


def test_divergence_exits_one_and_shows_coordinates_and_both_values_in_hex_and_decimal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = _pair(tmp_path, flip=True)
    report = tmp_path / "report.json"
    assert _run(native, oracle, "--json", str(report), "--top", "3") == 1
    out = capsys.readouterr().out
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    assert "DIVERGENCE: first diverged at 0:prefill:0:layer_out" in out
    assert "First finding: diverged at 0:prefill:0:layer_out" in out
    native_bits, oracle_bits = int(x[2, 5]), int(x[2, 5]) ^ 1
    n_value = float(np.array([native_bits], np.uint16).view(ml_dtypes.bfloat16)[0])
    o_value = float(np.array([oracle_bits], np.uint16).view(ml_dtypes.bfloat16)[0])
    assert f"at [2, 5]: native 0x{native_bits:04x} ({n_value!r}) vs oracle 0x{oracle_bits:04x} ({o_value!r}), 1 ULP" in out
    document = json.loads(report.read_text())
    assert document["format"] == "parity-xray-report" and document["verdict"]["word"] == "DIVERGENCE"
    assert document["verdict"]["first"] == {"kind": "diverged", "key": "0:prefill:0:layer_out", "detail": "1 of 24 elements differ, max 1 ULP"}
    assert document["pairs"][document["first_divergence"]]["metrics"]["first_difference"]["coord"] == [2, 5]
    assert loads(report.read_text()).verdict.word == "DIVERGENCE"


def test_a_tolerance_passes_the_pair_but_keeps_the_bit_difference_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=True)
    report = tmp_path / "report.json"
    assert _run(native, oracle, "--max-ulp", "1", "--json", str(report)) == 0
    document = json.loads(report.read_text())
    assert document["first_divergence"] == 0 and document["verdict"]["first"] is None and document["verdict"]["word"] == "PARITY"
    assert document["pairs"][0]["verdict"] == "within-tolerance"
    assert document["pairs"][0]["metrics"]["differing"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_output_whose_folder_takes_no_file_is_refused_before_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Root may write where the mode bits forbid, so the folder is asked to take a file: /proc
    takes none, and the report ran to its end before saying "No such file or directory"."""
    native, oracle = _pair(tmp_path, flip=True)
    assert _run(native, oracle, "--json", "/proc/r.json") == 2
    assert capsys.readouterr().err.strip() == "parity-xray report: --json /proc/r.json is in /proc, which takes no new file (No such file or directory)"


def test_an_output_whose_folder_keeps_every_file_it_takes_is_refused_naming_what_stays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An append-only folder takes the probe but cannot remove it: the refusal named a hidden
    file the user never asked for ("cannot use .../.parity-xray-probe-...")."""
    native, oracle = _pair(tmp_path, flip=True)
    folder = tmp_path / "append-only"
    folder.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+a", str(folder)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +a is not allowed here (root on a file system with attributes)")
    try:
        assert _run(native, oracle, "--json", str(folder / "r.json")) == 2
        err = capsys.readouterr().err.strip()
    finally:
        subprocess.run(["chattr", "-a", str(folder)], check=True)
    assert err.startswith(f"parity-xray report: --json {folder / 'r.json'} is in {folder}, which takes a new file but cannot remove one (Operation not permitted; .parity-xray-probe-")
    assert err.endswith(" stays there)")


def test_weights_hash_mismatch_is_a_warning_at_the_top(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(*_pair(tmp_path, flip=False, weights="sha256:bb"))
    assert capsys.readouterr().out.splitlines()[0].startswith("WARNING: WEIGHTS HASH MISMATCH")


def test_weights_hashed_by_two_versions_of_the_recorders_are_unconfirmed_not_different(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recorders hash a model's bytes alone since the weights hash became "sha256:<digest>"; an older
    capture's bare digest mixed in file names, and one GGUF read as DIFFERENT WEIGHTS across them."""
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    earlier, now = "ab" * 32, f"sha256:{'cd' * 32}"
    n = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", x, layer=0, dtype="bfloat16")], [(0, 1, False)], weights_hash=earlier)
    o = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0", x[None].copy(), layer=0, dtype="bfloat16")], [(0, 1, False)], weights_hash=now)
    assert _run(str(n), str(o)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"WARNING: weights hashed by two versions of the recorders (native {earlier}, oracle {now}): ")
    assert "WEIGHTS HASH MISMATCH" not in out and "DIFFERENT WEIGHTS" not in out and "weights unconfirmed (hashed by two versions)" in out


def test_a_report_file_that_cannot_be_written_is_named_and_the_json_is_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=True)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where a folder is expected")
    assert _run(native, oracle, "--json", str(blocked / "r.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"parity-xray report: --json {blocked / 'r.json'} is in {blocked}, which is not a folder"
    assert _run(native, oracle, "--json", str(tmp_path / "r.json")) == 1
    assert json.loads((tmp_path / "r.json").read_text())["verdict"]["word"] == "DIVERGENCE"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temp file left behind"


def _unusable(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert _run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("parity-xray report: unusable input:")
    return err


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        ({(0, 1): 0x7FC0, (1, 2): 0x7FC0}, "2 of 24 elements differ, each a NaN against a number"),
        ({(0, 1): 0x7FC0, (1, 2): None}, "2 of 24 elements differ, max 1 ULP, 1 a NaN against a number"),
        ({(3, 0): 0x8000}, "1 of 24 elements differ, all +0/-0 swaps"),
        ({(2, 2): 0x7FC1}, "1 of 24 elements differ, each a NaN against a NaN of other bits"),
        ({(3, 1): 0xFF80, (1, 2): None}, "2 of 24 elements differ, max 65,281 ULP, 1 an infinity against another value"),
    ],
)
def test_the_headline_never_measures_a_nan_or_a_signed_zero_in_ulp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[tuple[int, int], int | None], detail: str
) -> None:
    """A pair differing only by NaN against numbers read "max 0 ULP", as if nothing differed."""
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    x[3, 0], x[2, 2], x[3, 1] = 0x0000, 0x7FC0, 0x7F80  # +0, a NaN and +inf where a case changes them
    y = x.copy()
    for place, bits in changes.items():
        y[place] = x[place] ^ 1 if bits is None else bits
    n = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", y, layer=0, dtype="bfloat16")], [(0, 1, False)])
    o = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0", x[None].copy(), layer=0, dtype="bfloat16")], [(0, 1, False)], weights_hash="sha256:aa")
    report = tmp_path / "report.json"
    _run(str(n), str(o), "--json", str(report))
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(f"at 0:prefill:0:layer_out ({detail})")
    assert json.loads(report.read_text())["verdict"]["first"]["detail"] == detail
    assert "first element beyond tolerance" not in out, "under a bit-exact verdict it is the first differing element, said once"
    finite = "each a NaN" not in detail and "+0/-0" not in detail
    assert ("max abs error 0 (no element differs in value by a finite amount)" in out) == (not finite), "'max abs error 0 none' said nothing"


def test_an_op_differing_only_by_a_nan_leads_the_worst_ops_and_the_error_growth_on_every_surface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NMSE leaves a NaN out: such an op ranked below every 1-ULP one, past the top ten, and alone
    it made the error growth of a DIVERGENCE "flat: every compared pair is bit-exact"."""
    from sessions.compare.comparison import worst_ops
    from sessions.compare.document import loads

    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    nan = x.copy()
    nan[1, 1] = 0x7FC0
    one_ulp = x.copy()
    one_ulp[0, 0] ^= 1
    native = write_capture(
        tmp_path / "n.h5", "native", [T("l_out-0", one_ulp, layer=0, dtype="bfloat16"), T("l_out-1", nan, layer=1, dtype="bfloat16")], [(0, 1, False)]
    )
    oracle = write_capture(
        tmp_path / "o.h5", "oracle", [T("model.layers.0", x[None].copy(), layer=0, dtype="bfloat16"), T("model.layers.1", x[None].copy(), layer=1, dtype="bfloat16")],
        [(0, 1, False)], weights_hash="sha256:aa",
    )
    report = tmp_path / "r.json"
    _run(str(native), str(oracle), "--full", "--json", str(report), "--html", str(tmp_path / "r.html"))
    text = capsys.readouterr().out.splitlines()
    worst = text.index(next(line for line in text if line.startswith("Worst ops (a NaN or an infinity against a number first")))
    assert text[worst + 1].split()[0] == "0:prefill:1:layer_out" and text[worst + 2].split()[0] == "0:prefill:0:layer_out"
    growth = text.index("Error growth (execution order: max ULP, NMSE, elements differing)")
    assert [line.split()[0] for line in text[growth + 1 : growth + 3]] == ["0:prefill:0:layer_out", "0:prefill:1:layer_out"]
    assert [p.key.text() for p in worst_ops(loads(report.read_text()), 10)] == ["0:prefill:1:layer_out", "0:prefill:0:layer_out"]
    assert "Flat: every compared op is bit-exact" not in (tmp_path / "r.html").read_text()


def test_where_a_tolerance_was_first_broken_is_said_when_the_first_difference_is_within_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the JSON said that a NaN broke a 10-ULP bound: every sentence pointed at a 5-ULP difference it allowed."""
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    y = x.copy()
    y[1, 1] += 5
    y[2, 2] = 0x7FC0
    n = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", y, layer=0, dtype="bfloat16")], [(0, 1, False)])
    o = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0", x[None].copy(), layer=0, dtype="bfloat16")], [(0, 1, False)], weights_hash="sha256:aa")
    report = tmp_path / "report.json"
    assert _run(str(n), str(o), "--max-ulp", "10", "--json", str(report)) == 1
    detail = "2 of 24 elements differ, max 5 ULP, 1 a NaN against a number; 1 beyond tolerance, first at [2, 2]"
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"DIVERGENCE: first diverged at 0:prefill:0:layer_out ({detail})"
    assert "  first element beyond tolerance at [2, 2]: native 0x7fc0 (nan)" in out
    assert json.loads(report.read_text())["verdict"]["first"]["detail"] == detail


def test_missing_file_is_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, _ = _pair(tmp_path, flip=False)
    assert "does not exist" in _unusable(capsys, native, str(tmp_path / "absent.h5"))


def test_a_file_that_is_not_a_capture_is_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, _ = _pair(tmp_path, flip=False)
    text = tmp_path / "notes.h5"
    text.write_text("just text")
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.zeros(3)
    assert str(text) in _unusable(capsys, native, str(text))
    assert "not a Parity X-ray capture" in _unusable(capsys, native, str(plain))


def test_a_hostile_capture_is_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=False)
    with h5py.File(oracle, "r+") as f:
        tensor = cf.decode_field(f[cf.INDEX_PATH][0]["path"])
        del f[tensor]
        f[tensor] = h5py.ExternalLink("/etc/hostname", "/data")
    assert tensor.rsplit("/", 1)[-1] in _unusable(capsys, native, oracle)


def test_an_incomplete_capture_is_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, _ = _pair(tmp_path, flip=False)
    writer = CaptureWriter(tmp_path / "partial.h5", CaptureMeta(role="oracle"))
    writer.add_tensor("model.layers.0", bf16_bits(np.zeros((1, 4, 6))), step=0, segment="prefill", layer=0, dtype="bfloat16")
    writer.abandon()
    assert "incomplete" in _unusable(capsys, native, str(tmp_path / "partial.h5"))


def test_a_capture_of_no_records_is_said_to_hold_nothing_to_compare_not_to_lack_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It read "no built-in profile recognises most of the native record names; pass --native-profile"."""
    empty = write_capture(tmp_path / "empty.h5", "native", [])
    _, oracle = _pair(tmp_path, flip=False)
    assert _run(str(empty), oracle) == 2
    assert capsys.readouterr().err == (
        f"parity-xray report: unusable input: {empty}: /index holds no records: the native run has nothing to compare (did its recorder write none?)\n"
    )


def test_a_capture_that_records_no_tokens_leaves_the_tokens_uncompared_on_every_surface_not_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each step of the other run read "missing", and the pair a token DIVERGENCE ("native token none vs oracle token 1")."""
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "n.h5", "native", [T("l_out-0", x, layer=0, dtype="bfloat16")], [])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("model.layers.0", x[None].copy(), layer=0, dtype="bfloat16")], [(0, 1, False)])
    out_json = tmp_path / "r.json"
    assert _run(str(native), str(oracle), "--json", str(out_json)) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[:2] == [
        "WARNING: the native capture records no tokens, so the greedy tokens were not compared",
        "PARITY: every aligned op is bit-exact or within tolerance, and no token step was recorded by both runs to compare",
    ]
    assert "Token parity (0 compared steps, no shared EOS, no token step compared; * = stop token)" in text, "never 'tokens agree' of no step"
    document = json.loads(out_json.read_text())
    assert document["verdict"]["word"] == "PARITY" and document["tokens"]["steps"] == []
    assert "the native capture records no tokens, so the greedy tokens were not compared" in document["provenance"]["warnings"]


def test_an_unreadable_profile_is_unusable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=False)
    assert "does not exist" in _unusable(capsys, native, oracle, "--native-profile", str(tmp_path / "nope.toml"))


def test_a_fifo_in_place_of_a_capture_is_unusable_input_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, _ = _pair(tmp_path, flip=False)
    fifo = tmp_path / "pipe.h5"
    os.mkfifo(fifo)
    assert "not a regular file" in _unusable(capsys, native, str(fifo))


def test_report_after_editing_a_profile_prints_the_edited_result_not_the_cached_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=True)
    profile = tmp_path / "mine.toml"
    profile.write_text('name = "mine"\n[[rule]]\nname = "l_out-{layer}"\nop = "layer_out"\n', encoding="utf-8")
    assert _run(native, oracle, "--native-profile", str(profile)) == 1
    assert "First finding: diverged at 0:prefill:0:layer_out" in capsys.readouterr().out
    profile.write_text('name = "mine"\n[[rule]]\nname = "l_out-{layer}"\nop = "ffn_down"\n', encoding="utf-8")
    report = tmp_path / "report.json"
    assert _run(native, oracle, "--native-profile", str(profile), "--json", str(report)) == 1
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("First finding:"))
    assert first == "First finding: unaligned at 0:prefill:0:ffn_down", "no rerun or diagnose offered for a record without a partner"
    document = json.loads(report.read_text())
    assert document["version"] == 7 and document["pairs"] == []
    assert document["native_profile_identity"]["path"] == str(profile.resolve())
    assert sorted(u["reason"] for u in document["unaligned"]) == ["no_partner", "no_partner"]


def test_a_version_1_document_is_refused_by_name(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    assert _run(*_pair(tmp_path, flip=False), "--json", str(report)) == 0
    document = json.loads(report.read_text())
    document["version"] = 1
    with pytest.raises(ReportFormatError, match="not a parity-xray-report version 7 document"):
        loads(json.dumps(document))


@dataclass
class _Held:
    bits: np.ndarray
    table: np.ndarray
    metrics: TensorMetrics


def test_documents_carry_derived_counts_non_finite_floats_as_strings_and_never_arrays() -> None:
    metrics = TensorMetrics("bfloat16", [4], 4, differing=1, nmse=float("nan"), max_abs_error=float("inf"), max_rel_error=float("-inf"))
    held = _Held(np.zeros(3, np.uint16), np.ones(2), metrics)
    document = plain(held, omit=frozenset({"bits"}))
    assert set(document) == {"table", "metrics"} and document["table"] is None
    m = document["metrics"]
    assert (m["bit_exact"], m["fraction_differing"]) == (False, 0.25)
    assert (m["nmse"], m["max_abs_error"], m["max_rel_error"]) == ("NaN", "Infinity", "-Infinity")
    json.dumps(document, allow_nan=False)


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--max-ulp", "-3", f"argument --max-ulp: must be a whole number from 0 to {2**63 - 1}, not -3"),
        ("--max-ulp", str(2**64), f"argument --max-ulp: must be a whole number from 0 to {2**63 - 1}, not {2**64}"),
        ("--max-ulp", "2.0", f"argument --max-ulp: must be a whole number from 0 to {2**63 - 1}, not 2.0"),
        ("--atol", "small", "argument --atol: must be a finite number >= 0, not small"),
        ("--rtol", "-1", "argument --rtol: must be a finite number >= 0, not -1"),
        ("--atol", "nan", "argument --atol: must be a finite number >= 0, not nan"),
        ("--workers", "-1", "argument --workers: must be a whole number >= 0, not -1"),
        ("--top", "0", "argument --top: must be a whole number >= 1, not 0"),
    ],
)
def test_an_option_no_comparison_can_use_is_refused_with_exit_2_before_anything_is_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, problem: str
) -> None:
    native, oracle = _pair(tmp_path, flip=True)
    with pytest.raises(SystemExit) as stopped:
        _run(native, oracle, option, value)
    assert stopped.value.code == 2 and problem in capsys.readouterr().err


def test_an_unusable_input_leaves_no_report_behind_where_an_earlier_run_wrote_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _pair(tmp_path, flip=False)
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    assert _run(native, oracle, "--json", str(out_json), "--html", str(out_html)) == 0
    assert json.loads(out_json.read_text())["verdict"]["word"] == "PARITY"
    _unusable(capsys, native, str(tmp_path / "absent.h5"), "--json", str(out_json), "--html", str(out_html))
    assert not out_json.exists() and not out_html.exists(), "a CI step must not read the earlier pair's PARITY as this one's"


def test_runs_cut_alike_paired_by_position_compare_their_attention_calls_as_paired_by_calls(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = (str(p) for p in demo_pairs["head-chunk"])
    out_html = tmp_path / "r.html"
    assert _run(native, oracle, "--align", "positions", "--html", str(out_html)) == 1, "--align positions turned this dispatch difference into PARITY"
    text = capsys.readouterr().out
    assert text.startswith("DISPATCH-ONLY: first dispatch-only at 0:text-after:0:sdpa@") and "not compared" not in text
    assert _run(native, oracle) == 1
    assert capsys.readouterr().out.startswith("DISPATCH-ONLY: first dispatch-only at 0:text-after:0:sdpa (")


def test_a_capture_that_records_no_attention_calls_leaves_them_uncompared_and_never_dispatch_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An imported oracle has no dispatch table: every attention op of a bit-identical pair against
    a recorder that writes one was dispatch-only."""
    attention = bf16_bits(np.linspace(-2, 2, 32).reshape(4, 8))
    call = dict(kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=4, kv_len=4, head_dim=8, primitive="fallback")
    native = write_capture(tmp_path / "n.h5", "native", [T("sdpa", attention, layer=0, dtype="bfloat16", dispatch=[call])], [(0, 1, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("sdpa", attention, layer=0, dtype="bfloat16")], [(0, 1, False)])
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    assert _run(str(native), str(oracle), "--json", str(out_json), "--html", str(out_html)) == 0
    why = "not compared: the oracle capture records no attention calls (no dispatch table), so how its engine split the work is unknown"
    text = capsys.readouterr().out
    assert text.startswith("PARITY: ") and f"Dispatch\n  {why}\n" in text
    document = json.loads(out_json.read_text())
    assert document["dispatch_not_compared"] == why and document["dispatch_differences"] == [] and document["verdict"]["word"] == "PARITY"
    assert why in out_html.read_text()
    assert _run(str(native), str(native)) == 0
    assert "Dispatch\n  no differences: every attention op made the same primitive calls on both sides\n" in capsys.readouterr().out
    neither = write_capture(tmp_path / "n2.h5", "native", [T("sdpa", attention, layer=0, dtype="bfloat16")], [(0, 1, False)])
    assert _run(str(neither), str(oracle)) == 0
    assert "Dispatch\n  not compared: neither capture records its attention calls\n" in capsys.readouterr().out


def test_an_output_named_dash_is_refused_instead_of_written_as_a_file_named_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    native, oracle = _pair(tmp_path, flip=False)
    monkeypatch.chdir(tmp_path)
    assert _run(native, oracle, "--json", "-") == 2
    assert capsys.readouterr().err.endswith("--json - would be a file named '-' in this folder: outputs are files (the text goes to standard output); name a path\n")
    assert not (tmp_path / "-").exists()


def test_a_parity_over_captures_without_tokens_does_not_say_the_tokens_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", x, layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")])
    out_json = tmp_path / "r.json"
    assert _run(str(native), str(oracle), "--json", str(out_json)) == 0
    headline = "PARITY: every aligned op is bit-exact or within tolerance, and no token step was recorded by both runs to compare"
    assert capsys.readouterr().out.startswith(headline + "\n")
    verdict = json.loads(out_json.read_text())["verdict"]
    assert verdict["headline"] == headline and verdict["tokens_compared"] is False
    with_tokens = _pair(tmp_path, flip=False)
    assert _run(*with_tokens) == 0
    assert capsys.readouterr().out.startswith("PARITY: every aligned op is bit-exact or within tolerance, and the tokens agree\n")


def test_a_parity_headline_names_the_shared_eos_only_when_both_runs_stopped_there(demo_pairs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(*map(str, demo_pairs["post-eos"])) == 0
    assert capsys.readouterr().out.startswith("PARITY: every aligned op up to the shared EOS (step 3) is bit-exact or within tolerance, and the tokens agree\n")
    assert _run(*map(str, demo_pairs["clean"])) == 0
    assert capsys.readouterr().out.startswith("PARITY: every aligned op is bit-exact or within tolerance, and the tokens agree\n")


def test_a_zero_tolerance_on_the_command_line_is_bit_exact_as_in_the_window_and_a_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _signed_zero_pair(tmp_path)
    for bound in ("--atol", "--rtol", "--max-ulp"):
        assert _run(str(native), str(oracle), bound, "0") == 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("SIGNED-ZERO-ONLY: ") and "tolerance  bit-exact" in lines, bound


def _signed_zero_pair(folder: Path) -> tuple[Path, Path]:
    """A pair differing only in the sign of one zero: SIGNED-ZERO-ONLY, exit 1, when bit-exact is asked."""
    x = bf16_bits(np.array([[0.0, 1.0, -2.0]]))
    y = x.copy()
    y[0, 0] = 0x8000
    native = write_capture(folder / "n.h5", "native", [T("layer_out", x, layer=0, dtype="bfloat16")], [(0, 1, False)])
    oracle = write_capture(folder / "o.h5", "oracle", [T("layer_out", y, layer=0, dtype="bfloat16")], [(0, 1, False)])
    return native, oracle


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_output_path_naming_an_input_is_refused_and_the_input_is_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _signed_zero_pair(tmp_path)
    before = _digest(oracle)
    assert _run(str(native), str(oracle), "--json", str(oracle)) == 2
    assert f"--json {oracle} is the oracle capture: an output never replaces an input" in capsys.readouterr().err
    assert _run(str(tmp_path / "absent.h5"), str(oracle), "--html", str(tmp_path / "." / "o.h5")) == 2
    assert oracle.exists() and _digest(oracle) == before, "an unusable input's stale-report cleanup never removes an input"
    assert _run(str(native), str(oracle), "--json", str(tmp_path / "r.out"), "--html", str(tmp_path / "r.out")) == 2
    assert f"--json and --html both name {tmp_path / 'r.out'}: each output needs a file of its own" in capsys.readouterr().err
    assert not (tmp_path / "r.out").exists()


def _session(folder: Path, native: Path, oracle: Path) -> Path:
    session = pair_session(native, oracle, "shared by a colleague")
    path = folder / "s.xray"
    SessionDocument(session).save_as(path)
    return path


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("rtol", -1, "must be a finite number >= 0, not -1.0"),
        ("atol", 1e400, "must be a finite number >= 0, not inf"),
        ("max_ulp", 2**64, f"must be a whole number from 0 to {2**63 - 1}, not {2**64}"),
    ],
)
def test_a_session_tolerance_no_comparison_can_use_is_refused_by_its_place_not_applied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: float, problem: str
) -> None:
    session = _session(tmp_path, *_signed_zero_pair(tmp_path))
    data = json.loads(session.read_text())
    data["session"]["tolerances"]["default"][key] = value
    session.write_text(json.dumps(data))
    assert _run("--session", str(session)) == 2, "an rtol of -1 made this pair PARITY, exit 0"
    err = capsys.readouterr().err
    assert str(session) in err and f"/session/tolerances/default/{key}" in err and problem in err


def test_a_damaged_session_is_unusable_input_naming_its_backups_and_is_neither_renamed_nor_replaced_by_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = _session(tmp_path, *_signed_zero_pair(tmp_path))
    SessionDocument.open(session).save()  # the earlier version becomes s.xray.1
    session.write_text("{ not json")
    assert _run("--session", str(session)) == 2
    assert "backups beside it: s.xray.1" in capsys.readouterr().err
    assert session.read_text() == "{ not json" and sorted(p.name for p in tmp_path.glob("s.xray*")) == ["s.xray", "s.xray.1"]


def test_a_session_naming_a_capture_path_with_an_escape_sequence_is_unusable_in_one_escaped_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = _session(tmp_path, *_signed_zero_pair(tmp_path))
    data = json.loads(session.read_text())
    data["session"]["captures"][0]["path"] = str(tmp_path / "n\x1b[2J\nPARITY.h5")
    session.write_text(json.dumps(data))
    assert _run("--session", str(session)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "\x1b" not in err and "n\\x1b[2J\\nPARITY.h5" in err


def test_a_report_piped_into_a_reader_that_stops_early_ends_without_a_traceback_its_json_written(tmp_path: Path) -> None:
    import subprocess
    import sys

    native, oracle = _signed_zero_pair(tmp_path)
    document = tmp_path / "report.json"
    document.write_text('{"verdict": "an earlier run\'s PARITY"}')
    child = subprocess.Popen(
        [sys.executable, "-m", "viewer.cli", "report", str(native), str(oracle), "--full", "--json", str(document)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stdout is not None
    child.stdout.close()  # as `| head -1` does once it has its line: the report's text meets a closed pipe
    _, err = child.communicate(timeout=120)
    assert (b"Traceback" in err, child.returncode) == (False, 141), err.decode()
    assert loads(document.read_text()).verdict.word == "SIGNED-ZERO-ONLY", "the documents are written before the text"


def test_a_sessions_per_op_tolerance_judges_that_op_and_says_so_and_an_unknown_op_is_refused(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    session = pair_session(native, oracle, "per-op")
    session.set_tolerance(SavedTolerance(max_ulp=1000), op="ffn_act")
    SessionDocument(session).save_as(tmp_path / "s.xray")
    assert _run(str(native), str(oracle), "--no-cache", "--json", str(tmp_path / "plain.json")) == 1
    assert _run("--session", str(tmp_path / "s.xray"), "--no-cache", "--json", str(tmp_path / "session.json")) == 1
    printed = capsys.readouterr().out
    assert f"tolerance  per-op rules from session {tmp_path / 's.xray'}; bit-exact where none applies" in printed
    plain_run, with_session = (loads((tmp_path / f"{name}.json").read_text()) for name in ("plain", "session"))
    assert plain_run.verdict.first is not None and plain_run.verdict.first.key.op == "ffn_act"
    assert with_session.verdict.first is not None and with_session.verdict.first.key.op == "ffn_down"
    assert next(p for p in with_session.pairs if p.key.text() == "0:text-before:0:ffn_act").verdict == "within-tolerance"
    document = json.loads((tmp_path / "s.xray").read_text())
    document["session"]["tolerances"]["per_op"] = {"ffn_actt": document["session"]["tolerances"]["per_op"]["ffn_act"]}
    (tmp_path / "s.xray").write_text(json.dumps(document))
    assert _run("--session", str(tmp_path / "s.xray")) == 2
    assert "/session/tolerances/per_op/ffn_actt: is not a canonical op (attn_norm," in capsys.readouterr().err


def test_a_report_on_a_newer_versions_session_names_what_this_version_did_not_read(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer version may store what changes its verdict (a rule this version has no key for): the report says it followed only what it reads."""
    path = _session(tmp_path, *demo_pairs["clean"])
    document = json.loads(path.read_text())
    document["schema_version"] = SCHEMA_VERSION + 1
    document["session"]["tolerances"]["per_segment"] = {"visual": {"max_ulp": 4}}
    path.write_text(json.dumps(document))
    assert _run("--session", str(path), "--no-cache") == 0
    assert capsys.readouterr().err == (
        f"parity-xray report: note: {path} was written by a newer Parity X-ray (session schema {SCHEMA_VERSION + 1}; this version writes "
        f"{SCHEMA_VERSION}); this version does not read what it stored at /session/tolerances/per_segment; this report follows what this version reads\n"
    )


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s["tolerances"].update(policy="missing.toml"), "/session/tolerances/policy: {folder}/missing.toml: cannot be read (No such file or directory)"),
        (lambda s: s["tolerances"].update(policy=""), "/session/tolerances/policy: is an empty path (null means no policy)"),
        (lambda s: s["captures"][0].update(profile="no-such-profile"), "/session/captures/0/profile: 'no-such-profile' is neither a built-in profile"),
    ],
)
def test_a_sessions_unusable_policy_or_profile_is_named_by_the_session_file_and_the_place_in_it(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, problem: str
) -> None:
    SessionDocument(pair_session(*demo_pairs["clean"], "damaged by hand")).save_as(tmp_path / "s.xray")
    document = json.loads((tmp_path / "s.xray").read_text())
    edit(document["session"])
    (tmp_path / "s.xray").write_text(json.dumps(document))
    assert _run("--session", str(tmp_path / "s.xray")) == 2
    assert capsys.readouterr().err.startswith(f"parity-xray report: unusable input: {tmp_path / 's.xray'}: {problem.format(folder=tmp_path)}")


def test_a_session_schema_version_no_release_writes_is_damage_and_is_not_quoted_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.xray").write_text('{"format": "parity-xray-session", "schema_version": ' + "9" * 4000 + "}")
    assert _run("--session", str(tmp_path / "s.xray")) == 2
    assert capsys.readouterr().err == (
        f"parity-xray report: unusable input: {tmp_path / 's.xray'}: /schema_version: 999999999999... (4000 digits) is no version a Parity X-ray writes: the file is damaged\n"
    )


def test_captures_given_in_swapped_order_are_warned_about_on_every_surface(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["clean"]
    assert _run(str(oracle), str(native), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")) == 0
    swapped = "the captures look swapped: the native one was recorded as the oracle and the oracle one as the native"
    assert swapped in capsys.readouterr().out
    assert any(w.startswith(swapped) for w in loads((tmp_path / "r.json").read_text()).provenance.warnings)
    assert swapped in (tmp_path / "r.html").read_text()
    assert _run(str(native), str(oracle), "--no-cache") == 0
    assert swapped not in capsys.readouterr().out


def test_one_file_given_as_both_sides_is_warned_about_and_an_equal_copy_is_not_even_from_the_cache(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oracle = demo_pairs["clean"][1]
    copy = Path(shutil.copy2(oracle, tmp_path / "copy.h5"))
    assert _run(str(oracle), str(oracle), "--json", str(tmp_path / "same.json")) == 0
    same = "SAME FILE: the native and the oracle are one file, so every op is bit-exact whatever it holds"
    assert capsys.readouterr().out.splitlines()[0] == f"WARNING: {same}"
    assert loads((tmp_path / "same.json").read_text()).provenance.warnings[0] == same
    assert _run(str(oracle), str(copy)) == 0
    assert same not in capsys.readouterr().out


def test_a_hand_written_relative_capture_path_is_the_session_folders_whatever_the_current_one(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "investigation"
    folder.mkdir()
    for path in demo_pairs["swiglu-order"]:
        shutil.copy2(path, folder / path.name)
    SessionDocument(pair_session(*(folder / p.name for p in demo_pairs["swiglu-order"]), "by hand")).save_as(folder / "s.xray")
    document = json.loads((folder / "s.xray").read_text())
    for capture in document["session"]["captures"]:
        capture["path"], capture["relative_path"] = Path(capture["path"]).name, None
    (folder / "s.xray").write_text(json.dumps(document))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _run("--session", str(folder / "s.xray")) == 1
    assert capsys.readouterr().out.startswith("DIVERGENCE: first diverged at 0:text-before:0:ffn_act")


def test_the_json_document_is_made_a_piece_at_a_time_with_one_item_per_line(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real model's 236 MB document was made whole before it was written: with its pieces,
    860 MB held at once. Written as it is made, each piece is at most `ITEMS_PER_PIECE` list items."""
    from sessions.capture.opening import open_capture
    from sessions.compare import document
    from sessions.compare.comparison import iter_compare
    from sessions.compare.document import json_pieces
    from sessions.progress import run_to_end

    native, oracle = demo_pairs["swiglu-order"]
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o))
    monkeypatch.setattr(document, "ITEMS_PER_PIECE", 3)
    pieces = list(json_pieces(comparison))
    text = "".join(pieces)
    assert len(comparison.pairs) > 10 and len(pieces) > len(comparison.pairs) / 3
    assert max(piece.count('{"key": ') for piece in pieces) == 3, "no piece holds more than three pairs"
    lines = text.splitlines()
    first = lines.index(' "pairs": [') + 1
    last = next(at for at in range(first, len(lines)) if lines[at].startswith(" ]"))
    assert last - first == len(comparison.pairs), "one pair per line"
    assert lines[0] == "{" and lines[1].startswith(' "format": ') and lines[-1] == "}"
    assert _run(str(native), str(oracle), "--json", str(tmp_path / "r.json")) == 1
    assert (tmp_path / "r.json").read_text() == text
    assert json.loads(text)["pairs"][0]["key"] == comparison.pairs[0].key.text()


def test_a_step_whose_token_only_one_run_marks_as_a_stop_says_so_on_every_surface_and_suggests_no_rerun(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    # post-eos's native stops at step 3 with token 148; clean's oracle emits 148 there and goes on.
    native, oracle = demo_pairs["post-eos"][0], demo_pairs["clean"][1]
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    assert _run(str(native), str(oracle), "--json", str(out_json), "--html", str(out_html)) == 1
    detail = "token 148 on both sides, a stop only in the native run"
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"DIVERGENCE: first tokens at 3:decode:-1:logits ({detail})", f"  - the token steps differ from step 3 ({detail})"]
    assert "First finding: tokens at 3:decode:-1:logits" in lines, "no rerun or diagnose of logits that are bit-exact"
    verdict = json.loads(out_json.read_text())["verdict"]
    assert verdict["headline"] == lines[0] and verdict["reasons"] == [f"the token steps differ from step 3 ({detail})"]
    assert detail in out_html.read_text()


@pytest.mark.parametrize(
    ("native_prompt", "oracle_prompt", "said", "warned"),
    [
        ("", "", "prompt not recorded", None),
        ("p", "", "prompt recorded by the native capture only", "prompt recorded by the native capture only; the same request cannot be confirmed"),
        ("p", "p", "same prompt and seed", None),
        ("p", "q", "prompt differs", "prompt differs between the runs: they did not compute the same request"),
    ],
)
def test_the_provenance_line_says_same_prompt_only_when_both_captures_recorded_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], native_prompt: str, oracle_prompt: str, said: str, warned: str | None
) -> None:
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", x, layer=0, dtype="bfloat16")], prompt=native_prompt)
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")], prompt=oracle_prompt)
    out_json = tmp_path / "r.json"
    _run(str(native), str(oracle), "--json", str(out_json))
    text = capsys.readouterr().out
    assert f"provenance same weights; {said}; " in text
    warnings = json.loads(out_json.read_text())["provenance"]["warnings"]
    assert warnings == ([] if warned is None else [warned])


@pytest.mark.parametrize(("attribute", "value", "shown"), [("engine_name", "eng\u2028PARITY: forged", "\\u2028"), ("weights_hash", "sha256:a\u200ba", "\\u200b")])
def test_a_line_separator_or_zero_width_space_in_an_engine_name_or_hash_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attribute: str, value: str, shown: str
) -> None:
    # Printed raw, U+2028 forged a line in a log viewer, and a zero-width space made two hashes
    # that look alike a WEIGHTS HASH MISMATCH: such a character is refused as a control is.
    x = bf16_bits(np.linspace(-2, 2, 24).reshape(4, 6))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", x, layer=0, dtype="bfloat16")], **{attribute: value})
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")])
    assert _run(str(native), str(oracle)) == 2
    err = capsys.readouterr().err
    assert err == f"parity-xray report: unusable input: {native}: / attribute '{attribute}': holds a control character ({shown} in '{printable(value)}')\n"


def test_runs_cut_differently_and_paired_by_calls_suggest_commands_that_pair_them_the_same_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under `auto` such runs pair by position, and `rerun`/`diagnose --op KEY` as printed refused a
    # key made by calls ("not an aligned op of this comparison").
    rows = bf16_bits(np.linspace(-2, 2, 5 * 8).reshape(5, 8))
    decode = bf16_bits(np.linspace(-1, 1, 8).reshape(1, 8))
    moved = decode.copy()
    moved[0, 3] ^= 1
    native = write_capture(tmp_path / "n.h5", "native", [
        T("layer_out", rows[:3], segment="text-before", layer=0, dtype="bfloat16", position=0),
        T("layer_out", rows[3:], segment="text-after", layer=0, dtype="bfloat16", position=3),
        T("layer_out", moved, step=1, segment="decode", layer=0, dtype="bfloat16", position=5),
    ], [(0, 7, False), (1, 8, False)])  # fmt: skip
    oracle = write_capture(tmp_path / "o.h5", "oracle", [
        T("layer_out", rows, segment="prefill", layer=0, dtype="bfloat16", position=0),
        T("layer_out", decode, step=1, segment="decode", layer=0, dtype="bfloat16", position=5),
    ], [(0, 7, False), (1, 8, False)])  # fmt: skip
    assert _run(str(native), str(oracle), "--align", "calls") == 1
    lines = capsys.readouterr().out.splitlines()
    assert "First finding: diverged at 1:decode:0:layer_out  (rerun --op 1:decode:0:layer_out --align calls, diagnose --op 1:decode:0:layer_out --align calls)" in lines
    assert _run(str(native), str(oracle)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "First finding: diverged at 1:decode:0:layer_out@5  (rerun --op 1:decode:0:layer_out@5 --align positions, diagnose --op 1:decode:0:layer_out@5 --align positions)" in lines
    from sessions.compare.comparison import no_dispatch_difference

    document = tmp_path / "r.json"
    assert _run(str(native), str(oracle), "--align", "calls", "--json", str(document)) == 1
    said = "no differences among the ops paired by calls; the runs were cut differently, and the calls of records without a partner are not compared"
    assert no_dispatch_difference(loads(document.read_text())) == said, "the prefills' calls were never compared"


def test_full_lists_every_record_without_a_partner_instead_of_fifty_and_a_pointer_to_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = bf16_bits(np.linspace(-2, 2, 8).reshape(1, 8))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", x, layer=layer, dtype="bfloat16") for layer in range(60)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", x, layer=0, dtype="bfloat16")])
    assert _run(str(native), str(oracle), "--full") == 1
    text = capsys.readouterr().out
    listed = text.split("\nUnaligned records")[1].split("\n\n")[0].splitlines()[1:]
    assert len(listed) == 59 and all("no oracle record for" in line for line in listed) and "more (all are in the JSON" not in text
    html = tmp_path / "r.html"
    assert _run(str(native), str(oracle), "--html", str(html)) == 1
    assert "  ... 54 more (all are in the JSON report and with --full)" in capsys.readouterr().out.splitlines()
    page = html.read_text()
    assert "<h2>Unaligned records (59, plus 0 post-EOS: invalid, not failures)</h2>" in page and page.count("no oracle record for") == 59 + 2  # and the headline and the first finding


def test_a_p99_ulp_error_reads_in_three_significant_digits_grouped_below_a_million_and_in_powers_of_ten_past_it() -> None:
    from sessions.report.text import ulp_error_figure

    assert [ulp_error_figure(v) for v in (0.5, 49.4, 98.7, 999.5, 29937.0, 1e20)] == ["0.5", "49.4", "98.7", "1,000", "29,900", "1e+20"]


def test_more_report_workers_than_the_cores_can_run_is_refused_before_any_is_started(
    demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """40 worker processes on 2 cores took 17 s for a pair 2 compared in 2.8 s."""
    native, oracle = demo_pairs["signed-zero"]
    too_many = WORKERS_PER_CORE * usable_cores() + 1
    assert _run(str(native), str(oracle), "--workers", str(too_many)) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err == (
        f"parity-xray report: --workers {too_many} is more than {WORKERS_PER_CORE} per core here ({usable_cores()} cores): the processes would only take turns on them\n"
    )
