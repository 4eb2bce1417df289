"""What an empty window says: where to drop files, and the files opened last time."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QPushButton, QVBoxLayout, QWidget

from viewer.theme import asset
from viewer.widgets.plain_text import plain_label


class DropHint(QWidget):
    open_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.addStretch(2)
        picture = plain_label()
        picture.setPixmap(QPixmap(str(asset("drop-hint.svg"))).scaled(96, 96, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation))
        picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(picture)
        self.label = plain_label(
            "Drop a native and an oracle capture here\n"
            "(one or both at once; roles come from each file's role hint)"
        )
        self.label.setObjectName("dropHint")
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(self.label)
        button = QPushButton("Open captures…  (Ctrl+O)")
        button.clicked.connect(self.open_requested)
        button.setMaximumWidth(260)
        layout.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
        self.recent = plain_label()
        self.recent.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.recent.setObjectName("sectionTitle")
        layout.addWidget(self.recent)
        layout.addStretch(3)

    def set_recent(self, paths: list[str]) -> None:
        if not paths:
            self.recent.setText("Try the demo: parity-xray demo")
            return
        names = "\n".join(Path(p).name for p in paths[:5])
        self.recent.setText(f"Recent (File ▸ Open recent):\n{names}")
