"""The general MLX recorder records any mlx-lm model directory without changing a bit."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from backends.commands.record import repeat_paths
from backends.engines.demo_model import DemoConfig, seeded_weights
from backends.engines.gguf_export import write_mlx_model_dir
from backends.engines.mlx_device import gpu_available
from backends.recorders.mlx_recorder import (
    LOGITS_NAME,
    ModelDirError,
    iter_record_mlx,
    load_local_model,
    weights_sha256,
)
from backends.recorders.model_config import hf_config
from backends.recorders.record_schedule import (
    TokenSchedule,
    check_run_size,
    parse_segments,
)
from sessions.capture.opening import open_capture
from sessions.child_env import PROJECT_ROOT, child_env
from sessions.commands.validate import validate_file
from sessions.compare.comparison import iter_compare
from sessions.compare.verdict import PARITY
from sessions.progress import run_to_end
from viewer.cli import main

TINY = DemoConfig(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=96, dead_gate_channels=2,
)
PROMPT = (3, 14, 15, 92, 65)


def _drain(work):  # type: ignore[no-untyped-def]
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    weights = {k: np.array(v.astype(mx.float32)) for k, v in seeded_weights(TINY, 7).items()}
    return write_mlx_model_dir(TINY.as_dict(), weights, tmp_path_factory.mktemp("tiny") / "model")


def _plain_logits(model_dir: Path, schedule: TokenSchedule, emitted: list[int]) -> list[np.ndarray]:
    """An uninstrumented mlx-lm run of the same tokens."""
    with mx.stream(mx.cpu):
        model, _ = load_local_model(model_dir)
        cache = make_prompt_cache(model)
        steps = [list(schedule.prompt)] + [[t] for t in emitted[:-1]]
        return [np.array(model(mx.array(ids)[None], cache=cache)[0]) for ids in steps]


def test_recording_a_model_dir_writes_a_valid_capture_with_unchanged_logits(model_dir: Path, tmp_path: Path) -> None:
    schedule = TokenSchedule(PROMPT, decode_steps=2)
    out = tmp_path / "mlx.h5"
    emitted = _drain(iter_record_mlx(model_dir, schedule, out))
    report = validate_file(out, 2**31, 60)
    assert report.problems == [] and report.complete
    with open_capture(out, check_in_child=False) as capture:
        names = [r.name for r in capture.records if r.step == 0]
        assert names[:3] == ["model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj"]
        assert "model.layers.1.self_attn.sdpa" in names and "model.layers.1.mlp.swiglu" in names
        assert [r.occurrence for r in capture.records if r.step == 0 and r.name == "model.layers.0.self_attn.rope"] == [0, 1]
        assert len(capture.dispatch) == 3 * TINY.num_hidden_layers
        logits = [capture.read_values(r)[0] for r in capture.records if r.name == LOGITS_NAME]
        assert [int(t) for t in capture.tokens["token_id"]] == emitted
        assert capture.meta.provenance["prompt_tokens"] == list(PROMPT)
        config = capture.meta.provenance["config"]
        assert (config["rms_norm_eps"], config["rope_theta"], config["head_dim"]) == (TINY.rms_norm_eps, TINY.rope_theta, 16)
    for recorded, plain in zip(logits, _plain_logits(model_dir, schedule, emitted), strict=True):
        assert recorded.view(np.uint32).tobytes() == plain.view(np.uint32).tobytes()


def test_a_prefill_in_micro_batches_is_one_segment_per_piece(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mlx.h5"
    _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=0, ubatch=2), out))
    with open_capture(out, check_in_child=False) as capture:
        lm = [(r.segment, r.shape) for r in capture.records if r.name == LOGITS_NAME]
    assert lm == [("prefill.0", (1, 2, 96)), ("prefill.1", (1, 2, 96)), ("prefill.2", (1, 1, 96))]


def test_a_stop_token_ends_the_run_and_is_marked(model_dir: Path, tmp_path: Path) -> None:
    first = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=3), tmp_path / "a.h5"))
    assert first[0] != first[1], "the seeded tiny model's first two tokens differ"
    out = tmp_path / "b.h5"
    emitted = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, 3, stop_tokens=frozenset({first[1]})), out))
    assert emitted == first[:2]
    with open_capture(out, check_in_child=False) as capture:
        assert capture.tokens["is_stop"].tolist() == [0, 1]


def test_a_directory_without_weights_is_refused_by_name(tmp_path: Path) -> None:
    """Weights under another name than mlx-lm loads read "No safetensors found" beside the file."""
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelDirError) as refused:
        _drain(iter_record_mlx(tmp_path, TokenSchedule(PROMPT), tmp_path / "x.h5"))
    assert str(refused.value) == f"{tmp_path}: no model*.safetensors weights (the files mlx-lm loads)"
    with pytest.raises(ModelDirError, match="not a directory"):
        load_local_model(tmp_path / "absent")


def test_the_weights_hash_is_of_the_files_mlx_lm_loads_and_sha256sum_would_print(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter file beside the model, which mlx-lm never loads, changed the hash: `report`
    warned of different weights between two runs of the same model."""
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))
    folder = Path(shutil.copytree(model_dir, tmp_path / "model"))
    before = weights_sha256(folder)
    assert before == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    (folder / "adapters.safetensors").write_bytes(b"not the model's weights")
    assert weights_sha256(folder) == before


