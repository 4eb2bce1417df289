"""Bit-level metrics of one pair: each kind of difference counted, tolerances never hiding one."""

from __future__ import annotations

import numpy as np
import pytest

from sessions.tensor_diff import DiffAccumulator, Tolerance, element_maps
from hand_captures import bf16_bits


def _metrics(native: np.ndarray, oracle: np.ndarray, dtype: str = "bfloat16", tolerance: Tolerance = Tolerance(), **axes):  # type: ignore[no-untyped-def]
    acc = DiffAccumulator(dtype, native.shape, tolerance, **axes)
    acc.add(native, oracle, 0)
    return acc.finish()


def test_identical_bits_are_bit_exact_with_perfect_similarity() -> None:
    x = bf16_bits([1.0, -2.0, 3.5, 0.0])
    m = _metrics(x, x.copy())
    assert m.bit_exact and m.differing == 0 and m.max_ulp == 0 and m.nmse == 0.0 and m.cosine == 1.0


def test_signed_zero_only_difference_is_counted_separately_and_is_one_ulp() -> None:
    native, oracle = bf16_bits([1.0, -0.0, 2.0]), bf16_bits([1.0, 0.0, 2.0])
    m = _metrics(native, oracle)
    assert (m.differing, m.signed_zero_only, m.max_ulp, m.max_abs_error) == (1, 1, 1, 0.0)
    assert m.first_difference is not None and m.first_difference.native_hex == "0x8000"


def test_nan_payload_difference_is_a_bit_difference_without_ulp() -> None:
    native, oracle = np.array([0x7FC0, 0x3F80], np.uint16), np.array([0x7FC1, 0x3F80], np.uint16)
    m = _metrics(native, oracle)
    assert (m.differing, m.nan_payload, m.nan_mismatch, m.max_ulp) == (1, 1, 0, 0)
    assert m.first_difference is not None and m.first_difference.ulp is None


def test_nan_against_a_number_is_a_nan_mismatch() -> None:
    m = _metrics(np.array([0x7FC0], np.uint16), np.array([0x3F80], np.uint16))
    assert (m.nan_mismatch, m.nan_payload) == (1, 0)


def test_single_ulp_flip_in_bfloat16_names_the_element_and_both_values() -> None:
    native = bf16_bits(np.linspace(-1, 1, 200).reshape(10, 20))
    oracle = native.copy()
    oracle[1, 2] ^= 1
    m = _metrics(native, oracle, rows_axis=0)
    assert (m.differing, m.max_ulp, m.p99_ulp, m.ulp_histogram) == (1, 1, 0, [1])
    assert m.worst_ulp_at is not None and m.worst_ulp_at.coord == [1, 2]
    assert m.worst_ulp_at.native_hex == f"0x{int(native[1, 2]):04x}" and m.worst_ulp_at.oracle_hex == f"0x{int(oracle[1, 2]):04x}"
    assert m.per_row is not None and m.per_row.differing == [0, 1] + [0] * 8


def test_inf_sign_flip_is_counted_as_inf_mismatch_and_sign() -> None:
    m = _metrics(bf16_bits([np.inf, 1.0]), bf16_bits([-np.inf, 1.0]))
    assert (m.inf_mismatch, m.inf_sign, m.differing) == (1, 1, 1)
    assert m.rmse == 0.0


def test_tolerance_changes_the_verdict_but_never_the_counts() -> None:
    native, oracle = bf16_bits([1.0, 2.0]), bf16_bits([1.0, 2.0])
    oracle[1] ^= 1
    exact = _metrics(native, oracle)
    loose = _metrics(native, oracle, tolerance=Tolerance(atol=0.1))
    tight_ulp = _metrics(native, oracle, tolerance=Tolerance(max_ulp=0))
    assert exact.differing == loose.differing == tight_ulp.differing == 1
    assert (exact.beyond_tolerance, loose.beyond_tolerance, tight_ulp.beyond_tolerance) == (1, 0, 1)


def test_nmse_follows_llama_cpp_definition_over_the_oracle() -> None:
    native, oracle = np.array([1.0, 3.0], np.float32), np.array([1.0, 2.0], np.float32)
    m = _metrics(native, oracle, "float32")
    assert m.nmse == 1.0 / 5.0
    assert abs(m.rmse - np.sqrt(0.5)) < 1e-12
    assert abs(m.cosine - 7.0 / np.sqrt(10.0 * 5.0)) < 1e-12


def test_chunked_accumulation_equals_whole_pair() -> None:
    rng = np.random.default_rng(0)
    native = bf16_bits(rng.standard_normal((64, 8)))
    oracle = native.copy()
    oracle[[3, 40, 41], [1, 2, 7]] += np.array([1, 3, 200], np.uint16)
    whole = _metrics(native, oracle, rows_axis=0)
    acc = DiffAccumulator("bfloat16", native.shape, Tolerance(), rows_axis=0)
    for start in range(0, 64, 16):
        acc.add(native[start : start + 16], oracle[start : start + 16], start)
    chunked = acc.finish()
    assert chunked.nmse == pytest.approx(whole.nmse, rel=1e-6) and chunked.cosine == pytest.approx(whole.cosine, rel=1e-9)
    chunked.nmse, chunked.cosine = whole.nmse, whole.cosine
    assert chunked == whole
    assert whole.first_difference is not None and whole.first_difference.coord == [3, 1]


def test_per_head_profile_splits_the_merged_head_axis() -> None:
    native = bf16_bits(np.ones((2, 6)))
    oracle = native.copy()
    oracle[1, 4] ^= 2
    m = _metrics(native, oracle, rows_axis=0, head_split=(1, 3))
    assert m.per_head is not None and m.per_head.differing == [0, 0, 1] and m.per_head.max_ulp == [0, 0, 2]


def test_integer_tensors_diff_in_units() -> None:
    m = _metrics(np.array([1, 5, -2], np.int32), np.array([1, 2, -2], np.int32), "int32")
    assert (m.differing, m.max_ulp, m.max_abs_error) == (1, 3, 3.0)


def test_element_maps_mark_signed_zero_nan_and_inf() -> None:
    native = np.array([0x8000, 0x7FC0, 0x7F80, 0x3F80], np.uint16)
    oracle = np.array([0x0000, 0x7FC1, 0xFF80, 0x3F80], np.uint16)
    abs_err, rel_err, ulp = element_maps(native, oracle, "bfloat16")
    assert abs_err[0] == 0.0 and ulp[0] == 1.0
    assert np.isnan(ulp[1]) and np.isnan(abs_err[1])
    assert np.isinf(abs_err[2]) and np.isinf(rel_err[2]) and ulp[2] == 2 * 0x7F80 + 1
    assert (abs_err[3], rel_err[3], ulp[3]) == (0.0, 0.0, 0.0)
