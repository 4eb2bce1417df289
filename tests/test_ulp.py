"""ULP distance and element decoding on raw bits, bfloat16 included."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sessions.bits.element_info import describe, ulp_between
from sessions.bits.ulp import ordered_line, ulp_distance, ulp_size
from sessions.compare.tensor_diff import DiffAccumulator, Tolerance
from tests.hand_captures import bf16_bits


def test_adjacent_bfloat16_patterns_are_one_ulp_apart() -> None:
    assert ulp_between(0x3F80, 0x3F81, "bfloat16") == 1
    assert ulp_between(0x3F80, 0x3F90, "bfloat16") == 16


def test_negative_and_positive_zero_are_one_ulp_apart_in_every_float_width() -> None:
    assert ulp_between(0x8000, 0x0000, "bfloat16") == 1
    assert ulp_between(0x8000, 0x0000, "float16") == 1
    assert ulp_between(0x8000_0000, 0, "float32") == 1
    assert ulp_between(1 << 63, 0, "float64") == 1


def test_distance_across_zero_counts_every_pattern_between() -> None:
    smallest_negative_subnormal, smallest_positive_subnormal = 0x8001, 0x0001
    assert ulp_between(smallest_negative_subnormal, smallest_positive_subnormal, "bfloat16") == 3


def test_the_ordered_line_is_monotonic_in_value_for_float16() -> None:
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    values = bits.view(np.float16).astype(np.float64)
    keep = ~np.isnan(values)
    order = np.argsort(ordered_line(bits[keep], "float16"), kind="stable")
    assert np.all(np.diff(values[keep][order]) >= 0)


def test_float64_extreme_distance_is_exact() -> None:
    largest = np.array([np.finfo(np.float64).max]).view(np.uint64)
    lowest = np.array([-np.finfo(np.float64).max]).view(np.uint64)
    assert int(ulp_distance(largest, lowest, "float64")[0]) == 2 * 0x7FEF_FFFF_FFFF_FFFF + 1


def test_distance_to_a_nan_is_undefined() -> None:
    assert ulp_between(0x7FC0, 0x3F80, "bfloat16") is None


def test_integer_dtypes_count_units() -> None:
    assert ulp_between(-3, 4, "int8") == 7
    assert ulp_between(0, 2**64 - 1, "uint64") == 2**64 - 1


def test_describe_spells_out_negative_zero() -> None:
    info = describe(0x8000, "bfloat16")
    assert (info.hex, info.decimal, info.sign, info.exponent, info.mantissa) == ("0x8000", "-0.0", 1, 0, 0)
    assert info.is_negative_zero and not info.is_nan


def test_describe_reports_the_nan_payload() -> None:
    info = describe(0x7FC1, "bfloat16")
    assert info.is_nan and info.nan_payload == 0x41 and info.exponent == 0xFF


def test_describe_accepts_numpy_bits_and_reinterprets_them() -> None:
    info = describe(np.float32(1.5).view(np.uint32), "float32")
    assert (info.hex, info.decimal, info.exponent, info.mantissa) == ("0x3fc00000", "1.5", 127, 1 << 22)


def test_describe_rejects_bits_wider_than_the_dtype() -> None:
    with pytest.raises(ValueError):
        describe(0x1_0000, "bfloat16")


def test_ulp_size_is_the_grid_spacing_at_the_value_and_the_subnormal_spacing_at_zero() -> None:
    bits = bf16_bits([1.0, 1.5, 2.0, -0.000865936279296875, 0.0, -0.0])
    assert ulp_size(bits, "bfloat16").tolist() == [2.0**-7, 2.0**-7, 2.0**-6, 2.0**-18, 2.0**-133, 2.0**-133]
    assert ulp_size(np.array([1.0, 2.0**-149], dtype=np.float32).view(np.uint32), "float32").tolist() == [2.0**-23, 2.0**-149]


def test_ulp_error_stays_small_where_a_value_flips_sign_near_zero() -> None:
    native = np.array([0x3A8D, 0x3F81], dtype=np.uint16)
    oracle = np.array([0xBA63, 0x3F80], dtype=np.uint16)
    accumulator = DiffAccumulator("bfloat16", (2,), Tolerance())
    accumulator.add(native, oracle)
    metrics = accumulator.finish()
    assert metrics.max_ulp == 29937
    near_zero = (0.00107574462890625 + 0.000865936279296875) / 2.0**-18
    assert metrics.max_ulp_error == pytest.approx(near_zero) and 500 < near_zero < 520
    assert near_zero <= metrics.p99_ulp_error < near_zero * 2 ** (1 / 8)


def test_a_pair_differing_only_in_the_sign_of_zero_has_a_p99_ulp_error_of_0_like_its_max() -> None:
    native = np.array([0x8000, 0x3F80, 0x0000], dtype=np.uint16)
    oracle = np.array([0x0000, 0x3F80, 0x8000], dtype=np.uint16)
    accumulator = DiffAccumulator("bfloat16", (3,), Tolerance())
    accumulator.add(native, oracle)
    metrics = accumulator.finish()
    assert (metrics.differing, metrics.signed_zero_only) == (2, 2)
    assert metrics.max_ulp_error == 0.0 and metrics.p99_ulp_error == 0.0, "a percentile is never above the largest value"


def test_an_oracle_zero_does_not_decide_the_p99_ulp_error() -> None:
    oracle = bf16_bits(np.linspace(1.0, 1.5, 200))
    native = oracle + 3
    oracle[0], native[0] = 0x0000, 0x3B80
    accumulator = DiffAccumulator("bfloat16", (200,), Tolerance())
    accumulator.add(native, oracle)
    metrics = accumulator.finish()
    assert metrics.max_ulp_error > 1e30
    assert 3 <= metrics.p99_ulp_error < 3 * 2 ** (1 / 8)


@pytest.mark.parametrize("logical, values, infinity", [("bfloat16", ml_dtypes.bfloat16, 0x7F80), ("float16", np.float16, 0x7C00)])
def test_every_finite_16_bit_pattern_has_the_ulp_of_the_step_to_its_successor_and_sits_one_step_from_it(logical: str, values: type, infinity: int) -> None:
    patterns = np.arange(infinity - 1, dtype=np.uint16)
    successors = patterns + np.uint16(1)
    steps = successors.view(values).astype(np.float64) - patterns.view(values).astype(np.float64)
    assert np.array_equal(ulp_size(patterns, logical), steps)
    assert np.array_equal(ulp_size(patterns | np.uint16(0x8000), logical), steps)
    assert set(ulp_distance(patterns, successors, logical).tolist()) == {1}
    assert set(ulp_distance(patterns | np.uint16(0x8000), successors | np.uint16(0x8000), logical).tolist()) == {1}


@pytest.mark.parametrize("logical, largest_finite, sign", [("float32", np.uint32(0x7F7F_FFFF), np.uint32(1 << 31)), ("float64", np.uint64(0x7FEF_FFFF_FFFF_FFFF), np.uint64(1 << 63))])
def test_the_widest_distance_spans_the_whole_line_from_the_most_negative_to_the_largest_finite(logical: str, largest_finite: np.unsignedinteger, sign: np.unsignedinteger) -> None:
    positive = np.array([largest_finite])
    assert ulp_distance(positive | sign, positive, logical).tolist() == [2 * int(largest_finite) + 1]
    assert ulp_distance(positive, positive | sign, logical).tolist() == [2 * int(largest_finite) + 1]
