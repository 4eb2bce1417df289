"""Viewer behaviour that is not about one picture: cancelling work, persisted state, workers."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt
from pytestqt.qtbot import QtBot

from sessions.capture.structure_check import already_checked
from sessions.compare.in_child import BEHIND_A_WINDOW_NICENESS
from sessions.progress import Progress, ProgressGenerator
from tests.child_processes import child_reading
from tests.hand_captures import T, write_capture
from viewer.settings import STATE_VERSION, ViewerSettings
from viewer.window.main_window import MainWindow
from viewer.workers import TaskSlots

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

WAIT_MS = 120_000


@pytest.fixture(scope="module")
def large_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """16 layers of 1024 x 2048 float32 per side (128 MiB each); every native element is one ULP off.

    Dense differences take the diff engine's full-metrics path, so the comparison runs for
    seconds rather than the fraction of a second a bit-identical pair takes.
    """
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(7)
    oracle_tensors, native_tensors = [], []
    for layer in range(16):
        values = rng.standard_normal((1024, 2048), dtype=np.float32)
        flipped = values.copy()
        flipped.view(np.uint32)[...] ^= 1
        oracle_tensors.append(T("layer_out", values, layer=layer))
        native_tensors.append(T("layer_out", flipped, layer=layer))
    return (
        write_capture(root / "large.native.h5", "native", native_tensors),
        write_capture(root / "large.oracle.h5", "oracle", oracle_tensors),
    )


@pytest.fixture(scope="module")
def many_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8000 small records: the first open's structure check (one index row each, in a child) runs for seconds."""
    tensors = [T("layer_out", np.full((2, 4), i, dtype=np.float32), layer=i) for i in range(8000)]
    return write_capture(tmp_path_factory.mktemp("many") / "many-records.h5", "native", tensors)


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path) -> MainWindow:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1440, 900)
    win.show()
    yield win
    win.close()


def _diffing(progress: Progress) -> bool:
    """Tensor bytes are being compared: pair by pair ("step 0 prefill layer 3 ...") or on workers."""
    return (progress.label.startswith("step") or progress.label.startswith("comparing on")) and progress.done > 0


def test_cancel_during_a_long_diff_stops_it_and_leaves_the_window_usable(
    qtbot: QtBot, window: MainWindow, large_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    with qtbot.waitSignal(window.tasks.progressed, timeout=WAIT_MS, check_params_cb=_diffing):
        window.open_pair(*large_pair)
    compare = window.tasks.task("compare")
    assert compare is not None
    assert window.cancel_button.isVisible() and window.progress.isVisible()
    with qtbot.waitSignal(compare.cancelled, timeout=WAIT_MS):
        qtbot.mouseClick(window.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.tasks.busy, timeout=WAIT_MS)
    assert window.model.comparison is None
    assert any("cancelled" in text for text in window.banners.texts("comparison"))
    assert not window.progress.isVisible() and not window.cancel_button.isVisible()
    assert window.model.native is not None and window.model.oracle is not None
    assert window.verdict_strip.word.text() == "Not compared"
    assert window.verdict_strip.detail.text().startswith("the comparison was cancelled; open the pair again")
    window.show_panel(1)
    qtbot.waitUntil(lambda: window.overview.headline.text() == "Not compared: the comparison was cancelled", timeout=WAIT_MS)
    assert window.tree.summary.text() == "Not compared: the comparison was cancelled"
    window.findings.jump_to_first()
    assert window.statusBar().currentMessage() == "Not compared: the comparison was cancelled"
    numbered = [plot.getAxis(side).style["showValues"] for plot in (*window.tensor_view.plots.values(), *window.tensor_view.errors.plots) for side in ("left", "bottom")]
    assert not any(numbered), "empty maps and plots carry no made-up ticks"

    # Usable: the next pair opens and is compared to the end (a small one: the large pair's full
    # diff would take this test's every second again without showing anything more).
    values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    flipped = values.copy()
    flipped.view(np.uint32)[3, 5] ^= 1
    small = tmp_path / "small"
    small.mkdir()
    native = write_capture(small / "small.native.h5", "native", [T("layer_out", values, layer=0), T("layer_out", flipped, layer=1)])
    oracle = write_capture(small / "small.oracle.h5", "oracle", [T("layer_out", values, layer=0), T("layer_out", values, layer=1)])
    window.open_pair(native, oracle)
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=WAIT_MS)
    first = window.model.comparison.comparison.pairs[window.model.comparison.comparison.first_divergence]
    assert first.key.layer == 1 and first.metrics.differing == 1 and first.metrics.max_ulp == 1
    qtbot.waitUntil(lambda: window.tensor_view.data is not None, timeout=WAIT_MS)
    assert window.tensor_view.plots["difference"].getAxis("bottom").style["showValues"]


