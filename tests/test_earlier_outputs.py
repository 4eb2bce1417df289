"""A command that ends unusable (exit 2) leaves no document of an earlier run at its output paths.

A CI step that runs `diagnose`, `rerun` or `gate` with `--json` and reads the file afterwards
took the last run's PARITY (exit 0) for this run's, whose input was missing. `report` already
removed them; every command now does, through one helper, and never removes a file that is not
such a document (a weights file given as `--json` by mistake).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from viewer.cli import main

ATTENTION = "0:visual:0:sdpa"


def _commands(native: Path, oracle: Path, manifest: Path) -> dict[str, list[str]]:
    return {
        "diagnose": ["diagnose", str(native), str(oracle), "--op", ATTENTION],
        "rerun": ["rerun", str(native), str(oracle), "--op", ATTENTION],
        "gate": ["gate", str(manifest), "--workers", "1"],
    }


@pytest.mark.parametrize("command", ["diagnose", "rerun", "gate"])
def test_an_unusable_run_removes_the_json_an_earlier_run_wrote_at_its_path(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["attention-contract"]
    manifest = tmp_path / "gate.toml"
    manifest.write_text(f'[[case]]\nname = "attention"\nnative = "{native}"\noracle = "{oracle}"\n')
    out = tmp_path / "out.json"
    assert main([*_commands(native, oracle, manifest)[command], "--json", str(out)]) in (0, 1)
    assert isinstance(json.loads(out.read_text()), dict)
    capsys.readouterr()
    missing = tmp_path / "missing.h5"
    broken = _commands(missing, oracle, tmp_path / "missing.toml")[command]
    assert main([*broken, "--json", str(out)]) == 2
    assert "missing." in capsys.readouterr().err  # the missing capture, or the missing manifest
    assert not out.exists(), f"{command}: a CI step must not read the earlier run's result as this one's"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "),
        ("config.json", b'{\n "architectures": ["Qwen3ForCausalLM"],\n "format": "not ours"\n}\n'),
    ],
)
def test_a_file_that_is_no_document_of_ours_is_never_removed_by_an_unusable_run(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], name: str, content: bytes
) -> None:
    # A command stopped before it knew every input (the weights file a capture names): a file of
    # the model's given as --json by mistake must survive the unusable run.
    _, oracle = demo_pairs["attention-contract"]
    mistaken = tmp_path / name
    mistaken.write_bytes(content)
    assert main(["diagnose", str(tmp_path / "missing.h5"), str(oracle), "--json", str(mistaken)]) == 2
    assert mistaken.read_bytes() == content


@pytest.mark.parametrize("option", ["--json", "--html"])
def test_an_output_path_ending_in_a_separator_is_refused_as_a_folder_instead_of_written_as_a_file(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    native, oracle = demo_pairs["clean"]
    assert main(["report", str(native), str(oracle), option, f"{tmp_path / 'out'}/"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{option} {tmp_path / 'out'}/ ends in a separator, so it names a folder; name a file")
    assert not (tmp_path / "out").exists()


def test_a_run_refused_at_its_options_or_its_standard_output_removes_the_earlier_document_too(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad option (argparse's exit 2) or a full standard output left the earlier run's
    PARITY where this run was told to write."""
    native, oracle = demo_pairs["post-eos"]
    out = tmp_path / "out.json"
    for refused in (["--max-ulp", "1.5", "--json", str(out)], [f"--json={out}", "--workers", "x"]):
        assert main(["report", "--no-cache", str(native), str(oracle), "--json", str(out)]) == 0 and out.exists()
        with pytest.raises(SystemExit) as exited:
            main(["report", str(native), str(oracle), *refused])
        assert exited.value.code == 2 and not out.exists()
    capsys.readouterr()
    assert main(["report", "--no-cache", str(native), str(oracle), "--json", str(out)]) == 0
    mistaken = tmp_path / "report.json"  # a document of ours typed as an input word is kept
    mistaken.write_text(out.read_text())
    with pytest.raises(SystemExit):
        main(["report", str(mistaken), str(oracle), "--json", str(out), "--top", "x"])
    assert not out.exists() and mistaken.exists()


@pytest.mark.parametrize("option", ["--tolerance-policy", "--native-profile", "--json", "--session"])
def test_an_empty_path_is_refused_where_it_is_typed_not_read_as_no_file(
    demo_pairs: dict[str, tuple[Path, Path]], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tolerance-policy "$POLICY"` with POLICY unset compared without the policy: a failing pair passed."""
    native, oracle = demo_pairs["signed-zero"]
    with pytest.raises(SystemExit) as exited:
        main(["report", str(native), str(oracle), option, ""])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"parity-xray report: error: argument {option}: is empty (an unset variable?)")
