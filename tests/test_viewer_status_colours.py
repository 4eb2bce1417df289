"""The tree's bit-exact icon and colour are the PARITY word's green: one green for 'all is well'."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from sessions.compare.verdict import PARITY, Kind
from sessions.report.word_colours import WORD_COLOURS
from viewer.theme import STATUS_COLOURS, status_icon


def test_the_bit_exact_green_is_the_parity_words_green(qtbot: QtBot) -> None:
    assert STATUS_COLOURS[Kind.BIT_EXACT] == WORD_COLOURS[PARITY]
    assert status_icon(Kind.BIT_EXACT).pixmap(16, 16).toImage().pixelColor(8, 2).name() == WORD_COLOURS[PARITY]
