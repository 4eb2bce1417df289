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
