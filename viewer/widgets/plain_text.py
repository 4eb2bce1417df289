"""Labels and tooltips that show their text as it is.

Qt reads a label's or a tooltip's text as rich text when it looks like markup. Record names,
segments, engine names and file names come from other people's captures: a segment named
`<h1>SEG</h1>` rendered as a heading over the verdict strip, and a name holding `<img src=...>`
loaded a local image. Every label and tooltip carrying such text is plain; the few that are rich
on purpose (the contract card, the gate's headline) escape what they interpolate.
"""

from __future__ import annotations

from PySide6.QtGui import Qt
from PySide6.QtWidgets import QLabel, QWidget


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    """A label that never reads its text as markup."""
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def plain_tip(text: str) -> str:
    """`text` as a tooltip that shows it as it is, lines and indents kept (as a plain tooltip did): escaped into a paragraph."""
    return Qt.convertFromPlainText(text, Qt.WhiteSpaceMode.WhiteSpacePre) if text else ""
