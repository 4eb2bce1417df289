"""What the window says when something is wrong, read on a 1280x720 screen.

A contract mismatch is the verdict strip's word plus a card; captures no profile recognises are
UNUSABLE with the reason; an error no code path caught is an error banner with its traceback at
hand (and on stderr), never a silent failure. Screenshots land in test-artifacts/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from sessions.compare.verdict import CONTRACT_MISMATCH, UNUSABLE
from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import shown_tip
from viewer.settings import ViewerSettings
from viewer.tree.alignment_tree import PAIR_ROLE
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

WAIT_MS = 120_000
SCREEN = (1280, 720)


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path) -> MainWindow:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(*SCREEN)
    win.show()
    qtbot.waitExposed(win)
    yield win
    win.close()


def shoot(win: MainWindow, artifacts_dir: Path, name: str) -> None:
    QApplication.processEvents()
    image = win.grab()
    assert (image.width(), image.height()) == SCREEN
    assert image.save(str(artifacts_dir / f"viewer-720p-{name}.png"))


def test_a_contract_mismatch_reads_as_the_strip_word_and_a_card_at_720p(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path) -> None:
    window.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and window.tensor_view.data is not None and not window.tasks.busy, timeout=WAIT_MS)
    strip = window.verdict_strip
    assert strip.isVisible() and strip.word.text() == CONTRACT_MISMATCH
    assert strip.go.isVisible()
    [card] = [b for b in window.banners.banners("comparison") if "native ran" in b.text]
    assert card.isVisible() and card.level == "error"
    assert strip.geometry().bottom() < window.banners.geometry().top(), "the verdict comes first"
    tree = window.tree.view
    current = tree.currentIndex()
    assert tree.model().data(current.siblingAtColumn(0), PAIR_ROLE) is window.model.selected
    assert window.model.selected.key == window.model.comparison.comparison.verdict.first.key
    assert tree.viewport().rect().contains(tree.visualRect(current)), "the first finding's row is highlighted whole, not cut off"
    assert window.tensor_view.height() >= 300, "the tensor view keeps room to be read below the strip and the card"
    shoot(window, artifacts_dir, "contract-mismatch")


def test_a_second_banner_over_the_contract_card_at_720p_scrolls_into_view_and_leaves_the_maps_readable(
    qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, artifacts_dir: Path
) -> None:
    """A "Could not open" over the card took each tensor map to 29 px, and with the card's details
    shown to 0 px, tick labels drawn over one another."""
    window.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and window.tensor_view.data is not None and not window.tasks.busy, timeout=WAIT_MS)
    window.open_files([tmp_path / "nonexistent.h5"])
    qtbot.waitUntil(lambda: bool(window.banners.texts("open")) and not window.tasks.busy, timeout=WAIT_MS)
    [card] = [b for b in window.banners.banners("comparison") if "native ran" in b.text]
    card.details_toggle.click()
    [refused] = window.banners.banners("open")
    area = window.banners

    def shown_whole(banner: QWidget) -> bool:
        top = banner.mapTo(area.viewport(), QPoint(0, 0)).y()
        return 0 <= top and top + banner.height() <= area.viewport().height()

    qtbot.waitUntil(lambda: refused.isVisible() and shown_whole(refused))
    assert min(plot.vb.height() for plot in window.tensor_view.plots.values()) >= 34, "every map keeps 35 px of data"
    shoot(window, artifacts_dir, "two-banners")


def test_the_contract_finding_reads_as_words_in_the_card_the_strips_tooltip_and_the_ops_tooltip(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    window.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy and window.tree.view.currentIndex().isValid(), timeout=WAIT_MS)
    assert window.model.comparison.comparison.contracts.findings[0].kind == "KERNEL_CONTRACT_MISMATCH", "the code the JSON keeps"
    [card] = [b for b in window.banners.banners("comparison") if "native ran" in b.text]
    said = "kernel or contract differs: effective_contract_id: native 'attn.bf16.single_range' vs oracle 'attn.f32.tiled64x64'"
    assert shown_tip(card.details.text()).startswith("Kernel or contract differs, found from the index before any tensor data was read")
    assert said in shown_tip(window.verdict_strip.detail.toolTip())
    row = window.tree.view.currentIndex().siblingAtColumn(0)
    assert said in shown_tip(row.data(Qt.ItemDataRole.ToolTipRole))
    for shown in (card.details.text(), window.verdict_strip.detail.toolTip(), row.data(Qt.ItemDataRole.ToolTipRole)):
        assert "KERNEL_CONTRACT_MISMATCH" not in shown


def test_the_contract_cards_details_follow_the_windows_height_until_the_user_chooses(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    window.resize(1280, 1000)
    window.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and not window.tasks.busy, timeout=WAIT_MS)
    [card] = [b for b in window.banners.banners("comparison") if "native ran" in b.text]
    shown = []
    for height in (1000, 720, 960, 640):
        window.resize(1280, height)
        QApplication.processEvents()
        shown.append(card.details.isVisible())
    assert shown == [True, False, True, False]
    card.details_toggle.click()  # the user wants the details, small window or not
    for height in (700, 1000, 650):
        window.resize(1280, height)
        QApplication.processEvents()
        assert card.details.isVisible(), f"the user's choice holds at {height} px"


def test_captures_no_profile_recognises_are_unusable_and_say_why(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    bits = bf16_bits(np.linspace(-1.0, 1.0, 32).reshape(4, 8))
    tensors = [T("mystery.block.0.mix", bits, layer=0, dtype="bfloat16"), T("mystery.block.0.out", bits, layer=0, dtype="bfloat16")]
    native = write_capture(tmp_path / "mystery.native.h5", "native", tensors)
    oracle = write_capture(tmp_path / "mystery.oracle.h5", "oracle", tensors)
    window.open_pair(native, oracle)
    qtbot.waitUntil(lambda: bool(window.banners.banners("comparison")) and not window.tasks.busy, timeout=WAIT_MS)
    [failure] = window.banners.banners("comparison")
    assert failure.level == "error" and failure.text.startswith("The comparison failed: ")
    assert "profile" in failure.text
    assert window.verdict_strip.word.text() == UNUSABLE
    assert window.verdict_strip.detail.text() == failure.text.removeprefix("The comparison failed: ")
    assert window.banners.banners("uncaught") == [], "no exception escaped to the hook"
    assert window.model.comparison is None and window.model.native is not None


@pytest.mark.qt_no_exception_capture
def test_an_error_escaping_a_slot_is_an_error_banner_with_its_traceback(qtbot: QtBot, window: MainWindow, demo_pairs: dict[str, tuple[Path, Path]], artifacts_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    window.open_pair(*demo_pairs["head-chunk"])
    qtbot.waitUntil(lambda: window.model.comparison is not None and window.tensor_view.data is not None and not window.tasks.busy, timeout=WAIT_MS)
    assert sys.excepthook is not sys.__excepthook__, "the viewer installed its hook (pytest-qt's is off for this test)"
    QTimer.singleShot(0, lambda: window.model.set_scale("viridis"))
    qtbot.waitUntil(lambda: bool(window.banners.banners("uncaught")), timeout=WAIT_MS)
    [banner] = window.banners.banners("uncaught")
    assert banner.level == "error"
    assert banner.text == "Unexpected error: ValueError: colour scale must be one of ('absolute', 'relative', 'ULP'), not 'viridis'"
    details = shown_tip(banner.label.toolTip())
    assert details.startswith("Traceback (most recent call last):") and "in set_scale" in details
    assert "Copy details" in banner.buttons
    assert "Parity X-ray: uncaught error" in capfd.readouterr().err
    assert window.model.scale == "ULP" and window.isVisible(), "the window carries on as it was"
    shoot(window, artifacts_dir, "uncaught-error")
    banner.buttons["Copy details"].click()
    assert QApplication.clipboard().text() == details


@pytest.mark.qt_no_exception_capture
def test_an_uncaught_error_is_reported_once_however_many_windows_are_open(qtbot: QtBot, window: MainWindow, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    second = MainWindow(ViewerSettings(tmp_path / "second.ini"))  # "Open native vs rerun" makes one
    qtbot.addWidget(second)
    capfd.readouterr()
    QTimer.singleShot(0, lambda: window.model.set_scale("viridis"))
    qtbot.waitUntil(lambda: bool(window.banners.banners("uncaught")), timeout=WAIT_MS)
    err = capfd.readouterr().err
    assert err.count("Parity X-ray: uncaught error") == 1, "the hook once called itself: 989 tracebacks, then a RecursionError"
    assert "RecursionError" not in err
    second.close()


def test_a_window_closed_as_its_comparison_arrives_runs_nothing_on_its_deleted_parts(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capfd: pytest.CaptureFixture[str]
) -> None:
    """The first finding is selected on a timer once the comparison has arrived; a window closed
    and deleted before it fired ran it on its deleted model ("Signal source has been deleted")."""
    window = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    closed: list[bool] = []

    def close_on_arrival() -> None:
        if window.model.comparison is not None and not closed:
            closed.append(window.close())
            window.deleteLater()

    window.model.comparison_changed.connect(close_on_arrival)
    window.show()
    window.open_pair(*demo_pairs["head-chunk"])
    qtbot.waitUntil(lambda: bool(closed), timeout=WAIT_MS)
    qtbot.wait(100)
    assert closed == [True]
    assert "uncaught error" not in capfd.readouterr().err
