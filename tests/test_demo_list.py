"""`demo --list` says what each demo pair must show, where the files are, and how to open one."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.engines.demo_scenarios import SCENARIOS
from viewer.cli import main


def test_demo_list_names_each_verdict_the_folder_and_how_to_open_a_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["demo", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Demo scenarios; their captures live in {tmp_path / 'parity-xray' / 'demo'} (written on first use).")
    for name, scenario in SCENARIOS.items():
        assert f"{name:20s} {scenario.expected.word}" in out
    assert "attention-contract   CONTRACT MISMATCH, first contract-mismatch at 0:visual:0:sdpa (not generated yet)" in out
    assert "llama-vs-mlx-q8_0    GGUF q8_0 weights" in out
    assert "Open one with `parity-xray demo --scenario NAME`" in out


def test_demo_generate_into_a_file_or_an_unwritable_place_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.write_text("keep\n")
    assert main(["demo", "--generate", str(taken)]) == 2
    assert capsys.readouterr().err == f"parity-xray demo: --generate {taken} is not a folder\n"
    assert main(["demo", "--generate", str(taken / "sub")]) == 2
    assert capsys.readouterr().err == f"parity-xray demo: cannot write the demo captures into {taken / 'sub'} (Not a directory)\n"
    assert taken.read_text() == "keep\n"


def test_demo_generate_never_writes_over_a_link_and_list_with_generate_is_refused_not_half_done(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written by rename, the demo replaced a link to the user's capture with a file of its own;
    `--list --generate DIR` listed and quietly wrote nothing."""
    mine = tmp_path / "mine.h5"
    mine.write_text("the user's capture\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "clean.oracle.h5").symlink_to(mine)
    assert main(["demo", "--generate", str(out), "--scenario", "clean"]) == 2
    assert capsys.readouterr().err == (
        f"parity-xray demo: {out / 'clean.oracle.h5'} is a link; the demo writes its own file there: move it, or give --generate another folder\n"
    )
    assert (out / "clean.oracle.h5").is_symlink() and mine.read_text() == "the user's capture\n"
    assert sorted(p.name for p in out.iterdir()) == ["clean.oracle.h5"], "nothing written"
    assert main(["demo", "--list", "--generate", str(tmp_path / "listed")]) == 2
    assert "--list only lists the scenarios, it writes nothing" in capsys.readouterr().err


@pytest.mark.parametrize(("seed", "problem"), [("-1", "must be a whole number >= 0, not -1"), (str(2**63), f"must be a whole number <= {2**63 - 1}, not {2**63}")])
def test_a_seed_no_capture_can_hold_is_refused_as_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: str, problem: str) -> None:
    """A negative seed failed in numpy and one past 64 bits in the writer, each with a traceback."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--generate", str(tmp_path), "--seed", seed])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"parity-xray demo: error: argument --seed: {problem} (`parity-xray demo --help` lists the options)\n"
    assert list(tmp_path.iterdir()) == []


def test_each_seed_has_a_folder_of_its_own_so_no_seed_opens_another_seeds_captures(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --seed 7` opened the seed-0 captures already in the cache, and a later plain `demo`
    opened seed 7's: the folder did not depend on the seed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["demo", "--list", "--seed", "7"]) == 0
    assert capsys.readouterr().out.startswith(f"Demo scenarios; their captures live in {tmp_path / 'parity-xray' / 'demo' / 'seed-7'} (written on first use).")
    assert main(["demo", "--list"]) == 0
    assert capsys.readouterr().out.startswith(f"Demo scenarios; their captures live in {tmp_path / 'parity-xray' / 'demo'} (written on first use).")


def test_opening_the_viewer_on_two_scenarios_is_refused_rather_than_opening_the_first(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["demo", "--scenario", "clean", "--scenario", "swiglu-order"]) == 2
    assert capsys.readouterr().err == "parity-xray demo: the viewer opens one scenario; repeat --scenario only with --generate DIR\n"
    assert not (tmp_path / "parity-xray" / "demo").exists()
