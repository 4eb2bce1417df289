"""A long run drawn into a few pixels: its ops cut into equal stretches, each shown by its extremes.

The viewer's Overview and the HTML report's error growth both draw runs of hundreds of thousands
of ops into about a thousand pixels. Both cut the run the same way: op j of `total` falls in
stretch j * bins // total.
"""

from __future__ import annotations

import numpy as np


def worst_per_bin(ops: np.ndarray, y: np.ndarray, total: int, bins: int) -> np.ndarray:
    """Of `ops` (ascending op positions, `y` their values), the one with the largest value in
    each of `bins` equal stretches of the run's `total` ops (the first of equals); all of them
    for a run of at most `bins` ops."""
    if total <= bins or not ops.size:
        return ops
    stretch = ops * bins // total
    order = np.lexsort((-y, stretch))
    first = np.concatenate(([True], stretch[order][1:] != stretch[order][:-1]))
    return np.sort(ops[order][first])


def bin_envelope(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first op, lowest value, highest value) of each of `bins` equal stretches of the run
    `values` holds one value per op of; each op on its own for a run of at most `bins` ops."""
    count = len(values)
    if count <= bins:
        return np.arange(count), values, values
    starts = np.flatnonzero(np.diff(np.arange(count) * bins // count, prepend=-1))
    return starts, np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
