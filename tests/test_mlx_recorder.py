"""The general MLX recorder records any mlx-lm model directory without changing a bit."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from backends.commands.record import repeat_paths
from backends.engines.demo_model import DemoConfig, seeded_weights
from backends.engines.gguf_export import write_mlx_model_dir
from backends.recorders.mlx_recorder import (
    LOGITS_NAME,
    ModelDirError,
    iter_record_mlx,
    load_local_model,
)
from backends.recorders.record_schedule import TokenSchedule, parse_segments
from sessions.capture.opening import open_capture
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
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelDirError, match=r"no \*\.safetensors weights"):
        _drain(iter_record_mlx(tmp_path, TokenSchedule(PROMPT), tmp_path / "x.h5"))
    with pytest.raises(ModelDirError, match="not a directory"):
        load_local_model(tmp_path / "absent")


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
    assert f"{out} already exists" in capsys.readouterr().out


def test_a_request_recorded_inside_a_batch_keeps_its_own_tokens(model_dir: Path, tmp_path: Path) -> None:
    alone = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=2), tmp_path / "alone.h5"))
    batched = _drain(iter_record_mlx(model_dir, TokenSchedule(PROMPT, decode_steps=2), tmp_path / "batch.h5", batch=4, batch_row=2))
    assert batched == alone
    with open_capture(tmp_path / "batch.h5") as capture:
        assert (capture.meta.batch_size, capture.meta.batch_row) == (4, 2)
        assert {r.shape[0] for r in capture.records} == {4}
        assert [int(t) for t in capture.tokens["token_id"]] == alone