def _comparing_child(qtbot: QtBot, window: MainWindow, large_pair: tuple[Path, Path]) -> int:
    """Open the large pair and return the pid of the child comparing it, once it is diffing."""
    with qtbot.waitSignal(window.tasks.progressed, timeout=WAIT_MS, check_params_cb=_diffing):
        window.open_pair(*large_pair)
    pid = child_reading(large_pair[0])
    assert pid is not None, "the diff does not run in a child process"
    return pid


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child through /proc")
def test_cancel_ends_the_comparing_child_process(qtbot: QtBot, window: MainWindow, large_pair: tuple[Path, Path]) -> None:
    pid = _comparing_child(qtbot, window, large_pair)
    window.cancel_button.click()
    qtbot.waitUntil(lambda: not window.tasks.busy, timeout=WAIT_MS)
    assert not Path(f"/proc/{pid}").exists(), "the comparing child outlived the cancel"
    assert any("cancelled" in text for text in window.banners.texts("comparison"))


def _niceness(pid: int) -> int:
    """The scheduling niceness of a live process (field 19 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child through /proc")
def test_the_comparing_child_runs_nicer_than_the_window_it_works_for(qtbot: QtBot, window: MainWindow, large_pair: tuple[Path, Path]) -> None:
    """On two cores the child's processes otherwise took the window's painting time."""
    pid = _comparing_child(qtbot, window, large_pair)
    assert _niceness(pid) == min(19, os.nice(0) + BEHIND_A_WINDOW_NICENESS)
    window.cancel_button.click()
    qtbot.waitUntil(lambda: not window.tasks.busy, timeout=WAIT_MS)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child through /proc")
def test_esc_stops_the_first_open_structure_check_and_nothing_opens(qtbot: QtBot, window: MainWindow, many_records: Path) -> None:
    window.open_files([many_records])
    qtbot.waitUntil(lambda: child_reading(many_records) is not None and window.progress.format().startswith("checking many-records.h5"), timeout=WAIT_MS)
    checker = child_reading(many_records)
    assert checker is not None
    assert window.progress.isVisible() and window.cancel_button.isVisible()
    opening = window.tasks.task("open")
    assert opening is not None
    with qtbot.waitSignal(opening.cancelled, timeout=WAIT_MS):
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not window.tasks.busy, timeout=WAIT_MS)
    assert not Path(f"/proc/{checker}").exists(), "the checking child outlived Esc"
    assert not already_checked(many_records), "the check was stopped, not run to its end"
    assert window.model.native is None and window.model.oracle is None
    assert any("Opening was cancelled" in text for text in window.banners.texts("open"))
    assert not window.progress.isVisible()


def test_a_newer_request_in_a_lane_cancels_the_older_one(qtbot: QtBot) -> None:
    slots = TaskSlots()
    results: list[str] = []

    def endless() -> ProgressGenerator[str]:
        n = 0
        while True:
            n += 1
            yield Progress(n, 0, "forever")

    def quick() -> ProgressGenerator[str]:
        yield Progress(1, 1, "quick")
        return "newest"

    stale = slots.submit("tensor", endless, results.append, results.append)
    with qtbot.waitSignal(stale.cancelled, timeout=WAIT_MS):
        slots.submit("tensor", quick, results.append, results.append)
    qtbot.waitUntil(lambda: slots.idle, timeout=WAIT_MS)
    assert results == ["newest"]


def test_shutting_down_ends_running_work_while_the_ui_thread_runs_no_events() -> None:
    """A closing window waits for its workers inside its close event, running no events: a
    worker whose thread waited for the UI thread to end it made every close mid-task wait out
    the whole timeout (30 s)."""
    slots = TaskSlots()
    running = threading.Event()

    def endless() -> ProgressGenerator[str]:
        n = 0
        while True:
            running.set()
            n += 1
            time.sleep(0.001)
            yield Progress(n, 0, "forever")

    slots.submit("tensor", endless, lambda _r: None, lambda _m: None)
    assert running.wait(WAIT_MS / 1000)
    assert slots.shutdown(ms=10_000) is True


def test_a_failing_generator_reports_a_message_not_a_traceback(qtbot: QtBot) -> None:
    slots = TaskSlots()
    failures: list[str] = []

    def broken() -> ProgressGenerator[None]:
        yield Progress(0, 1, "starting")
        raise KeyError("index")

    task = slots.submit("open", broken, lambda _r: None, failures.append)
    with qtbot.waitSignal(task.ended, timeout=WAIT_MS):
        pass
    qtbot.waitUntil(lambda: slots.idle, timeout=WAIT_MS)
    assert failures == ["KeyError: 'index'"]


def test_recent_files_theme_and_layout_survive_a_restart(qtbot: QtBot, tmp_path: Path) -> None:
    ini = tmp_path / "viewer.ini"
    first = MainWindow(ViewerSettings(ini))
    qtbot.addWidget(first)
    first.resize(760, 690)
    first.show()
    qtbot.waitExposed(first)
    first.settings.add_recent(tmp_path / "a.h5")
    first.settings.add_recent(tmp_path / "b.h5")
    first.toggle_theme()
    first.close()

    second = MainWindow(ViewerSettings(ini))
    qtbot.addWidget(second)
    assert second.settings.recent_files() == [str((tmp_path / "b.h5").resolve()), str((tmp_path / "a.h5").resolve())]
    assert [a.text() for a in second.recent_menu.actions()] == second.settings.recent_files()
    assert second.settings.theme() == "light"
    assert second.size().height() == 690  # the offscreen screen is 800 px wide, under the window minimum
    assert second.settings.window_state() is not None
    assert "b.h5" in second.drop_hint.recent.text()
    second.toggle_theme()
    assert second.settings.theme() == "dark"
    second.close()


def test_unversioned_settings_are_migrated(tmp_path: Path) -> None:
    ini = tmp_path / "old.ini"
    old = QSettings(str(ini), QSettings.Format.IniFormat)
    old.setValue("recent_files", "/x/one.h5;/x/two.h5")
    old.setValue("theme", "purple")
    old.sync()
    settings = ViewerSettings(ini)
    assert settings.recent_files() == ["/x/one.h5", "/x/two.h5"]
    assert settings.theme() == "dark"
    assert int(QSettings(str(ini), QSettings.Format.IniFormat).value("state_version")) == STATE_VERSION


def test_run_viewer_refuses_three_files(capsys: pytest.CaptureFixture[str]) -> None:
    from viewer.app import run_viewer

    assert run_viewer(["a.h5", "b.h5", "c.h5"]) == 2
    assert "at most two captures" in capsys.readouterr().err


def test_the_progress_bar_shows_byte_counts_past_32_bits_as_a_fraction(qtbot: QtBot, window: MainWindow) -> None:
    """A comparison of a multi-GB pair counts more bytes than QProgressBar's int range holds."""
    window.tasks.progressed.emit(Progress(6 * 2**30, 8 * 2**30, "step 0 prefill layer 12"))
    assert window.progress.value() / window.progress.maximum() == 0.75
    assert window.progress.text() == "step 0 prefill layer 12  75%"
