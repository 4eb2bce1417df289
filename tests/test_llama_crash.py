"""llama.cpp never takes the caller down: a crash in its child process becomes a message that
names the signal, where it happened, and what to do. The crashes are real: an illegal
instruction and a bad read inside ggml just before the first llama_decode, and a GGUF whose
metadata makes ggml fail a GGML_ASSERT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from backends.commands import record as record_command  # noqa: E402
from backends.demo.llama_pairs import demo_weights_f32  # noqa: E402
from backends.engines.gguf_export import export_gguf  # noqa: E402
from backends.recorders.llama_cpu import REBUILD_COMMAND  # noqa: E402
from backends.recorders.llama_process import (  # noqa: E402
    FAULT_ENV,
    LlamaCrashed,
    iter_record_llama,
    plain_logits,
)
from backends.recorders.record_schedule import TokenSchedule  # noqa: E402
from sessions.capture.opening import open_capture  # noqa: E402
from sessions.progress import run_to_end  # noqa: E402
from tests.child_processes import children_of_this_process  # noqa: E402
from tests.test_llama_recorder import TINY  # noqa: E402
from viewer.cli import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = TokenSchedule((5, 17, 3), decode_steps=1)


@pytest.fixture(scope="module")
def gguf_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_gguf(TINY.as_dict(), demo_weights_f32(TINY, 5), tmp_path_factory.mktemp("m") / "tiny.f32.gguf", "f32")


def _with_rope_dimensions(source: Path, out: Path, dimensions: int) -> Path:
    """A copy of `source` whose metadata claims a RoPE width its heads do not have."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, "qwen3")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0])
    writer.add_uint32("qwen3.rope.dimension_count", dimensions)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_an_illegal_instruction_becomes_a_message_with_the_portable_rebuild(
    gguf_f32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "SIGILL")
    out = tmp_path / "x.h5"
    with pytest.raises(LlamaCrashed) as crashed:
        run_to_end(iter_record_llama(gguf_f32, SCHEDULE, out))
    message = str(crashed.value)
    assert message.startswith(
        "llama.cpp crashed while computing step 0 of tiny.f32.gguf (prefill): the process died by SIGILL "
        "(an instruction this CPU or OS does not allow)."
    )
    assert REBUILD_COMMAND in message
    assert "--no-extra-bufts" in message
    assert message.endswith(f"\nIts output: nothing was written to {out} (the run stopped before its first step).")
    assert not out.exists()


def test_a_crash_before_the_first_step_leaves_the_capture_force_would_replace_as_it_was(
    gguf_f32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer renamed its empty structure over the output before the first step: a `--force`
    run that crashed (or was refused, or stopped) in step 0 left an empty capture where a good one was."""
    out = tmp_path / "x.h5"
    run_to_end(iter_record_llama(gguf_f32, SCHEDULE, out))
    kept = out.read_bytes()
    monkeypatch.setenv(FAULT_ENV, "SIGSEGV")
    with pytest.raises(LlamaCrashed) as crashed:
        run_to_end(iter_record_llama(gguf_f32, SCHEDULE, out))
    assert str(crashed.value).endswith(f"\nIts output: {out} is as it was (the run stopped before its first step).")
    assert out.read_bytes() == kept
    with open_capture(out, check_in_child=False) as capture:
        assert capture.complete is True


def test_a_bad_read_inside_ggml_names_the_ggml_function(gguf_f32: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "SIGSEGV")
    with pytest.raises(LlamaCrashed) as crashed:
        plain_logits(gguf_f32, SCHEDULE)
    message = str(crashed.value)
    assert "the process died by SIGSEGV (an invalid memory access)." in message
    assert "Where: ggml_nbytes in libggml-base.so" in message
    assert "compare its size and SHA-256 with its source" in message


def test_a_failed_ggml_assert_reports_what_ggml_said_and_where(gguf_f32: Path, tmp_path: Path) -> None:
    broken = _with_rope_dimensions(gguf_f32, tmp_path / "tiny.rope64.gguf", 2 * TINY.head_dim)
    with pytest.raises(LlamaCrashed) as crashed:
        plain_logits(broken, SCHEDULE)
    message = str(crashed.value)
    assert message.startswith(
        "llama.cpp crashed while loading tiny.rope64.gguf: the process died by SIGABRT (llama.cpp stopped itself on a failed check)."
    )
    assert "Where: llama_model_qwen3::graph::graph(llama_model const&, llm_graph_params const&) in libllama.so" in message
    assert "ggml said: qwen3.cpp:57: GGML_ASSERT(n_embd_head == n_rot) failed" in message
    assert "the GGUF's metadata contradicts its tensors" in message


def test_record_llama_prints_the_crash_and_exits_3(
    gguf_f32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(FAULT_ENV, "SIGILL")
    argv = ["record", "llama", str(gguf_f32), "--tokens", "1,2", "--out", str(tmp_path / "x.h5")]
    assert record_command.run(build_parser().parse_args(argv)) == record_command.EXIT_CRASHED
    printed = capsys.readouterr().err
    assert "record failed: llama.cpp crashed while computing step 0" in printed
    assert "died by SIGILL" in printed


def test_the_llama_demo_scenario_reports_the_crash_instead_of_dying(tmp_path: Path) -> None:
    env = {**os.environ, FAULT_ENV: "SIGILL", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "viewer.cli", "demo", "--generate", str(tmp_path), "--scenario", "llama-vs-mlx-q8_0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    assert "parity-xray demo: llama.cpp crashed while computing step 0 of demo-qwen3-tiny.q8_0.gguf (prefill)" in done.stderr
    assert "died by SIGILL" in done.stderr
    assert "Fatal Python error" not in done.stderr


def _recording_children() -> list[int]:
    return [pid for pid, command in children_of_this_process().items() if b"backends.recorders.llama_process" in command]


def test_closing_the_recording_kills_the_child(gguf_f32: Path, tmp_path: Path) -> None:
    work = iter_record_llama(gguf_f32, TokenSchedule((5, 17, 3), decode_steps=40), tmp_path / "x.h5")
    assert next(work).label == "starting llama.cpp on tiny.f32.gguf"
    assert len(_recording_children()) == 1
    work.close()
    assert _recording_children() == []

