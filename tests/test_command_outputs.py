"""Where a headless command writes: a standard output that cannot be written, and output paths
that cannot hold a file, are one line and exit 2 -- never a traceback, and never a device or pipe
replaced by a file (`--json /dev/null` run as root replaced the device)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.atomic_write import atomic_write_bytes
from sessions.child_env import PROJECT_ROOT, child_env
from viewer.cli import main

LONG_NAME = "a" * 300 + ".h5"
"""A file name longer than any file system allows (255 bytes)."""


def _command(argv: list[str], **streams: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "viewer.cli", *argv], cwd=PROJECT_ROOT, env=child_env(), text=True, timeout=120, **streams)  # type: ignore[call-overload]


def test_a_report_whose_standard_output_is_full_says_so_in_one_line_and_exits_2(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    with open("/dev/full", "w") as full:
        done = _command(["report", str(native), str(oracle)], stdout=full, stderr=subprocess.PIPE)
    assert (done.returncode, done.stderr) == (2, "parity-xray report: cannot write to standard output: No space left on device\n")


def test_a_full_standard_output_removes_the_earlier_runs_document_and_a_full_standard_error_keeps_the_exit_status(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The report exits 2 without writing its document: the earlier run's PARITY stayed. And an
    unusable input said on a full standard error exited 1 (a divergence to CI) with a traceback."""
    native, oracle = demo_pairs["swiglu-order"]
    out = tmp_path / "out.json"
    assert main(["report", "--no-cache", *map(str, demo_pairs["post-eos"]), "--json", str(out)]) == 0
    with open("/dev/full", "w") as full:
        done = _command(["report", str(native), str(oracle), "--json", str(out)], stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 2 and not out.exists()
    with open("/dev/full", "w") as full:
        done = _command(["report", str(native), str(oracle), "--tolerance-policy", str(tmp_path / "missing.toml")], stdout=subprocess.PIPE, stderr=full)
    assert (done.returncode, done.stdout) == (2, "")


def test_a_report_started_with_standard_output_closed_still_exits_with_its_verdict(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    command = f'exec "{sys.executable}" -m viewer.cli report "{native}" "{oracle}" >&-'  # the shell closes descriptor 1
    done = subprocess.run(["sh", "-c", command], cwd=PROJECT_ROOT, env=child_env(), text=True, timeout=120, stderr=subprocess.PIPE)
    assert (done.returncode, done.stderr) == (1, "")


@pytest.mark.parametrize("target", ["symlink to /dev/null", "FIFO"])
def test_an_output_path_that_is_a_device_or_pipe_is_refused_before_the_work_and_left_as_it_is(
    target: str, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["swiglu-order"]
    out = tmp_path / "out.json"
    if target == "FIFO":
        os.mkfifo(out)
        kind = "a FIFO"
    else:
        out.symlink_to("/dev/null")
        kind = "a character device"
    assert main(["report", str(native), str(oracle), "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"parity-xray report: --json {out} is {kind}, not a regular file; an output only ever replaces a file\n"
    assert captured.out == "", "refused before the comparison"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert out.is_symlink() if target != "FIFO" else stat.S_ISFIFO(out.stat().st_mode)


@pytest.mark.parametrize("leads_to", ["nothing", "a file"])
def test_an_output_path_that_is_a_link_is_refused_before_the_work_and_left_as_it_is(
    leads_to: str, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The atomic write would replace the link itself with a file, never writing where it leads."""
    native, oracle = demo_pairs["swiglu-order"]
    target = tmp_path / "reports" / "out.json"
    if leads_to == "a file":
        target.parent.mkdir()
        target.write_text("last run's report")
    out = tmp_path / "out.json"
    out.symlink_to(target)
    assert main(["report", str(native), str(oracle), "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"parity-xray report: --json {out} is a symbolic link to {target}; an output would replace the link, not write where it leads, "
        "so name the file itself\n"
    )
    assert captured.out == "" and out.is_symlink()
    assert not target.exists() if leads_to == "nothing" else target.read_text() == "last run's report"


def test_a_file_name_too_long_for_the_file_system_is_one_line_for_every_command_that_takes_a_path(
    demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = map(str, demo_pairs["swiglu-order"])
    long = str(tmp_path / LONG_NAME)
    assert main(["report", native, long]) == 2
    assert capsys.readouterr().err == f"parity-xray report: cannot use {long}: File name too long\n"
    assert main(["report", native, oracle, "--json", long]) == 2
    assert capsys.readouterr().err == f"parity-xray report: --json {long} cannot be written (File name too long)\n"
    assert main(["validate", long, native]) == 2
    assert capsys.readouterr().out.splitlines()[:2] == [f"{long}: invalid (1 problem)", "  file: cannot be read (File name too long)"]


def test_outputs_are_written_with_the_permissions_the_umask_gives(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "report.json", b"{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "report.json").stat().st_mode & 0o777 == 0o640


def test_control_characters_in_the_paths_a_command_prints_are_escaped(demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A capture named by someone else (a gate manifest, a session) may hold terminal escapes."""
    native = tmp_path / "evil\x1b[2J\nPARITY.native.h5"
    native.write_bytes(demo_pairs["swiglu-order"][0].read_bytes())
    oracle = str(demo_pairs["swiglu-order"][1])
    assert main(["report", str(native), oracle]) == 1
    header = capsys.readouterr().out.splitlines()
    assert f"native     {tmp_path}/evil\\x1b[2J\\nPARITY.native.h5 [profile llama.cpp]" in header
    assert main(["validate", str(native)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}/evil\\x1b[2J\\nPARITY.native.h5: valid (")


def test_the_top_level_help_says_how_to_open_the_viewer_as_well_as_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    """`parity-xray --help` listed only the commands: nothing said that a pair of captures, a
    session or a gate's JSON opens the window, nor that --settings exists."""
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "without a command, the viewer opens:" in out
    for form in ("parity-xray NATIVE ORACLE", "parity-xray [open] FILE.xray", "parity-xray GATE.json", "--settings FILE.ini"):
        assert form in out
    assert "report" in out and "doctor" in out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["report", "a.h5", "b.h5", "--top", "x"], "parity-xray report: error: argument --top: 'x' is not a whole number"),
        (["report", "a.h5", "b.h5", "--nosuch"], "parity-xray report: error: unrecognized arguments: --nosuch"),
        (["gate"], "parity-xray gate: error: the following arguments are required: manifest"),
    ],
)
def test_a_mistyped_option_is_refused_in_one_line_that_names_the_command(capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    """argparse printed the whole usage block above the error: nine lines for `report --top x`,
    and an unknown option was blamed on `parity-xray`, not on the command it was given to."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    command = " ".join(line.split(":")[0].split()[:2])
    assert capsys.readouterr().err == f"{line} (`{command} --help` lists the options)\n"


def test_an_output_made_in_pieces_is_written_a_batch_at_a_time_and_holds_every_piece_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real model's `--json` is 480,000 pieces: a write each cost a sixth of the command."""
    from sessions.commands import arguments

    monkeypatch.setattr(arguments, "WRITE_CHARACTERS", 10)
    pieces = [f"piece {n} ü\n" for n in range(25)]
    batches = list(arguments._utf8(lambda: iter(pieces)))
    assert len(batches) == 25 and all(batch.count(b"piece") == 1 for batch in batches), "each piece is past the batch size alone"
    monkeypatch.setattr(arguments, "WRITE_CHARACTERS", 40)
    batches = list(arguments._utf8(lambda: iter(pieces)))
    assert [batch.count(b"piece") for batch in batches] == [4] * 6 + [1]
    assert arguments.write_outputs([(str(tmp_path / "out.txt"), lambda: iter(pieces))]) is None
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(pieces)
