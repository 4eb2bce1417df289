"""The one identity of an op and of a record, and the one text form of an op.

Every surface names a place in a run the same way: the CLI prints `0:visual:0:sdpa`, the JSON
carries it, `rerun --op` and `diagnose --op` take it back, sessions store it, and the viewer finds
a tree row by it. Nothing is matched by display text, so a label can change without breaking a
link between two surfaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from sessions.capture.reader import Record

KEY_SYNTAX = (
    "STEP:SEGMENT:LAYER:OP[#OCCURRENCE][@FIRST[-LAST]] "
    "(e.g. 0:visual:0:sdpa, 1:decode:-1:logits, 0:visual:2:q_rope#1, 0:prefill:3:ffn_down@5-1012)"
)


class OpKey(NamedTuple):
    """One canonical op at one place in the run: what alignment pairs records by.

    Layer -1 is a model-level op (embed, final_norm, logits). Occurrence counts repeats of the
    same canonical op within (step, segment, layer) -- rare once a profile has mapped names.
    `positions` is set when the runs were cut into different calls and this pair is the token
    positions [first, stop) of the native call at (step, segment) (docs/profiles.md, "Alignment
    modes"); empty when the pair is whole calls on both sides.

    A named tuple, not a dataclass: a real run's alignment builds, hashes and compares hundreds
    of thousands of keys, which a tuple does in C."""

    step: int
    segment: str
    layer: int
    op: str
    occurrence: int = 0
    positions: tuple[int, ...] = ()

    def _positions_text(self, first_last: str) -> str:
        if not self.positions:
            return ""
        first, last = self.positions[0], self.positions[1] - 1
        return f"{first}" if first == last else f"{first}{first_last}{last}"

    def text(self) -> str:
        occurrence = f"#{self.occurrence}" if self.occurrence else ""
        positions = f"@{self._positions_text('-')}" if self.positions else ""
        return f"{self.step}:{self.segment}:{self.layer}:{self.op}{occurrence}{positions}"

    def __str__(self) -> str:
        return self.text()

    def label(self) -> str:
        """The same place in words, for sentences ("first bit difference: step 0 visual layer 0 sdpa")."""
        layer = "" if self.layer < 0 else f" layer {self.layer}"
        occurrence = f"#{self.occurrence}" if self.occurrence else ""
        positions = ""
        if self.positions:
            word = "position" if self.positions[1] - self.positions[0] == 1 else "positions"
            positions = f" {word} {self._positions_text('–')}"
        return f"step {self.step} {self.segment}{layer} {self.op}{occurrence}{positions}"

    def whole_call(self) -> OpKey:
        """The same op without a position range: the key of the call it is cut from."""
        return OpKey(self.step, self.segment, self.layer, self.op, self.occurrence)

    @classmethod
    def parse(cls, text: str) -> OpKey:
        """The inverse of `text`; ValueError names what is wrong and shows the syntax (TypeError:
        `text` is no text at all, as a damaged document's null)."""
        if not isinstance(text, str):
            raise TypeError(f"an op key is text ({KEY_SYNTAX}), not {text!r}")
        parts = text.strip().split(":")
        if len(parts) != 4 or not all(parts):
            raise ValueError(f"key {text!r} is not {KEY_SYNTAX}")
        step, segment, layer, op = parts
        span = ""
        if "@" in op:
            op, span = op.split("@", 1)
        occurrence = "0"
        if "#" in op:
            op, occurrence = op.split("#", 1)
        try:
            first, _, last = span.partition("-")
            positions = (int(first), int(last or first) + 1) if span else ()
            key = cls(int(step), segment, int(layer), op, int(occurrence), positions)
        except ValueError:
            raise ValueError(f"key {text!r}: STEP, LAYER, OCCURRENCE and positions must be integers; the syntax is {KEY_SYNTAX}") from None
        if not op or key.step < 0 or key.layer < -1 or key.occurrence < 0 or (positions and not 0 <= positions[0] < positions[1]):
            raise ValueError(f"key {text!r} is not {KEY_SYNTAX}")
        return key


class KeyParser:
    """`OpKey.parse` for the many keys of one document: a run's keys differ in their step and
    repeat the rest every token step, so the text after the step is parsed once. A real model's
    220,000 pair keys took 0.3 s to parse one by one, a third of reading its cached result."""

    def __init__(self) -> None:
        self._after_step: dict[str, tuple[str, int, str, int, tuple[int, ...]]] = {}

    def __call__(self, text: str) -> OpKey:
        if not isinstance(text, str):
            return OpKey.parse(text)
        step, _, after = text.partition(":")
        known = self._after_step.get(after)
        if known is not None and step.isascii() and step.isdigit() and len(step) < 19:  # past int64, parse names the problem
            return tuple.__new__(OpKey, (int(step), *known))
        key = OpKey.parse(text)
        self._after_step[after] = key[1:]
        return key


@dataclass(frozen=True, order=True)
class RecordKey:
    """One engine-native record, named as the engine named it: stable across re-captures,
    unlike its seq, so saved overrides still mean the same records after a new run."""

    step: int
    segment: str
    layer: int
    name: str
    occurrence: int = 0

    @classmethod
    def of(cls, record: Record) -> RecordKey:
        return cls(record.step, record.segment, record.layer, record.name, record.occurrence)


class Keyed(Protocol):
    @property
    def key(self) -> OpKey: ...


KeyedT = TypeVar("KeyedT", bound=Keyed)


def grouped_by_key(items: Iterable[KeyedT]) -> dict[OpKey, list[KeyedT]]:
    """Findings (contract findings, dispatch differences) by the op they name, in their order."""
    grouped: dict[OpKey, list[KeyedT]] = {}
    for item in items:
        grouped.setdefault(item.key, []).append(item)
    return grouped
