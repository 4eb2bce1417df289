"""The dispatch timeline and the rerun panel mounted in the window: one selection, followed everywhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from sessions.capture.opening import open_capture
from viewer import comparison_view as cv
from viewer.settings import ViewerSettings
from viewer.window.main_window import TABS, MainWindow

pytestmark = [pytest.mark.slow, pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints", "This plugin does not support raise")]

WAIT_MS = 120_000


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]) -> MainWindow:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1440, 900)
    win.show()
    qtbot.waitExposed(win)
    win.open_pair(*demo_pairs["head-chunk"])
    qtbot.waitUntil(lambda: win.dispatch.timeline_model.timeline is not None and win.tensor_view.data is not None and not win.tasks.busy, timeout=WAIT_MS)
    yield win
    win.close()


def shoot(win: MainWindow, artifacts_dir: Path, name: str) -> None:
    image = win.grab()
    assert (image.width(), image.height()) == (1440, 900)
    assert image.save(str(artifacts_dir / f"viewer-{name}.png"))


def test_the_new_panels_have_the_next_tab_shortcuts(window: MainWindow) -> None:
    assert TABS[4:] == ("Dispatch timeline", "Rerun", "Diagnosis", "Worst ops")
    assert [a.shortcut().toString() for a in window.tab_actions] == [f"Ctrl+{i}" for i in range(1, 9)]
    window.tab_actions[4].trigger()
    assert window.tabs.currentWidget() is window.dispatch.timeline
    window.tab_actions[5].trigger()
    assert window.tabs.currentWidget() is window.dispatch.rerun
    window.tab_actions[6].trigger()
    assert window.tabs.currentWidget() is window.diagnosis
    window.tab_actions[7].trigger()
    assert window.tabs.currentWidget() is window.worst_ops


def test_clicking_a_call_on_the_timeline_selects_its_op_in_the_tree_and_shows_its_tensors(qtbot: QtBot, window: MainWindow, artifacts_dir: Path) -> None:
    window.tab_actions[4].trigger()
    view, timeline = window.dispatch.timeline, window.dispatch.timeline_model.timeline
    assert window.model.selected is not None and window.model.selected.key == window.model.comparison.comparison.verdict.first.key
    candidates = np.flatnonzero((timeline.side == 1) & timeline.differs & (timeline.head_count == 1))
    target = next(int(t) for t in candidates if timeline.keys[int(timeline.slot[t])] != window.model.selected.key)
    key = timeline.keys[int(timeline.slot[target])]
    with qtbot.waitSignal(window.tensor_view.slice_shown, timeout=WAIT_MS):
        qtbot.mouseClick(view.plot.viewport(), Qt.MouseButton.LeftButton, pos=view.plot.mapFromScene(view.scene_pos_of(target)))
    pair = window.model.selected
    assert pair.key == key
    assert window.dispatch.timeline_model.selected == target, "the clicked call stays the highlighted one"
    current = window.tree.proxy.mapToSource(window.tree.view.currentIndex().siblingAtColumn(0))
    assert current.data(Qt.ItemDataRole.DisplayRole) == cv.pair_op_label(pair)
    assert window.tensor_view.data is not None and window.tensor_view.data.request.label == pair.key.text()
    assert window.dispatch.rerun.key.currentText() == f"{key.step}:{key.segment}:{key.layer}:{key.op}"
    qtbot.waitUntil(lambda: not window.tasks.busy, timeout=WAIT_MS)
    view.plot.scene().sigMouseMoved.emit(view.scene_pos_of(target))
    shoot(window, artifacts_dir, "dispatch-timeline")
    # The op's calls on both sides are outlined, outside their boxes: drawn on the box, the
    # selection hid its red "differs" outline, and the oracle's calls of the op had no mark.
    of_op = timeline.slot[view.model.boxes.event] == timeline.slot[target]
    assert view.items.selection_outlined == int(of_op.sum()) and set(timeline.side[view.model.boxes.event[of_op]].tolist()) == {0, 1}


def test_selecting_in_the_tree_highlights_that_op_on_the_timeline_and_in_the_rerun_panel(qtbot: QtBot, window: MainWindow) -> None:
    timeline = window.dispatch.timeline_model.timeline
    sdpa = [p for p in window.model.comparison.comparison.pairs if p.key.op == "sdpa"]
    pair = sdpa[-1]
    window.model.select(pair)
    selected = window.dispatch.timeline_model.selected
    assert selected is not None
    key = timeline.keys[int(timeline.slot[selected])]
    assert key == pair.key
    assert window.dispatch.rerun.key.currentText() == f"{pair.key.step}:{pair.key.segment}:{pair.key.layer}:sdpa"
    window.model.select(next(p for p in window.model.comparison.comparison.pairs if p.key.op != "sdpa"))
    assert window.dispatch.timeline_model.selected is None, "an op without attention calls highlights none"


def test_a_rerun_from_the_selected_op_is_saved_and_opened_beside_the_pair(qtbot: QtBot, window: MainWindow, tmp_path: Path, artifacts_dir: Path) -> None:
    pair = next(p for p in window.model.comparison.comparison.pairs if p.key.op == "sdpa")
    window.model.select(pair)
    window.tab_actions[5].trigger()
    panel = window.dispatch.rerun
    with qtbot.waitSignal(panel.finished, timeout=WAIT_MS):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert window.banners.banners("rerun") == [], "the panel's own Save as capture saves: no banner on every tab says so again"
    shoot(window, artifacts_dir, "rerun")
    suggested: list[str] = []
    panel.choose_save_path = lambda _parent, name: suggested.append(name) or tmp_path / "rerun.h5"
    with qtbot.waitSignal(window.dispatch.rerun_saved, timeout=WAIT_MS):
        qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert suggested == [f"rerun-{pair.key.text().replace(':', '_')}.h5"]
    [rerun] = window.session_file.session.reruns
    assert rerun.capture.path == tmp_path / "rerun.h5" and rerun.op is not None and rerun.op.op == "sdpa"
    with open_capture(tmp_path / "rerun.h5") as saved:
        assert saved.meta.role == "rerun"
    [saved_banner] = window.banners.banners("rerun")
    saved_banner.buttons["Open native vs rerun"].click()
    [beside] = window._beside
    qtbot.waitUntil(lambda: beside.model.comparison is not None and not beside.tasks.busy, timeout=WAIT_MS)
    assert beside.model.native.path == window.model.native.path and beside.model.oracle.path == tmp_path / "rerun.h5"
    assert window.model.oracle.path != beside.model.oracle.path, "the original pair stays open"
    beside.close()
