"""`parity-xray record llama|mlx` on the command line: records, refuses bad input with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from backends.commands import record as record_command  # noqa: E402
from backends.demo.llama_pairs import demo_weights_f32  # noqa: E402
from backends.engines.gguf_export import export_gguf  # noqa: E402
from backends.recorders.left_behind import left_at  # noqa: E402
from sessions.capture.opening import open_capture  # noqa: E402
from tests.side_files import fifo_without_writer  # noqa: E402
from tests.test_llama_recorder import TINY  # noqa: E402
from viewer.cli import build_parser, main  # noqa: E402


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_gguf(TINY.as_dict(), demo_weights_f32(TINY, 1), tmp_path_factory.mktemp("m") / "tiny.bf16.gguf", "bf16")


def _run(argv: list[str]) -> int:
    return record_command.run(build_parser().parse_args(argv))


def test_record_llama_writes_the_capture_with_its_settings(gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.h5"
    argv = ["record", "llama", str(gguf), "--tokens", "1,2,3", "--decode-steps", "1", "--ubatch", "2", "--kv-type", "f16", "--whole-cache", "--out", str(out)]
    assert _run(argv) == record_command.EXIT_OK
    with open_capture(out, check_in_child=False) as capture:
        assert capture.meta.role == "native"
        assert capture.meta.provenance["parity_settings"]["kv_type"] == "f16"
        assert capture.meta.provenance["parity_settings"]["whole_cache"] is True
        assert {r.shape for r in capture.records if r.name == "cache_k_l0 (view)" and r.kernel_id == "SET_ROWS"} == {(256, 64)}
        assert sorted({r.segment for r in capture.records}) == ["decode", "prefill.0", "prefill.1"]


def test_an_existing_output_is_refused_unless_forced(gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.h5"
    out.write_bytes(b"keep me")
    argv = ["record", "llama", str(gguf), "--tokens", "1", "--out", str(out)]
    assert _run(argv) == record_command.EXIT_REFUSED
    assert out.read_bytes() == b"keep me"
    assert "already exists" in capsys.readouterr().err
    assert _run([*argv, "--force"]) == record_command.EXIT_OK


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["record", "llama", "absent.gguf", "--tokens", "1,x"], "token id 'x' is not an integer"),
        (["record", "llama", "absent.gguf", "--tokens", "1"], "absent.gguf: no such GGUF file"),
        (["record", "mlx", "absent-dir", "--tokens", "1"], "absent-dir: not a directory"),
        (["record", "llama", "GGUF", "--tokens", "1,96"], "token id 96 is outside tiny.bf16.gguf's vocabulary (96 ids)"),
        (["record", "llama", "GGUF", "--tokens", "1", "--batch", "2", "--batch-row", "2"], "row 2 is not a row of a batch of 2"),
        (["record", "llama", "GGUF", "--tokens", "1", "--batch", "0"], "a batch holds at least 1 request, not 0"),
        (["record", "llama", "GGUF", "--tokens", "1,2,3", "--feed-last", "-1"], "--feed-last -1: the count of prompt tokens fed one by one must be >= 0"),
        (
            ["record", "llama", "GGUF", "--tokens", "1,2,3,4", "--segments", "abcdefghijklmnop=4", "--ubatch", "2"],
            "segment 'abcdefghijklmnop.0' is longer than the capture's 16-byte segment field: a call longer than the micro-batch size 2 "
            "is recorded as NAME.0, NAME.1, ...; give it a shorter name",
        ),
        (["record", "llama", "GGUF", "--tokens", "1", "--threads", "0"], "--threads must be from 1 to 1024, not 0"),
        (["record", "llama", "GGUF", "--tokens", "1", "--threads", "100000"], "--threads must be from 1 to 1024, not 100000"),
        (["record", "llama", "evil\x1b[2J.gguf", "--tokens", "1"], "evil\\x1b[2J.gguf: no such GGUF file"),
        (["record", "llama", ".", "--tokens", "1"], ".: a directory, not a GGUF file"),
        (["record", "llama", "GGUF", "--tokens", "1", "--decode-steps", "4096"], "the run needs 4097 positions (prompt 1, decode steps 4096), more than the model's context of 4096 (the GGUF's context_length)"),
        (["record", "llama", "GGUF", "--tokens", "1,2", "--batch", "10000000000"], "a batch of 10000000000, 2 positions each, needs at least 26226.0 GiB at once (KV cache 19073.5 GiB, logits 7152.6 GiB)"),
        (["record", "llama", "GGUF", "--tokens", "1", "--batch", "300"], "llama_init_from_model: failed to initialize the context: n_seq_max must be <= 256"),
    ],
)
def test_bad_input_is_refused_with_exit_2(
    gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "x.h5"
    assert _run([str(gguf) if a == "GGUF" else a for a in argv] + ["--out", str(out)]) == record_command.EXIT_REFUSED
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_without_llama_cpp_python_the_refusal_names_the_command_that_builds_it(
    gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "No module named llama_cpp", after "starting llama.cpp"."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what importlib finds where it is not installed
    assert _run(["record", "llama", str(gguf), "--tokens", "1", "--out", str(tmp_path / "x.h5")]) == record_command.EXIT_REFUSED
    said = capsys.readouterr()
    assert said.err == f"record refused: llama-cpp-python is not installed here: {record_command.INSTALL_LLAMA}\n" and said.out == ""


def test_a_truncated_gguf_is_refused_with_llama_cpps_own_reason(gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    assert _run(["record", "llama", str(truncated), "--tokens", "1", "--out", str(tmp_path / "x.h5")]) == record_command.EXIT_REFUSED
    out = capsys.readouterr().err
    assert f"record refused: {truncated}: llama.cpp could not load the model: llama_model_load: error loading model: " in out
    assert "is corrupted or incomplete" in out


def test_a_fifo_given_as_the_gguf_is_named_as_what_it_is_without_waiting_for_a_writer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fifo_without_writer(tmp_path, "model.gguf") as fifo:
        assert _run(["record", "llama", str(fifo), "--tokens", "1", "--out", str(tmp_path / "x.h5")]) == record_command.EXIT_REFUSED
    assert f"{fifo}: a FIFO, not a GGUF file" in capsys.readouterr().err


def test_a_request_recorded_as_a_row_of_a_batch_reports_against_itself_alone(
    gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone, batched, report = tmp_path / "alone.h5", tmp_path / "batch.h5", tmp_path / "report.json"
    run = ["record", "llama", str(gguf), "--tokens", "5,17,3,88,41", "--decode-steps", "2"]
    assert _run([*run, "--out", str(alone)]) == record_command.EXIT_OK
    assert _run([*run, "--batch", "3", "--batch-row", "1", "--out", str(batched)]) == record_command.EXIT_OK
    assert main(["validate", str(batched)]) == 0
    with open_capture(batched) as capture:
        assert (capture.meta.batch_size, capture.meta.batch_row, capture.meta.batch_stacked) == (3, 1, True)
        assert {r.shape for r in capture.records if r.name == "l_out-0"} == {(3, 5, 64), (3, 1, 64)}
    capsys.readouterr()
    assert main(["report", str(alone), str(batched), "--json", str(report)]) == 1
    text, document = capsys.readouterr().out, json.loads(report.read_text())
    verdict = document["verdict"]
    assert verdict["headline"].startswith("DIVERGENCE: first diverged at 1:decode:0:q_proj")
    assert text.startswith(verdict["headline"] + "\n")
    assert "alignment  by the same calls (oracle is row 1 of a batch of 3)" in text
    assert document["alignment"]["oracle_batch"] == "row 1 of a batch of 3"
    prefill = [p for p in document["pairs"] if p["key"].startswith("0:")]
    assert len(prefill) == 56 and {p["verdict"] for p in prefill} == {"bit-exact"}, "26 ops a layer (llama.cpp records every stage), twice, and 4 outside"
    cells = [p for p in prefill if p["key"].endswith("_cache")]
    assert [(p["key"], p["oracle_name"]) for p in cells][:2] == [("0:prefill:0:k_cache", "cache_k_l0 (reshaped) (view) (written)"), ("0:prefill:0:v_cache", "cache_v_l0 (reshaped) (view) (written)")]
    assert {u["reason"] for u in document["unaligned"]} == {"one_sided"}
    assert document["dispatch_differences"] == [], "each side's attention batch is the batch its capture declares"
    assert "step 1: match" in text and "step 2: match" in text


def test_an_interrupted_recording_says_what_it_left_at_its_output(tmp_path: Path) -> None:
    """Stopped before its first step, a run claimed its output held the steps written so far: there
    was none, or (`--force`) the old capture, still complete."""
    from sessions.side_file import disk_stamp

    out = tmp_path / "x.h5"
    assert left_at(out, None) == f"nothing was written to {out} (the run stopped before its first step)"
    out.write_bytes(b"an earlier capture")
    before = disk_stamp(out)
    assert left_at(out, before) == f"{out} is as it was (the run stopped before its first step)"
    out.unlink()
    out.write_bytes(b"the first steps of this run")
    assert left_at(out, before).endswith("holds the steps written so far and reads as incomplete (parity-xray validate names them)")


def test_a_recording_out_of_room_says_so_as_a_recording_of_mlx_does(gguf: Path, tmp_path: Path) -> None:
    """The llama.cpp child's full disk reached the command as "record refused", MLX's as "record failed"."""
    import resource

    from sessions.child_env import PROJECT_ROOT, child_env

    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, 20 * 1024))

    out = tmp_path / "x.h5"
    command = [sys.executable, "-m", "viewer.cli", "record", "llama", str(gguf), "--tokens", "1,2,3", "--out", str(out)]
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=child_env(), capture_output=True, text=True, timeout=300, preexec_fn=no_room, check=False)
    assert done.returncode == record_command.EXIT_REFUSED
    assert done.stderr.startswith(f"record failed: {out}: cannot be written (no room left for it: "), done.stderr[-500:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a process's children from /proc")
def test_a_recording_killed_with_minus_9_leaves_nothing_in_the_temporary_folder(gguf: Path, tmp_path: Path) -> None:
    """The llama.cpp child handed its logits back through a scratch folder, which a `kill -9` of
    `record` left behind, one more each time."""
    from sessions.child_env import PROJECT_ROOT, child_env

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    command = [sys.executable, "-m", "viewer.cli", "record", "llama", str(gguf), "--tokens", "1,2,3", "--decode-steps", "50", "--out", str(tmp_path / "x.h5")]
    with subprocess.Popen(command, cwd=PROJECT_ROOT, env={**child_env(), "TMPDIR": str(temporary)}, stderr=subprocess.DEVNULL) as record:
        children = Path(f"/proc/{record.pid}/task/{record.pid}/children")
        deadline = time.monotonic() + 60
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)
        [llama] = map(int, children.read_text().split())
        record.kill()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{llama}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(temporary.iterdir()) == []


def test_a_recording_started_with_standard_input_closed_gets_its_logits_back(gguf: Path, tmp_path: Path) -> None:
    """The logits' file took descriptor 0 left free, and in the child the stdin pipe replaced it:
    "the llama.cpp process failed (... Bad file descriptor)" from a launcher that closes stdin."""
    from sessions.child_env import PROJECT_ROOT, child_env

    out = tmp_path / "x.h5"
    command = [sys.executable, "-m", "viewer.cli", "record", "llama", str(gguf), "--tokens", "1,2,3", "--decode-steps", "2", "--out", str(out)]
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=child_env(), capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(0), check=False)
    assert done.returncode == record_command.EXIT_OK, done.stderr[-500:]
    with open_capture(out, check_in_child=False) as capture:
        assert capture.complete and sorted({r.step for r in capture.records}) == [0, 1, 2]
