"""The viewer opens a real llama.cpp-vs-MLX pair like any other pair."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from pytestqt.qtbot import QtBot  # noqa: E402

from backends.demo.llama_pairs import iter_generate_llama  # noqa: E402
from sessions.progress import run_to_end  # noqa: E402
from viewer.settings import ViewerSettings  # noqa: E402
from viewer.window.main_window import MainWindow  # noqa: E402

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.mark.slow
def test_the_f32_pair_opens_at_the_first_rms_norm(qtbot: QtBot, tmp_path: Path, artifacts_dir: Path) -> None:
    native, oracle = run_to_end(iter_generate_llama(tmp_path, ["llama-vs-mlx-f32"]))["llama-vs-mlx-f32"]
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.resize(1440, 900)
    window.show()
    qtbot.waitExposed(window)
    window.open_pair(native, oracle)
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=120_000)
    comparison = window.model.comparison.comparison
    assert comparison.first_divergence is not None
    first = comparison.pairs[comparison.first_divergence]
    assert (first.key.op, first.label.startswith("step 0 prefill layer 0")) == ("attn_norm", True)
    assert {p.key.op for p in comparison.pairs} >= {"q_proj", "q_rope", "o_proj", "sdpa", "logits"}
    window.grab().save(str(artifacts_dir / "viewer-llama-vs-mlx-f32.png"))
    window.close()
