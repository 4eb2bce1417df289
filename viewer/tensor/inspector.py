"""The element inspector: one coordinate, both sides, every bit that matters.

Decoding (decimal text, hex, signed zero, NaN payload, ULP distance) is sessions.bits.element_info's
job; this widget only lays it out so that the disagreeing field is the one that stands out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QGridLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from sessions.bits.element_info import ElementInfo, describe, ulp_between
from sessions.bits.quant_blocks import QuantBlock
from viewer.widgets.plain_text import plain_label

DIFFERENT = "#d64541"
SIGNED_ZERO = "#e07b39"
"""The tree's colour of a signed-zero-only op (viewer.theme, which this folder cannot import: it imports the comparison's view)."""


@dataclass(frozen=True)
class InspectedElement:
    """What the inspector shows, kept as data so tests read the same numbers a person sees."""

    coordinate: tuple[int, ...]
    native: ElementInfo
    oracle: ElementInfo
    ulp: int | None
    pinned: bool
    block: QuantBlock | None = None
    """For a quantized pair (shown decoded to float32): the stored block the element comes from."""

    @property
    def bit_exact(self) -> bool:
        return self.native.bits == self.oracle.bits

    @property
    def signed_zero_swap(self) -> bool:
        """+0 against -0: equal values, one ULP apart by bits (red "1 ULP apart" read as an error)."""
        return not self.bit_exact and all(side.exponent == 0 and side.mantissa == 0 for side in (self.native, self.oracle))

    def distance_text(self) -> str:
        """How far apart the two values are, in the words every line of the inspector uses."""
        if self.bit_exact:
            return "bit-exact"
        if self.signed_zero_swap:
            return "+0/-0 swap: equal values, the sign bit differs"
        return "ULP distance undefined (NaN)" if self.ulp is None else f"{self.ulp} ULP apart"


def inspect(
    coordinate: tuple[int, ...],
    native_bits: np.generic,
    oracle_bits: np.generic,
    dtype: str,
    pinned: bool,
    block: QuantBlock | None = None,
) -> InspectedElement:
    return InspectedElement(
        coordinate=coordinate,
        native=describe(native_bits, dtype),
        oracle=describe(oracle_bits, dtype),
        ulp=ulp_between(native_bits, oracle_bits, dtype),
        pinned=pinned,
        block=block,
    )


def block_text(block: QuantBlock) -> str:
    """The block, its bytes on both sides, and where they differ."""
    last = block.first_element + block.elements - 1
    head = f"{block.dtype} block #{block.index} (elements {block.first_element}–{last} in storage order)"
    if not block.differing_bytes:
        verdict = "raw bytes identical"
    else:
        shown = ", ".join(str(b) for b in block.differing_bytes[:8])
        more = f" and {len(block.differing_bytes) - 8} more" if len(block.differing_bytes) > 8 else ""
        verdict = f"raw bytes differ at offset {shown}{more}"
    return f"{head}: {verdict}\nnative {_grouped(block.native_hex)}\noracle {_grouped(block.oracle_hex)}"


def _grouped(hex_text: str) -> str:
    """Four bytes per group, so a long block wraps in the narrow panel."""
    return " ".join(hex_text[i : i + 8] for i in range(0, len(hex_text), 8))


def _flags(info: ElementInfo) -> str:
    flags = []
    if info.is_negative_zero:
        flags.append("signed zero (−0)")
    elif info.bits == 0 and info.logical_dtype in ("bfloat16", "float16", "float32", "float64"):
        flags.append("+0")
    if info.is_nan:
        flags.append(f"NaN payload 0x{info.nan_payload:x}")
    if info.is_inf:
        flags.append("−inf" if info.sign else "+inf")
    return ", ".join(flags) or "—"


HOVER_HINT = "Hover a heatmap to inspect an element; click one to pin it."
PINNED_HINT = "Pinned: hovering does not move the inspector. Click the pinned element again to unpin, or click another element to pin that one."


class ElementInspector(QFrame):
    ROWS = ("decimal", "hex bits", "sign/exp/mant", "flags")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("inspector")
        self.current: InspectedElement | None = None
        self.label = ""
        """The op key of the shown slice, for copied text."""
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 8, 10, 8)
        self.title = plain_label("Element inspector")
        self.title.setObjectName("sectionTitle")
        outer.addWidget(self.title)
        self.hint = plain_label(HOVER_HINT)
        self.hint.setWordWrap(True)
        outer.addWidget(self.hint)
        self.copy_button = QPushButton("Copy element")
        self.copy_button.setToolTip("Copy this element's place, both values and bits, and their ULP distance as text")
        self.copy_button.clicked.connect(self.copy_element)
        self.copy_button.setEnabled(False)
        outer.addWidget(self.copy_button)
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        self._cells: dict[tuple[str, str], QLabel] = {}
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        line = 0
        for side in ("native", "oracle"):
            head = plain_label(side)
            head.setObjectName("sectionTitle")
            grid.addWidget(head, line, 0, 1, 2)
            line += 1
            for name in self.ROWS:
                grid.addWidget(plain_label(name), line, 0, Qt.AlignmentFlag.AlignTop)
                cell = plain_label("")
                cell.setFont(mono)
                cell.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
                cell.setWordWrap(True)
                grid.addWidget(cell, line, 1)
                self._cells[(name, side)] = cell
                line += 1
            grid.setRowMinimumHeight(line, 8)
            line += 1
        grid.setColumnStretch(1, 1)
        outer.addLayout(grid)
        self.block = plain_label("")
        self.block.setFont(mono)
        self.block.setWordWrap(True)
        self.block.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.block.setVisible(False)
        outer.addWidget(self.block)
        self.verdict = plain_label("")
        big = QFont()
        big.setPointSize(13)
        big.setBold(True)
        self.verdict.setFont(big)
        outer.insertWidget(2, self.verdict)
        outer.addStretch(1)

    def cell_text(self, row: str, side: str) -> str:
        return self._cells[(row, side)].text()

    def element_text(self) -> str:
        """The shown element as one line a user pastes into an issue or a chat."""
        element = self.current
        if element is None:
            return ""
        where = ", ".join(str(i) for i in element.coordinate)
        distance = element.distance_text()
        return (
            f"{self.label} [{where}]: native {element.native.hex} ({element.native.decimal}) "
            f"oracle {element.oracle.hex} ({element.oracle.decimal}), {distance}"
        )

    def copy_element(self) -> None:
        QApplication.clipboard().setText(self.element_text())

    def unpinned(self) -> None:
        """The pin was released: say so, and that hovering inspects again."""
        if self.current is not None:
            self.current = replace(self.current, pinned=False)
            self.title.setText(self.title.text().removesuffix("  (pinned)"))
        self.hint.setText(HOVER_HINT)

    def clear(self) -> None:
        self.current = None
        self.copy_button.setEnabled(False)
        self.hint.setText(HOVER_HINT)
        self.title.setText("Element inspector")
        for cell in self._cells.values():
            cell.setText("")
        self.verdict.setText("")
        self.block.setVisible(False)

    def show_element(self, element: InspectedElement) -> None:
        self.current = element
        where = ", ".join(str(i) for i in element.coordinate)
        self.title.setText(f"Element [{where}]" + ("  (pinned)" if element.pinned else ""))
        self.hint.setText(PINNED_HINT if element.pinned else HOVER_HINT)
        self.copy_button.setEnabled(True)
        for side, info in (("native", element.native), ("oracle", element.oracle)):
            self._cells[("decimal", side)].setText(info.decimal)
            self._cells[("hex bits", side)].setText(info.hex)
            self._cells[("sign/exp/mant", side)].setText(f"{info.sign} / {info.exponent} / 0x{info.mantissa:x}")
            self._cells[("flags", side)].setText(_flags(info))
        differ = {
            "decimal": element.native.decimal != element.oracle.decimal,
            "hex bits": element.native.bits != element.oracle.bits,
            "sign/exp/mant": element.native.bits != element.oracle.bits,
            "flags": _flags(element.native) != _flags(element.oracle),
        }
        for (row, _side), cell in self._cells.items():
            _restyle(cell, f"color: {DIFFERENT}; font-weight: 600;" if differ[row] else "")
        self.block.setVisible(element.block is not None)
        if element.block is not None:
            self.block.setText(block_text(element.block))
            _restyle(self.block, f"color: {DIFFERENT};" if element.block.differing_bytes else "")
        if element.bit_exact:
            self.verdict.setText("bit-exact")
            _restyle(self.verdict, "color: #2e9d57;")
        elif element.signed_zero_swap:
            self.verdict.setText(element.distance_text())
            _restyle(self.verdict, f"color: {SIGNED_ZERO};")
        elif element.ulp is None:
            self.verdict.setText("NaN involved: ULP distance undefined")
            _restyle(self.verdict, f"color: {DIFFERENT};")
        else:
            self.verdict.setText(element.distance_text())
            _restyle(self.verdict, f"color: {DIFFERENT};")


def _restyle(label: QLabel, style: str) -> None:
    """setStyleSheet repolishes the widget and relayouts the panel even when the sheet is unchanged;
    on hover that runs for every mouse move, so skip it unless the highlight actually changes."""
    if label.styleSheet() != style:
        label.setStyleSheet(style)
