"""The general MLX recorder records any mlx-lm model directory without changing a bit."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from backends.engines.demo_model import DemoConfig, seeded_weights
from backends.engines.gguf_export import write_mlx_model_dir
from backends.recorders.mlx_recorder import (
    LOGITS_NAME,
    ModelDirError,
    iter_record_mlx,
    load_local_model,
)
from backends.recorders.record_schedule import TokenSchedule
from sessions.capture.opening import open_capture
from sessions.commands.validate import validate_file

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
