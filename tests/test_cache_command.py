"""`parity-xray cache` and `doctor` name the folder the caches are really in, and say when it cannot be one."""

from __future__ import annotations

from pathlib import Path

import pytest

from viewer.cli import main
from viewer.doctor.checks import check_caches


def test_a_cache_dir_that_is_a_file_is_named_as_not_a_folder_and_nothing_is_claimed_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "cache"
    root.write_text("someone's file\n")
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(root))
    for argv in (["cache"], ["cache", "--clear"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"cache: {root} ($PARITY_XRAY_CACHE_DIR) is not a folder, so nothing is cached; point PARITY_XRAY_CACHE_DIR at a folder, or unset it\n"
        )
    assert root.read_text() == "someone's file\n"


def test_a_file_where_a_folder_above_the_cache_should_be_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    user_cache = tmp_path / "cache-home"
    user_cache.write_text("not a folder\n")
    monkeypatch.delenv("PARITY_XRAY_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(user_cache))
    assert main(["cache", "--clear"]) == 2
    assert capsys.readouterr().err == (
        f"cache: {user_cache / 'parity-xray'} (user cache directory) cannot be made: {user_cache} is not a folder, "
        "so nothing is cached; point PARITY_XRAY_CACHE_DIR at a folder, or unset it\n"
    )


def test_doctor_names_the_cache_dir_as_where_comparisons_go_and_the_user_cache_as_where_demos_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    details = [finding.detail for finding in check_caches()]
    assert details[:2] == [f"{tmp_path / 'cache'} (structure checks, comparisons, gate cases)", f"{tmp_path / 'user' / 'parity-xray'} (demo captures)"]
