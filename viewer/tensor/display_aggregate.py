"""Shrink a 2-D map to screen resolution without hiding a single differing element.

A 1008 x 16384 tensor has 60x more columns than a screen has pixels. Error maps are reduced
with a block maximum, so one flipped bit still lights its block; values with a block mean
(silx `image_aggregated` does the same trade). This is display only: every number the
inspector shows is read from the full-resolution bits.
"""

from __future__ import annotations

import math

import numpy as np

MAX_DISPLAY = 768
"""Largest image side shown; above it, blocks of elements become one pixel. Each heatmap gets
well under 768 screen pixels a side at 1440 x 900, and painting cost grows with pixel count."""


def block_factors(shape: tuple[int, int], limit: int = MAX_DISPLAY) -> tuple[int, int]:
    return (max(1, math.ceil(shape[0] / limit)), max(1, math.ceil(shape[1] / limit)))


def _blocks(array: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    fy, fx = factors
    rows, cols = array.shape
    pad = ((0, (-rows) % fy), (0, (-cols) % fx))
    if pad[0][1] or pad[1][1]:
        array = np.pad(array, pad, mode="edge")
    return array.reshape(array.shape[0] // fy, fy, array.shape[1] // fx, fx)


def block_max(array: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    if factors == (1, 1):
        return array
    return _blocks(array, factors).max(axis=(1, 3))


def finite_for_display(image: np.ndarray) -> np.ndarray:
    """Inf/NaN (an Inf involved, an undefined distance) drawn at the top of the scale, never as holes."""
    finite = np.isfinite(image)
    if finite.all():
        return image
    top = float(image[finite].max()) if finite.any() else 1.0
    bottom = float(image[finite].min()) if finite.any() else 0.0
    return np.nan_to_num(image, nan=top, posinf=top, neginf=bottom)


def levels_of(*images: np.ndarray, floor: float | None = None) -> tuple[float, float]:
    """(low, high) over finite images; `floor` pins the low end (error maps start at 0)."""
    lows = [float(i.min()) for i in images if i.size]
    highs = [float(i.max()) for i in images if i.size]
    low = floor if floor is not None else (min(lows) if lows else 0.0)
    high = max(highs) if highs else 1.0
    return (low, high) if high > low else (low, low + 1.0)


def to_rgba(image: np.ndarray, levels: tuple[float, float], lut: np.ndarray) -> np.ndarray:
    """Colour an image with a 256-entry RGBA table off the UI thread, so painting is a copy."""
    low, high = levels
    with np.errstate(over="ignore", invalid="ignore"):  # values near float32's limits: clipped to the table's ends
        index = np.clip((image - low) * (255.0 / (high - low)), 0, 255).astype(np.uint8)
    return lut[index]


def block_mean(array: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    if factors == (1, 1):
        return array.astype(np.float32, copy=False)
    with np.errstate(all="ignore"):
        return _blocks(array.astype(np.float32, copy=False), factors).mean(axis=(1, 3), dtype=np.float32)
