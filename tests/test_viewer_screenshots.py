"""Every tab at 1280x720 and at 1920x1080 on the demo pair, saved for a person to look at.

The assertions are the layout rules a small screen breaks first: the verdict strip stays on
screen with its word, every tab's widget gets a usable share of the window, the alignment tree
keeps most of the left column (the bookmarks dock takes the rest), and the contract
card leaves the tensor maps room to read (one line with its details folded at 1280x720)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QPushButton
from pytestqt.qtbot import QtBot

from tests.viewer_windows import window_on
from viewer.pair_model import COLOUR_SCALES
from viewer.settings import ViewerSettings
from viewer.window.main_window import CARD_EXPANDED_FROM_HEIGHT, TABS, MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.mark.slow
@pytest.mark.parametrize(("width", "height"), [(1280, 720), (1920, 1080)])
def test_every_tab_is_saved_at_common_screen_sizes_with_the_verdict_on_screen(
    qtbot: QtBot, tmp_path: Path, demo_pairs: dict, artifacts_dir: Path, width: int, height: int
) -> None:
    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(width, height)
    win.show()
    qtbot.waitExposed(win)
    win.open_pair(*demo_pairs["attention-contract"])
    qtbot.waitUntil(lambda: win.model.comparison is not None and win.tensor_view.data is not None and not win.tasks.busy, timeout=120_000)
    QApplication.processEvents()
    [card] = win.banners.banners("comparison")
    assert card.details.isVisible() == (height >= CARD_EXPANDED_FROM_HEIGHT) and "attn.f32.tiled64x64" in card.label.text()
    tree, bookmarks = win.tree_dock.height(), win.bookmarks_dock.height()
    assert tree >= 2 * bookmarks, f"the alignment tree, the way around the run, keeps most of the left column: tree {tree} px, bookmarks {bookmarks} px"
    maps = {name: plot.vb.height() for name, plot in win.tensor_view.plots.items()}
    assert min(maps.values()) >= 40, f"each tensor map keeps at least 40 px of data beside the contract card: {maps}"
    if not card.details.isVisible():
        card.details_toggle.click()

        def maps_keep_their_height() -> None:
            shown = {name: plot.vb.height() for name, plot in win.tensor_view.plots.items()}
            assert min(shown.values()) >= 40, f"with the card's details shown too (they scroll): {shown}"

        # Once settled, not after one turn: the card's scroll area limits its height in a later layout pass.
        qtbot.waitUntil(maps_keep_their_height, timeout=5_000)
        assert win.grab().save(str(artifacts_dir / f"card-details-shown-{width}x{height}.png"))
        card.details_toggle.click()
    for index, name in enumerate(TABS):
        win.show_panel(index)
        qtbot.waitUntil(lambda: not win.tasks.busy, timeout=120_000)
        QApplication.processEvents()
        strip = win.verdict_strip
        assert strip.isVisible() and strip.word.text() == "CONTRACT MISMATCH"
        assert strip.geometry().bottom() < height // 4, "the verdict stays at the top"
        panel = win.tabs.currentWidget()
        assert panel.height() >= height // 3 and panel.width() >= width // 2, f"{name} keeps a usable share of the window"
        image = win.grab()
        assert (image.width(), image.height()) == (width, height)
        assert image.save(str(artifacts_dir / f"tab-{index + 1}-{name.lower().replace(' ', '-')}-{width}x{height}.png"))
    win.close()


def _ink_width(button: QPushButton) -> int:
    """How many pixel columns of the button's middle rows hold its white text (the checked
    button's text colour in both themes; the rows clear of the rounded corners)."""
    image = button.grab().toImage()
    rows = range(image.height() // 4, 3 * image.height() // 4)
    return sum(any(image.pixelColor(x, y).lightness() > 200 for y in rows) for x in range(image.width()))


@pytest.mark.slow
def test_the_selected_colour_scale_shows_its_whole_word_in_both_themes(qtbot: QtBot, tmp_path: Path, demo_pairs: dict, artifacts_dir: Path) -> None:
    """The checked button's text is drawn heavier than the text it was sized for: "absolute"
    lost its first and last letters at 1280x720. Its word takes as many columns as in a twin
    button with room to spare."""
    win = window_on(qtbot, tmp_path, *demo_pairs["attention-contract"])
    first_theme = win.settings.theme()
    try:
        for theme in ("dark", "light"):
            if win.settings.theme() != theme:
                win.toggle_theme()
            for scale, button in reversed(list(zip(COLOUR_SCALES, win.tensor_view.scale_buttons.buttons()))):
                win.model.set_scale(scale)
                QApplication.processEvents()
                roomy = QPushButton(button.text())
                qtbot.addWidget(roomy)
                roomy.setCheckable(True)
                roomy.setChecked(True)
                roomy.setFixedWidth(button.width() + 40)
                assert button.isChecked() and _ink_width(button) == _ink_width(roomy), f"{scale} in the {theme} theme"
            assert win.grab().save(str(artifacts_dir / f"colour-scale-absolute-{theme}-1280x720.png"))
    finally:
        if win.settings.theme() != first_theme:
            win.toggle_theme()  # the style sheet is the application's: the next test starts in the theme this one found