def test_mlx_lms_refusal_of_many_lines_is_one_line(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mlx-lm names each weight it did not expect on a line of its own: the refusal ran to 12 lines."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "model"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] - 1}))
    assert main(["record", "mlx", str(folder), "--tokens", "1,2", "--out", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"record refused: {folder}: mlx-lm cannot load it (") and err.count("\n") == 1


def test_weights_mlx_cannot_read_are_refused_naming_the_model_folder(model_dir: Path, tmp_path: Path) -> None:
    """MLX's own RuntimeError ("[load_safetensors] ... invalid data offsets") reached the command
    without the folder's name."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    weights = next(model_dir.glob("*.safetensors")).read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ModelDirError) as refused:
        load_local_model(broken)
    assert str(refused.value).startswith(f"{broken}: mlx-lm cannot load it (RuntimeError: ")


def test_a_cut_schedule_names_its_calls_and_micro_batches_and_refuses_sizes_that_do_not_add_up() -> None:
    schedule = TokenSchedule(tuple(range(10)), ubatch=3, cut=parse_segments("text-before=2,visual=5,1"), feed_last=2)
    assert schedule.segments() == [
        ("text-before", 0, 2), ("visual.0", 2, 5), ("visual.1", 5, 7), ("prefill.2", 7, 8), ("feed-8", 8, 9), ("feed-9", 9, 10),
    ]
    with pytest.raises(ValueError, match="the segments hold 7 tokens; the prompt's prefill has 8"):
        TokenSchedule(tuple(range(10)), cut=parse_segments("2,5"), feed_last=2)
    with pytest.raises(ValueError, match="the size must be a positive integer"):
        parse_segments("visual=0")
    with pytest.raises(ValueError, match="leaves no prefill"):
        TokenSchedule((1, 2), feed_last=2)


def test_record_mlx_repeats_a_segmented_run_and_each_record_knows_its_positions(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seg.h5"
    argv = ["record", "mlx", str(model_dir), "--tokens", "3,14,15,92,65", "--segments", "2,3", "--decode-steps", "1", "--repeat", "2", "--out", str(out)]
    assert main(argv) == 0
    assert repeat_paths(out, 2) == [out, tmp_path / "seg.run2.h5"]
    with open_capture(out) as first, open_capture(tmp_path / "seg.run2.h5") as second:
        positions = {(r.segment, r.position) for r in first.records}
        assert positions == {("prefill.0", 0), ("prefill.1", 2), ("decode", 5)}
        assert run_to_end(iter_compare(first, second)).verdict.word == PARITY
    assert main(argv) == 2
    assert f"{out} already exists" in capsys.readouterr().err


def test_a_weights_hash_given_names_the_captures_weights_and_a_bad_one_is_refused(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF and a safetensors run of the same weights hash differently: report warned of different weights, with no way to say otherwise."""
    out = tmp_path / "named.h5"
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--weights-hash", "sha256:same-weights", "--out", str(out)]) == 0
    with open_capture(out) as capture:
        assert capture.meta.weights_hash == "sha256:same-weights"
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--weights-hash", "a\x1bb", "--out", str(tmp_path / "bad.h5")]) == 2
    assert "record refused: --weights-hash must be 1 to 256 printable characters" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="this MLX has a GPU to record on")
def test_a_gpu_this_mlx_lacks_is_refused_by_the_option_that_asked_for_it(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """MLX's own words were "[default_stream] Cannot get gpu stream without gpu backend"."""
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--device", "gpu", "--out", str(tmp_path / "x.h5")]) == 2
    assert "record refused: device 'gpu' was asked for, but this MLX build has no GPU (it is a CPU-only build): use --device cpu" in capsys.readouterr().err


def test_a_request_recorded_inside_a_batch_keeps_its_own_tokens(model_dir: Path, tmp_path: Path) -> None:
    alone = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=2), tmp_path / "alone.h5"))
    batched = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=2), tmp_path / "batch.h5", batch=4, batch_row=2))
    assert batched == alone
    with open_capture(tmp_path / "batch.h5") as capture:
        assert (capture.meta.batch_size, capture.meta.batch_row) == (4, 2)
        assert {r.shape[0] for r in capture.records} == {4}
        assert [int(t) for t in capture.tokens["token_id"]] == alone


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--tokens", "²", "--tokens: token id '²' is not an integer"),
        ("--tokens", "1_0", "--tokens: token id '1_0' is not an integer"),
        ("--stop-tokens", "+3", "--stop-tokens: token id '+3' is not an integer"),
        ("--segments", "a\x01b=3,c=2", "segment 'a\\x01b=3': the name holds a control character (\\x01)"),
        ("--segments", "=3,=2", "segment '=3': the name is empty"),
        ("--segments", "decode=5", "segment 'decode=5': `decode`, `feed-P` and names with `.` are the ones a recording gives its own calls"),
        ("--segments", "a.1=5", "segment 'a.1=5': `decode`, `feed-P` and names"),
        ("--segments", "a-very-long-segment-name=5", "the name is longer than the capture's 16-byte segment field"),
        ("--segments", "²", "segment '²': the size must be a positive integer"),
    ],
)
def test_record_refuses_bad_tokens_and_segments_naming_the_option_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    argv = ["record", "mlx", str(tmp_path / "absent"), "--tokens", "1,2,3,4,5", "--out", str(tmp_path / "x.h5"), option, value]
    assert main(argv) == 2
    out = capsys.readouterr().err
    assert out.startswith("record refused: ") and message in out
    assert "Traceback" not in out and not list(tmp_path.iterdir())


