"""Exporting a shown slice gives a script the engine's numbers: integers stay integers, exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sessions.compare.slice_export import exported_values, iter_export
from sessions.progress import run_to_end


def test_int32_values_and_their_difference_are_written_whole_to_csv(tmp_path: Path) -> None:
    """`%.9g` wrote 1000000001 as 1e+09 and 2147483647 as 2.14748365e+09."""
    native = np.array([[1_000_000_001, 2_147_483_647]], np.int32)
    oracle = np.array([[1_000_000_000, -2_147_483_648]], np.int32)
    for what, expected in (("native", "1000000001,2147483647"), ("oracle", "1000000000,-2147483648"), ("difference", "1,4294967295")):
        path = run_to_end(iter_export(native, oracle, "int32", what, tmp_path / f"{what}.csv"))
        assert path.read_text().strip() == expected, what


def test_bools_export_as_0_and_1_and_floats_keep_their_widening() -> None:
    mask = np.array([True, False])
    values, difference = exported_values(mask, ~mask, "bool", "native"), exported_values(mask, ~mask, "bool", "difference")
    assert (values.dtype, values.tolist()) == (np.uint8, [1, 0])
    assert (difference.dtype, difference.tolist()) == (np.int64, [1, -1])
    halves = np.array([0x3C00], np.uint16)
    assert exported_values(halves, halves, "float16", "native").dtype == np.float32
