"""Writing one side of a shown slice, or their difference, to .npy or CSV for the user's own scripts.

Values are widened exactly (16-bit floats to float32, which holds every bf16 and f16 value), so
a script that reads the file sees the engine's numbers, not a rounded copy; the difference is
native - oracle in float64. CSV is written a few rows at a time and yields progress, so a large
slice never blocks the window, and closing the generator stops it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from sessions.bits.dtypes import as_values
from sessions.progress import Progress, ProgressGenerator

WHAT = ("native", "oracle", "difference")
FORMATS = (".npy", ".csv")
ROWS_PER_STEP = 256


def exported_values(native_bits: np.ndarray, oracle_bits: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """Integers and bools stay integers, and their difference is exact in int64 up to 32 bits (a
    64-bit integer's difference is float64); floats widen as the module says."""
    if what not in WHAT:
        raise ValueError(f"export one of {', '.join(WHAT)}, not {what!r}")
    native, oracle = as_values(native_bits, dtype), as_values(oracle_bits, dtype)
    integral = native.dtype.kind in "iub"
    if what == "difference":
        wide = np.int64 if integral and native.dtype.itemsize <= 4 else np.float64
        return native.astype(wide) - oracle.astype(wide)
    values = native if what == "native" else oracle
    if integral:
        return values.astype(np.uint8) if values.dtype.kind == "b" else np.asarray(values)
    return values.astype(np.float32) if values.dtype.itemsize < 4 else np.asarray(values)


def iter_export(native_bits: np.ndarray, oracle_bits: np.ndarray, dtype: str, what: str, path: Path) -> ProgressGenerator[Path]:
    """Write `what` to `path` (by its suffix) atomically: a cancelled or failed export leaves no partial file."""
    if path.suffix not in FORMATS:
        raise ValueError(f"{path.name}: export to {' or '.join(FORMATS)}")
    values = exported_values(native_bits, oracle_bits, dtype, what)
    rows = values.reshape(values.shape[0] if values.ndim else 1, -1)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            if path.suffix == ".npy":
                yield Progress(0, 1, f"writing {path.name}")
                np.save(handle, values)
            else:
                text_format = "%d" if values.dtype.kind in "iu" else "%.17g" if values.dtype == np.float64 else "%.9g"
                for start in range(0, rows.shape[0], ROWS_PER_STEP):
                    np.savetxt(handle, rows[start : start + ROWS_PER_STEP], fmt=text_format, delimiter=",")
                    yield Progress(min(start + ROWS_PER_STEP, rows.shape[0]), rows.shape[0], f"writing {path.name}")
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return path