def test_record_never_writes_over_the_model_it_reads_even_with_force(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = next(model_dir.glob("*.safetensors"))
    before = weights.read_bytes()
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--out", str(weights), "--force"]) == 2
    assert f"record refused: --out {weights} is the model's {weights.name}: an output never replaces an input" in capsys.readouterr().err
    assert weights.read_bytes() == before
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--out", str(tmp_path / "absent" / "x.h5")]) == 2
    assert f"is in {tmp_path / 'absent'}, which does not exist" in capsys.readouterr().err


def test_record_puts_no_new_file_among_the_model_files_which_the_next_recording_would_refuse_to_replace(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(model_dir.iterdir())
    out = model_dir / "run.h5"
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"record refused: --out {out} is inside the model's folder {model_dir}: a capture never goes among a model's files\n"
    assert sorted(model_dir.iterdir()) == files
    (model_dir / "runs").mkdir()
    try:
        assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", "--out", str(model_dir / "runs" / "run.h5")]) == 0, "a subfolder is none of the model's files"
    finally:
        shutil.rmtree(model_dir / "runs")


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ("[1, 2]", "config.json: not a JSON object"),
        ('{"model_type": "qwen3", "num_hidden_layers": "2"}', 'config.json: num_hidden_layers must be a whole number of at least 1, not "2"'),
        ("[" * 100_000, "config.json: not JSON (it nests deeper than a reader follows)"),
    ],
)
def test_a_config_json_of_the_wrong_shape_is_refused_by_name(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, problem: str) -> None:
    broken = tmp_path / "model"
    broken.mkdir()
    for path in model_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "config.json").write_text(config, encoding="utf-8")
    assert main(["record", "mlx", str(broken), "--tokens", "1,2", "--out", str(tmp_path / "x.h5")]) == 2
    out = capsys.readouterr().err
    assert out.startswith("record refused: ") and problem in out and "Traceback" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_config_json_that_is_no_file_is_named_as_such_not_missing(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "model"
    broken.mkdir()
    for path in model_dir.glob("*.safetensors"):
        (broken / path.name).write_bytes(path.read_bytes())
    os.mkfifo(broken / "config.json")
    assert main(["record", "mlx", str(broken), "--tokens", "1,2", "--out", str(tmp_path / "x.h5")]) == 2
    assert f"record refused: {broken / 'config.json'}: is not a regular file (an mlx-lm model directory holds its config.json)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"num_attention_heads": 0}, "config.json: num_attention_heads must be a whole number of at least 1, not 0"),
        ({"num_hidden_layers": 10_000_000}, "config.json: num_hidden_layers is 10000000, but the weights hold 2 layer(s) (model.layers.0 .. 1)"),
    ],
)
def test_config_sizes_mlx_lm_would_build_from_are_refused_before_it_builds_anything(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, int], problem: str
) -> None:
    """mlx-lm divided by zero heads (a traceback), and built ten million layers' modules (GBs) before reading a weight."""
    broken = tmp_path / "model"
    broken.mkdir()
    for path in model_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    (broken / "config.json").write_text(json.dumps({**config, **edit}), encoding="utf-8")
    assert main(["record", "mlx", str(broken), "--tokens", "1,2", "--out", str(tmp_path / "x.h5")]) == 2
    assert capsys.readouterr().err == f"record refused: {broken / 'config.json'}: {problem.removeprefix('config.json: ')}\n"


