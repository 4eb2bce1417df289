"""The window's panels below the verdict strip and banners: they fill what those leave.

A vertical layout short of room takes it from every widget alike, down to its least height.
The panels' own wish (a tab widget asks for its tallest page: the Diagnosis panel's tables, the
tensor view's seven plots) exceeded the window, so the banner area above them was cut to a line
and a half, its message clipped mid-line. Asking for no more than their least height, the
panels still take all the room there is (stretch), and the banners keep theirs. Their height
for the window's width (wrapped labels) is a wish of the same kind, and goes too.
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QStackedWidget


class FillingStack(QStackedWidget):
    def sizeHint(self) -> QSize:
        return self.minimumSizeHint()

    def hasHeightForWidth(self) -> bool:
        return False
