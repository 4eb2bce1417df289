"""The viewer opens a real llama.cpp-vs-MLX pair like any other pair."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from pytestqt.qtbot import QtBot  # noqa: E402

from backends.demo.llama_pairs import demo_weights_f32, iter_generate_llama  # noqa: E402
from backends.engines.gguf_export import export_gguf  # noqa: E402
from backends.recorders.llama_process import iter_record_llama  # noqa: E402
from backends.recorders.llama_recorder import LlamaSettings  # noqa: E402
from backends.recorders.record_schedule import TokenSchedule  # noqa: E402
from sessions.progress import run_to_end  # noqa: E402
from tests.test_llama_recorder import TINY  # noqa: E402
from tests.viewer_windows import window_on  # noqa: E402

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.mark.slow
def test_the_f32_pair_opens_at_the_first_rms_norm(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    native, oracle = run_to_end(iter_generate_llama(tmp_path, ["llama-vs-mlx-f32"]))["llama-vs-mlx-f32"]
    window = window_on(qtbot, tmp_path, native, oracle, (1440, 900))
    comparison = window.model.comparison.comparison
    assert comparison.first_divergence is not None
    first = comparison.pairs[comparison.first_divergence]
    assert (first.key.op, first.label.startswith("step 0 prefill layer 0")) == ("attn_norm", True)
    assert {p.key.op for p in comparison.pairs} >= {"q_proj", "q_rope", "o_proj", "sdpa", "logits"}
    window.grab().save(str(artifacts_dir / "viewer-llama-vs-mlx-f32.png"))
    window.close()


def test_an_f16_cache_against_an_f32_one_opens_at_the_attention_scores(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    """Two real llama.cpp runs of one model, KV cache F32 against F16: the window leads with the
    first op the rounded keys change, with the cache cells before it in the tree as unaligned
    (stored in another dtype)."""
    gguf = export_gguf(TINY.as_dict(), demo_weights_f32(TINY, 5), tmp_path / "tiny.f32.gguf", "f32")
    schedule = TokenSchedule((5, 17, 3, 88, 41, 9), decode_steps=1)
    native, oracle = tmp_path / "f32-cache.h5", tmp_path / "f16-cache.h5"
    run_to_end(iter_record_llama(gguf, schedule, native))
    run_to_end(iter_record_llama(gguf, schedule, oracle, LlamaSettings(kv_type="f16")))
    window = window_on(qtbot, tmp_path, native, oracle, (1280, 720))
    qtbot.waitUntil(lambda: window.model.selected is not None, timeout=10_000)
    assert window.model.selected.key.text() == "0:prefill:0:attn_scores"
    assert window.verdict_strip.word.text() == "DIVERGENCE"
    assert "first diverged at 0:prefill:0:attn_scores" in window.verdict_strip.detail.text()
    assert window.dispatch.rerun.key.currentText() == "0:prefill:0:sdpa", "the scores are a stage of sdpa: its rerun is offered"
    unaligned = {(u.name, u.reason) for u in window.model.comparison.comparison.unaligned if (u.step, u.layer, u.side) == (0, 0, "native")}
    assert {("cache_k_l0 (view) (written)", "dtype_mismatch"), ("cache_v_l0 (reshaped) (view) (written)", "dtype_mismatch")} <= unaligned
    window.grab().save(str(artifacts_dir / "viewer-llama-f16-cache-vs-f32-1280x720.png"))
    window.close()
