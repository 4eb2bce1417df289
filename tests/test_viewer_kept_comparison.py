"""The comparison a window keeps is hidden from the cyclic collector (gc.freeze), so it must be
freed by reference counting alone: a reference cycle in it would leak every comparison a long
session drops."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from sessions import gradual_release
from sessions.capture.opening import open_capture
from sessions.progress import run_to_end
from viewer import comparison_view as cv
from viewer import pair_model
from viewer.settings import ViewerSettings
from viewer.window.main_window import MainWindow

WAIT_MS = 120_000


def test_a_dropped_window_comparison_is_freed_without_the_collector(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    native_path, oracle_path = demo_pairs["attention-contract"]
    with open_capture(native_path) as native, open_capture(oracle_path) as oracle:
        viewed = run_to_end(cv.iter_compare_pair(native, oracle))
        assert viewed.timeline is not None and viewed.comparison.pairs and viewed.tree.root.children
        pair = viewed.comparison.pairs[len(viewed.comparison.pairs) // 2]
        kept = {
            "viewed comparison": weakref.ref(viewed),
            "comparison": weakref.ref(viewed.comparison),
            "pair": weakref.ref(pair),
            "metrics": weakref.ref(pair.metrics),
            "tree group": weakref.ref(next(iter(viewed.tree.root.children.values()))),
            "timeline": weakref.ref(viewed.timeline),
            "growth series": weakref.ref(viewed.growth),
        }
        del viewed, pair
        alive = [name for name, ref in kept.items() if ref() is not None]
    assert alive == [], f"still alive without a collection: {alive}"


@pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
def test_a_window_frees_the_comparison_it_stops_showing_in_steps_while_idle(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freed at once, a real model's comparison held the window for 113 ms as a re-opened pair
    replaced it; it now goes a batch at a time once the views have let go of it, one step per
    turn of the event loop, and all of it goes. Batches of 10 make the demo's 333 pairs many steps."""
    monkeypatch.setattr(gradual_release, "LARGE", 10)
    monkeypatch.setattr(gradual_release, "BATCH", 10)
    steps: list[int] = []

    def counted(holder: list[object]) -> Iterator[None]:
        for _ in gradual_release.iter_release(holder):
            steps.append(len(steps))
            yield

    monkeypatch.setattr(pair_model, "iter_release", counted)
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.show()
    win.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    pairs = win.model.comparison.comparison.pairs
    assert len(pairs) == 333
    first = weakref.ref(pairs[0])
    del pairs
    win.model.set_captures(None, None)
    assert first() is not None and steps == [], "nothing is freed while the views let go of it"
    qtbot.waitUntil(lambda: first() is None, timeout=WAIT_MS)
    assert len(steps) >= 333 // 10, "the pairs went ten at a time"