@pytest.mark.parametrize(
    ("run", "problem"),
    [
        (["--decode-steps", "4095"], "the run needs 4097 positions (prompt 2, decode steps 4095), more than the model's context of 4096"),
        (["--batch", "10000000000"], "a batch of 10000000000, 2 positions each, needs at least 16689.3 GiB at once (KV cache 9536.7 GiB, logits 7152.6 GiB)"),
    ],
)
def test_a_run_past_the_models_context_or_the_machines_memory_is_refused_before_it_starts(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], run: list[str], problem: str
) -> None:
    assert main(["record", "mlx", str(model_dir), "--tokens", "1,2", *run, "--out", str(tmp_path / "x.h5")]) == 2
    out = capsys.readouterr().err
    assert out.startswith("record refused: ") and problem in out
    assert not list(tmp_path.iterdir())


def test_a_config_without_the_sizes_or_with_sizes_of_the_wrong_type_leaves_those_checks_out() -> None:
    schedule = TokenSchedule((1, 2), decode_steps=5000)
    check_run_size(schedule, 10**10, {}, 4, 1 << 30)
    check_run_size(schedule, 10**10, {"max_position_embeddings": "16", "num_hidden_layers": True, "vocab_size": -1}, 4, 1 << 30)
    with pytest.raises(ValueError, match="more than the model's context of 16"):
        check_run_size(schedule, 1, {"max_position_embeddings": 16}, 4, 1 << 30)
    with pytest.raises(ValueError, match="more than the model's context of 32"):
        check_run_size(schedule, 1, hf_config({"model_type": "qwen3_vl", "text_config": {"max_position_embeddings": 32}}), 4, 1 << 30)


def test_a_recording_whose_output_reader_goes_away_still_records_every_step(model_dir: Path, tmp_path: Path) -> None:
    """`record ... | head -1`: the broken pipe of a progress line was a refusal that left the
    capture half written ("record refused: [Errno 32] Broken pipe", exit 2)."""
    out = tmp_path / "piped.h5"
    argv = [sys.executable, "-m", "viewer.cli", "record", "mlx", str(model_dir), "--tokens", "1,2", "--decode-steps", "6", "--out", str(out)]
    recording = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert recording.stdout is not None and recording.stderr is not None
    assert recording.stdout.readline().startswith("  step 0 ")
    recording.stdout.close()  # as `head -1` does once it has its line
    with recording.stderr:
        assert recording.wait(timeout=120) == 0 and recording.stderr.read() == ""
    report = validate_file(out, 2**31, 60)
    assert report.complete and report.problems == []


def test_ctrl_c_ends_a_recording_with_one_line_and_leaves_the_steps_written_so_far(model_dir: Path, tmp_path: Path, python_ctrl_c: None) -> None:
    out = tmp_path / "long.h5"
    argv = [sys.executable, "-m", "viewer.cli", "record", "mlx", str(model_dir), "--tokens", "1,2", "--decode-steps", "4000", "--out", str(out)]
    recording = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert recording.stdout is not None
    while not recording.stdout.readline().startswith("  step 2 "):  # it is recording decode steps
        assert recording.poll() is None
    recording.send_signal(signal.SIGINT)
    _, err = recording.communicate(timeout=60)
    assert recording.returncode == 130
    assert err == f"record interrupted: {out} holds the steps written so far and reads as incomplete (parity-xray validate names them)\n"
    report = validate_file(out, 2**31, 60)
    assert not report.complete and report.problems[0].location == "/ attribute 'complete'"
