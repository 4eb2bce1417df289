"""Hidden panels rebuild when they are seen: a comparison's arrival redraws only what is on screen."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics
from pytestqt.qtbot import QtBot

from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.progress import run_to_end
from viewer.comparison_view import TokenRow, ViewedComparison
from viewer.pair_model import PairModel
from viewer.panels.overview_plot import OverviewPlot
from viewer.panels.token_table import COLUMNS, TokenTable
from viewer.widgets.stale_while_hidden import bring_hidden_pages_up_to_date

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def viewed(demo_pairs: dict) -> ViewedComparison:  # type: ignore[type-arg]
    native, oracle = (open_capture(p) for p in demo_pairs["post-eos"])
    return ViewedComparison.of(run_to_end(iter_compare(native, oracle)))


def test_a_hidden_token_table_rebuilds_when_shown_or_read_and_a_shown_one_at_once(qtbot: QtBot, viewed: ViewedComparison) -> None:
    steps = len(viewed.comparison.tokens.steps)
    model = PairModel()
    hidden = TokenTable(model)
    qtbot.addWidget(hidden)
    model.set_comparison(viewed)
    assert hidden.rows.rowCount() == 0, "not rebuilt while nobody sees it"
    hidden.show()
    assert hidden.rows.rowCount() == steps
    model.set_comparison(None)
    assert hidden.rows.rowCount() == 0, "a shown panel follows at once"
    hidden.hide()
    model.set_comparison(viewed)
    assert len(hidden.verdicts()) == steps, "reading it brings it up to date"


def test_the_tabs_bring_a_hidden_overview_up_to_date_before_painting_it_with_the_selection(qtbot: QtBot, viewed: ViewedComparison) -> None:
    model = PairModel()
    overview = OverviewPlot(model)
    qtbot.addWidget(overview)
    model.set_comparison(viewed)
    chosen = viewed.growth.pairs[2]
    model.select(chosen)
    assert overview.points == []
    bring_hidden_pages_up_to_date(overview)
    assert overview.points == viewed.growth.pairs
    assert overview.selected_lines[0] in overview.ulp_plot.items and overview.selected_lines[0].value() == 2.0


def test_a_hidden_overview_moves_its_selection_line_only_when_it_is_seen(qtbot: QtBot, viewed: ViewedComparison) -> None:
    model = PairModel()
    overview = OverviewPlot(model)
    qtbot.addWidget(overview)
    model.set_comparison(viewed)
    model.select(viewed.growth.pairs[1])
    bring_hidden_pages_up_to_date(overview)
    assert overview.selected_lines[0].value() == 1.0
    model.select(viewed.growth.pairs[3])
    assert overview.selected_lines[0].value() == 1.0, "a hidden plot is not touched by a selection"
    overview.show()
    assert overview.selected_lines[0].value() == 3.0 and overview.selected_lines[1].value() == 3.0
    model.select(viewed.growth.pairs[2])
    assert overview.selected_lines[0].value() == 2.0, "a shown plot follows at once"


def test_the_token_tables_short_columns_fit_their_widest_text_wherever_it_is(qtbot: QtBot) -> None:
    """Widths come from every row's text, measured once, not from the rows Qt would sample."""
    steps = [TokenRow(i, str(i), str(i), "match", "0", "0", "100%", "—", "—", "—", "—") for i in range(600)]
    steps[-2] = TokenRow(598, "598", "598", "match, logits differ", "+0.0156", "1.42e-05", "100%", "—", "—", "—", "—")
    steps[-1] = TokenRow(599, "151645  (EOS) a long token text", "151645  (EOS)", "EOS", "+1.25e-05", "3.10e-09", "100%", "—", "—", "—", "—")
    table = TokenTable(PairModel())
    qtbot.addWidget(table)
    table.setStyleSheet("QTableView { font-size: 15pt; }")  # a theme's size, which the cells' own fonts take up
    table.resize(1440, 600)
    table.show_rows(steps)
    table.show()
    qtbot.waitExposed(table)
    for row, column in ((row, column) for row in (598, 599) for column in range(7)):
        index = table.rows.index(row, column)
        drawn = (index.data(Qt.ItemDataRole.FontRole) or QFont()).resolve(table.table.font())  # as the view's delegate resolves it
        needed = QFontMetrics(drawn).horizontalAdvance(index.data())
        assert table.table.columnWidth(column) >= needed, (row, column)
    assert table.table.columnWidth(1) > 200


def test_the_token_table_never_scrolls_sideways_its_top_k_columns_share_what_is_left_and_tell_their_text_in_a_tooltip(qtbot: QtBot) -> None:
    """At 1280x720 the top-k columns, sized to their text, pushed the verdict's neighbours off screen."""
    top, ids = ",  ".join(f"{token}: 3.109375" for token in (42, 214, 12, 9, 77)), "42 214 12 9 77"
    steps = [TokenRow(i, str(i), str(i), "match, logits differ", "+0.0156", "1.42e-05", "100%", top, top, ids, ids) for i in range(7)]
    table = TokenTable(PairModel())
    qtbot.addWidget(table)
    table.resize(840, 400)  # the tab's width in a 1280x720 window
    table.show_rows(steps)
    table.show()
    qtbot.waitExposed(table)
    view = table.table
    assert not view.horizontalScrollBar().isVisible()
    assert sum(view.columnWidth(c) for c in range(len(COLUMNS))) <= view.viewport().width()
    assert abs(view.columnWidth(7) - view.columnWidth(8)) <= 1
    assert view.columnWidth(7) >= view.fontMetrics().horizontalAdvance(ids) * 1.2 + 8, "five token ids read whole"
    assert table.rows.index(0, 7).data() == ids and table.rows.index(0, 7).data(Qt.ItemDataRole.ToolTipRole) == top
