"""Help: keyboard shortcuts, a glossary, the colour legend and the documents, in one window.

Shortcuts are read from the window's own actions and legend colours from the theme, so the help
can never disagree with what the window does or paints.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from pathlib import Path

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QTabWidget, QTextBrowser, QVBoxLayout, QWidget

from sessions.compare.verdict import MEANING, Kind
from sessions.report.word_colours import WORD_COLOURS
from viewer.comparison_view import BY_DESIGN_STATUS
from viewer.panels.timeline_view import (
    DIFFERS_COLOUR,
    MISMATCH_COLOUR,
    PRIMITIVE_COLOURS,
)
from viewer.theme import STATUS_COLOURS, asset

DOCS = Path(__file__).resolve().parents[2] / "docs"

GLOSSARY: tuple[tuple[str, str], ...] = (
    ("op key", "Where an op ran, as STEP:SEGMENT:LAYER:OP[#N], e.g. 0:visual:0:sdpa. Every surface uses it; `report` prints it and `rerun --op` takes it."),
    ("ULP steps", "How many representable values lie between the native and the oracle value (-0 to +0 is 1). A sign flip near zero is ~30,000 steps in bf16."),
    ("ULP error", "|native - oracle| in units of the oracle value's ULP (the float grid's spacing there). The tree and the worst-ops tables rank by its 99th percentile; an oracle zero makes the maximum astronomical."),
    ("NMSE", "sum((oracle - native)^2) / sum(oracle^2), llama.cpp's test-backend-ops measure; its default threshold is 1e-7."),
    ("contract", "A kernel's declared arithmetic (e.g. attn.bf16.single_range). The effective contract is what the shape actually selected; different effective contracts are not expected to give equal bits."),
    ("dispatch-only", MEANING[Kind.DISPATCH_ONLY]),
    ("signed-zero-only", MEANING[Kind.SIGNED_ZERO_ONLY]),
    ("post-EOS", "After both runs emitted the same stop token. Whatever follows is invalid, never a failure."),
    ("first finding", "The earliest failing op in the native run's execution order (then token differences, then unaligned records): the place Ctrl+J and the verdict strip go to, and `report` names."),
    ("local / inherited", "An op whose bits differ is local when it computes differently from the oracle on the native's own inputs, inherited when it only passed on an upstream difference (`parity-xray diagnose`)."),
)

DOCUMENTS: tuple[tuple[str, str], ...] = (
    ("report-json.md", "the verdict rules and the JSON report"),
    ("architecture.md", "layers, the op key, canonical ops and engine names"),
    ("capture-format.md", "the HDF5 capture format"),
    ("profiles.md", "engine profiles: name mapping and layouts"),
    ("tolerance-policy.md", "per-op tolerances"),
    ("rerun.md", "live reruns and the dispatch timeline"),
    ("demo-scenarios.md", "the demo pairs and their verdicts"),
)


def shortcuts_html(actions: Iterable[QAction]) -> str:
    rows = [
        (action.shortcut().toString(), action.text().replace("&", ""), action.toolTip())
        for action in actions
        if not action.shortcut().isEmpty()
    ]
    body = "".join(f"<tr><td><b>{escape(keys)}</b></td><td>{escape(name)}</td><td>{escape(tip if tip != name else '')}</td></tr>" for keys, name, tip in sorted(rows))
    return f"<h3>Keyboard shortcuts</h3><table cellpadding='4'>{body}</table><p>Esc cancels the running read or comparison.</p>"


def glossary_html() -> str:
    body = "".join(f"<dt><b>{escape(term)}</b></dt><dd>{escape(text)}</dd>" for term, text in GLOSSARY)
    return f"<h3>Glossary</h3><dl>{body}</dl>"


def _swatch(colour: str) -> str:
    return f"<span style='background:{colour}; color:{colour};'>&nbsp;&nbsp;&nbsp;&nbsp;</span>"


def legend_html() -> str:
    kinds = "".join(
        f"<tr><td><img src='{asset(f'status-{kind}.svg')}' width='16' height='16'></td><td>{_swatch(STATUS_COLOURS[kind])}</td>"
        f"<td><b>{escape(kind)}</b></td><td>{escape(MEANING[kind])}</td></tr>"
        for kind in Kind
    ) + (
        f"<tr><td><img src='{asset('status-by-design.svg')}' width='16' height='16'></td><td>{_swatch(STATUS_COLOURS[BY_DESIGN_STATUS])}</td>"
        f"<td><b>{escape(BY_DESIGN_STATUS)}</b></td><td>an unaligned record the runs hold differently by design (a stage one engine does not "
        "record, caches padded differently): not a finding</td></tr>"
    )
    words = "".join(f"<tr><td>{_swatch(colour)}</td><td><b>{escape(word)}</b></td></tr>" for word, colour in WORD_COLOURS.items())
    primitives = "".join(f"<tr><td>{_swatch(colour)}</td><td>{escape(name or 'not recorded')}</td></tr>" for name, colour in PRIMITIVE_COLOURS.items())
    return (
        "<h3>Tree icons and Overview dots</h3><p>Each op row and each Overview dot has its kind's colour; a group shows its most serious member.</p>"
        f"<table cellpadding='3'>{kinds}</table>"
        f"<h3>Verdict strip</h3><table cellpadding='3'>{words}</table>"
        "<h3>Dispatch timeline</h3><p>Each box is one attention primitive call, coloured by the primitive it took:</p>"
        f"<table cellpadding='3'>{primitives}</table>"
        f"<p>{_swatch(DIFFERS_COLOUR)} underline: the op was dispatched differently on the two sides. "
        f"{_swatch(MISMATCH_COLOUR)} top line: the recorded primitive disagrees with the route predictor.</p>"
    )


def documents_html() -> str:
    body = "".join(f"<li><a href='{(DOCS / name).as_uri()}'>{escape(name)}</a>: {escape(what)}</li>" for name, what in DOCUMENTS)
    return f"<h3>Documents</h3><ul>{body}</ul><p>The same files are in the docs/ folder of the project.</p>"


class HelpDialog(QDialog):
    """Non-modal, so the help stays open beside the window it explains."""

    def __init__(self, actions: Iterable[QAction], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Parity X-ray help")
        self.resize(760, 620)
        self.tabs = QTabWidget()
        for title, html in (
            ("Shortcuts", shortcuts_html(actions)),
            ("Glossary", glossary_html()),
            ("Legend", legend_html()),
            ("Documents", documents_html()),
        ):
            browser = QTextBrowser()
            browser.setOpenExternalLinks(True)
            browser.setHtml(html)
            self.tabs.addTab(browser, title)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)

    def page_text(self, title: str) -> str:
        """A tab's text as a person reads it (tests)."""
        index = next(i for i in range(self.tabs.count()) if self.tabs.tabText(i) == title)
        widget = self.tabs.widget(index)
        assert isinstance(widget, QTextBrowser)
        return widget.toPlainText()
