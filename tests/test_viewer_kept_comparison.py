"""The comparison a window keeps is hidden from the cyclic collector (gc.freeze), so it must be
freed by reference counting alone: a reference cycle in it would leak every comparison a long
session drops."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from sessions.capture.opening import open_capture
from sessions.progress import run_to_end
from viewer import comparison_view as cv
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
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """Freed at once, a real model's comparison held the window for 113 ms as a re-opened pair
    replaced it; it now goes a batch at a time, after the views have let go of it, and all of it goes."""
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.show()
    win.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    viewed = weakref.ref(win.model.comparison)
    pairs = weakref.ref(win.model.comparison.comparison)
    win.model.set_captures(None, None)
    assert viewed() is not None, "still there as the views let go: freed later, when the window is idle"
    qtbot.waitUntil(lambda: viewed() is None and pairs() is None, timeout=WAIT_MS)
