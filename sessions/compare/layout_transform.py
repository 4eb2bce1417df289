"""Bit-preserving layout transforms written as `input axes -> output axes` (einops-style).

Engines store the same tensor in different layouts ([1, heads, rows, dim] vs [rows, heads*dim]);
a profile states the transform that brings a record to its canonical layout. Axis sizes are
bound from the record's shape, so one spec serves every layer, head count and row count:

    "1 heads rows dim -> rows (heads dim)"

`1` on the left is an axis that must have size 1 and is dropped; names on the right must be
exactly the names on the left; parentheses on the right merge axes. Only squeeze, transpose
and merge are expressible -- each moves bits, none computes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_TOKEN = re.compile(r"\(|\)|[A-Za-z_][A-Za-z0-9_]*|1")


class LayoutError(ValueError):
    """A spec that cannot be parsed, or a shape it does not fit."""


def _tokens(text: str, spec: str) -> list[str]:
    stripped = re.sub(r"\s+", " ", text).strip()
    tokens = _TOKEN.findall(stripped)
    if "".join(tokens) != stripped.replace(" ", ""):
        raise LayoutError(f"layout {spec!r}: unexpected characters in {text!r}")
    return tokens


@dataclass(frozen=True)
class LayoutTransform:
    spec: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, spec: str) -> "LayoutTransform":
        if spec.count("->") != 1:
            raise LayoutError(f"layout {spec!r}: needs exactly one '->'")
        left, right = spec.split("->")
        inputs = tuple(_tokens(left, spec))
        if "(" in inputs or ")" in inputs:
            raise LayoutError(f"layout {spec!r}: groups are allowed only on the right (merging axes)")
        names = [n for n in inputs if n != "1"]
        if len(set(names)) != len(names):
            raise LayoutError(f"layout {spec!r}: an axis name repeats on the left")
        outputs: list[tuple[str, ...]] = []
        group: list[str] | None = None
        for token in _tokens(right, spec):
            if token == "(":
                if group is not None:
                    raise LayoutError(f"layout {spec!r}: nested parentheses")
                group = []
            elif token == ")":
                if not group:
                    raise LayoutError(f"layout {spec!r}: empty or unopened group")
                outputs.append(tuple(group))
                group = None
            elif token == "1":
                raise LayoutError(f"layout {spec!r}: '1' is allowed only on the left")
            elif group is not None:
                group.append(token)
            else:
                outputs.append((token,))
        if group is not None:
            raise LayoutError(f"layout {spec!r}: unclosed parenthesis")
        flat = [n for g in outputs for n in g]
        if sorted(flat) != sorted(names):
            raise LayoutError(f"layout {spec!r}: the right side must use each left-side name exactly once")
        return cls(spec, inputs, tuple(outputs))

    def _bind(self, shape: tuple[int, ...]) -> dict[str, int]:
        if len(shape) != len(self.inputs):
            raise LayoutError(f"layout {self.spec!r} expects {len(self.inputs)} axes, the record has shape {list(shape)}")
        sizes: dict[str, int] = {}
        for name, size in zip(self.inputs, shape):
            if name == "1":
                if size != 1:
                    raise LayoutError(f"layout {self.spec!r} expects size 1 where shape {list(shape)} has {size}")
            else:
                sizes[name] = size
        return sizes

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        sizes = self._bind(shape)
        return tuple(int(np.prod([sizes[n] for n in g], dtype=np.int64)) for g in self.outputs)

    def apply(self, array: np.ndarray) -> np.ndarray:
        sizes = self._bind(array.shape)
        kept = [i for i, n in enumerate(self.inputs) if n != "1"]
        squeezed = array.reshape([array.shape[i] for i in kept])
        names = [self.inputs[i] for i in kept]
        order = [names.index(n) for g in self.outputs for n in g]
        moved = np.transpose(squeezed, order)
        return moved.reshape([int(np.prod([sizes[n] for n in g], dtype=np.int64)) for g in self.outputs])

    def chunk_axis(self) -> int | None:
        """The input axis whose index ranges give contiguous ranges of output axis 0.

        That is the input axis of the leading name of output axis 0 (a group is row-major,
        so a range of its leading name is a contiguous block). None for a 0-d output.
        """
        if not self.outputs:
            return None
        return self.inputs.index(self.outputs[0][0])

    def rows_per_unit(self, shape: tuple[int, ...]) -> int:
        """How many output-axis-0 rows one index of the chunk axis becomes."""
        sizes = self._bind(shape)
        return int(np.prod([sizes[n] for n in self.outputs[0][1:]], dtype=np.int64))
