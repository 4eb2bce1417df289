"""Labels and tooltips that show their text as it is, or its code spans as code.

Qt reads a label's or a tooltip's text as rich text when it looks like markup. Record names,
segments, engine names and file names come from other people's captures: a segment named
`<h1>SEG</h1>` rendered as a heading over the verdict strip, and a name holding `<img src=...>`
loaded a local image. Every label and tooltip carrying such text is plain; the few that are rich
on purpose (the contract card, the gate's headline, the diagnosis sentences) escape what they
interpolate.
"""

from __future__ import annotations

import re
from html import escape

from PySide6.QtGui import Qt
from PySide6.QtWidgets import QLabel, QWidget

CODE_SPAN = re.compile(r"`([^`\n]+)`")
"""A span of a domain sentence marked as code the Markdown way (`attn.bf16.single_range`)."""


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    """A label that never reads its text as markup."""
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def plain_tip(text: str) -> str:
    """`text` as a tooltip that shows it as it is, lines and indents kept (as a plain tooltip did): escaped into a paragraph."""
    return Qt.convertFromPlainText(text, Qt.WhiteSpaceMode.WhiteSpacePre) if text else ""


def rich_label(parent: QWidget | None = None) -> QLabel:
    """A label for `code_text`: always rich, so a sentence without a code span is read the same way."""
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.RichText)
    return label


def code_text(text: str) -> str:
    """A domain sentence as rich text for a `rich_label` or a tooltip: its code spans in a code
    font without their backticks, everything else escaped, its lines kept. The CLI, the JSON and
    the HTML page carry the same sentence with its backticks, which a label showed raw."""
    if not text:
        return ""
    parts = CODE_SPAN.split(text)
    shown = "".join(f"<code>{escape(part)}</code>" if n % 2 else escape(part) for n, part in enumerate(parts))
    return "<qt>" + shown.replace("\n", "<br>") + "</qt>"
