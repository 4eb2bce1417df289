"""Bit-level metrics of one pair: each kind of difference counted, tolerances never hiding one."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hand_captures import bf16_bits

from sessions.compare.tensor_diff import (
    BLOCK_ELEMENTS,
    DiffAccumulator,
    Tolerance,
    element_maps,
)


def _metrics(native: np.ndarray, oracle: np.ndarray, dtype: str = "bfloat16", tolerance: Tolerance = Tolerance(), **axes):  # type: ignore[no-untyped-def]
    acc = DiffAccumulator(dtype, native.shape, tolerance, **axes)
    acc.add(native, oracle, 0)
    return acc.finish()


def test_identical_bits_are_bit_exact_with_perfect_similarity() -> None:
    x = bf16_bits([1.0, -2.0, 3.5, 0.0])
    m = _metrics(x, x.copy())
    assert m.bit_exact and m.differing == 0 and m.max_ulp == 0 and m.nmse == 0.0 and m.cosine == 1.0


def test_float64_errors_past_its_largest_value_are_infinite_not_a_crash() -> None:
    """An oracle zero's ULP is 4.9e-324, so a native 0.5 against it is 1e323 ULPs of error, past
    float64's largest: report died with an OverflowError, and the window said UNUSABLE."""
    oracle = np.linspace(-1, 1, 8)
    oracle[1] = 0.0
    native = oracle.copy()
    native[1] = 0.5
    m = _metrics(native.view(np.uint64), oracle.view(np.uint64), "float64")
    assert (m.differing, m.max_abs_error, m.max_ulp_error, m.p99_ulp_error) == (1, 0.5, float("inf"), float("inf"))
    assert m.max_ulp == 0x3FE0000000000000 and 0 < m.nmse < 1
    flipped = np.array([1.7e308, 1.0])
    m = _metrics((-flipped).view(np.uint64), flipped.view(np.uint64), "float64")
    assert m.differing == 2 and m.max_abs_error == float("inf") and m.rmse == float("inf")
    assert np.isnan(m.nmse) and np.isnan(m.cosine), "sums past float64's largest leave the ratios undefined, as docs/report-json.md says"


def test_signed_zero_only_difference_is_counted_separately_and_is_one_ulp() -> None:
    native, oracle = bf16_bits([1.0, -0.0, 2.0]), bf16_bits([1.0, 0.0, 2.0])
    m = _metrics(native, oracle)
    assert (m.differing, m.signed_zero_only, m.max_ulp, m.max_abs_error) == (1, 1, 1, 0.0)
    assert m.first_difference is not None and m.first_difference.native_hex == "0x8000"


def test_nan_payload_difference_is_a_bit_difference_without_ulp() -> None:
    native, oracle = np.array([0x7FC0, 0x3F80], np.uint16), np.array([0x7FC1, 0x3F80], np.uint16)
    m = _metrics(native, oracle)
    assert (m.differing, m.nan_payload, m.nan_mismatch, m.max_ulp) == (1, 1, 0, None)
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


@pytest.mark.parametrize(
    ("dtype", "signalling_nan", "one"),
    [("bfloat16", np.array([0x7F81], np.uint16), bf16_bits([1.0])), ("float32", np.array([0x7F800001], np.uint32).view(np.float32), np.float32([1.0]))],
)
def test_a_signalling_nan_is_a_nan_mismatch_without_a_floating_point_warning(dtype: str, signalling_nan: np.ndarray, one: np.ndarray) -> None:
    """Widening a signalling NaN raises the FPU's invalid flag; warnings are errors in this suite."""
    m = _metrics(signalling_nan, one, dtype)
    assert (m.differing, m.nan_mismatch, m.max_abs_error) == (1, 1, 0.0)
    abs_err, rel_err, ulp = element_maps(signalling_nan, one, dtype)
    assert np.isnan(abs_err[0]) and np.isnan(ulp[0])


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


def test_a_diverged_pair_has_the_same_row_and_head_profiles_whole_as_in_chunks_and_as_its_element_map() -> None:
    rng = np.random.default_rng(3)
    oracle = bf16_bits(rng.standard_normal((6, 16)))
    native = oracle ^ rng.integers(0, 4, size=oracle.shape, dtype=np.uint16)
    native[2, 5] = 0x7FC0  # NaN: a differing element without a ULP distance
    axes = {"rows_axis": 0, "head_split": (1, 4)}
    whole = _metrics(native, oracle, **axes)
    acc = DiffAccumulator("bfloat16", native.shape, Tolerance(), **axes)
    for start in (0, 4):
        acc.add(native[start : start + 4], oracle[start : start + 4], start)
    chunked = acc.finish()
    _, _, ulp = element_maps(native, oracle, "bfloat16")
    differs = native != oracle
    ulp = np.nan_to_num(ulp).astype(np.int64)
    assert whole.per_row is not None and whole.per_head is not None
    assert whole.per_row.differing == differs.sum(axis=1).tolist() and whole.per_row.max_ulp == ulp.max(axis=1).tolist()
    by_head = ulp.reshape(6, 4, 4)
    assert whole.per_head.differing == differs.reshape(6, 4, 4).sum(axis=(0, 2)).tolist()
    assert whole.per_head.max_ulp == by_head.max(axis=(0, 2)).tolist()
    assert (chunked.per_row, chunked.per_head) == (whole.per_row, whole.per_head)
    assert whole.differing == int(differs.sum()) > 48


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


def _exact_sums(native: np.ndarray, oracle: np.ndarray, dtype: str) -> tuple[float, float, float]:
    """(rmse, nmse, cosine) in float64 over both-finite positions: the definition, computed plainly."""
    a = (native.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else native).astype(np.float64).reshape(-1)
    b = (oracle.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else oracle).astype(np.float64).reshape(-1)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    diff = float(np.sum((a - b) ** 2))
    return float(np.sqrt(diff / a.size)), diff / float(np.sum(b * b)), float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))


def _chunked(native: np.ndarray, oracle: np.ndarray, rows: int, dtype: str = "bfloat16", reread: bool = True):  # type: ignore[no-untyped-def]
    """Feed the pair in chunks of `rows`; returns the metrics and the row ranges read back."""
    read_back: list[tuple[int, int]] = []

    def reread_oracle(start: int, stop: int) -> np.ndarray:
        read_back.append((start, stop))
        return oracle[start:stop]

    acc = DiffAccumulator(dtype, native.shape, Tolerance(), rows_axis=0, reread_oracle=reread_oracle if reread else None)
    for start in range(0, native.shape[0], rows):
        acc.add(native[start : start + rows], oracle[start : start + rows], start)
    return acc.finish(), read_back


def test_identical_pairs_have_zero_error_and_cosine_one_even_with_zero_norm_or_nan() -> None:
    for values in ([0.0, 0.0, 0.0], [0.0, -0.0, np.nan], [1.0, np.inf, -3.0]):
        x = bf16_bits(values)
        whole = _metrics(x, x.copy())
        chunked, _ = _chunked(x.reshape(3, 1), x.reshape(3, 1).copy(), 1, reread=False)
        for m in (whole, chunked):
            assert m.bit_exact and (m.rmse, m.nmse, m.cosine, m.max_ulp, m.p99_ulp) == (0.0, 0.0, 1.0, 0, 0)


def test_a_difference_past_the_first_block_is_found_with_its_coordinate_and_counted_once_per_element() -> None:
    rng = np.random.default_rng(3)
    native = bf16_bits(rng.standard_normal((3 * BLOCK_ELEMENTS // 1000 + 1, 1000)))
    oracle = native.copy()
    flips = [(0, 5), (BLOCK_ELEMENTS // 1000, 999), (2 * BLOCK_ELEMENTS // 1000 + 3, 0), (native.shape[0] - 1, 999)]
    for r, c in flips:
        oracle[r, c] += 2
    m = _metrics(native, oracle, rows_axis=0)
    assert (m.differing, m.max_ulp, m.ulp_histogram) == (4, 2, [0, 4])
    assert m.first_difference is not None and m.first_difference.coord == [0, 5]
    assert m.per_row is not None and [r for r, n in enumerate(m.per_row.differing) if n] == [r for r, _ in flips]
    rmse, nmse, cosine = _exact_sums(native, oracle, "bfloat16")
    assert m.rmse == pytest.approx(rmse, rel=1e-12) and m.nmse == pytest.approx(nmse, rel=1e-12)
    assert m.cosine == pytest.approx(cosine, rel=1e-12)


def test_identical_leading_chunks_are_read_back_only_when_a_later_chunk_differs() -> None:
    rng = np.random.default_rng(4)
    native = bf16_bits(rng.standard_normal((40, 16)))
    oracle = native.copy()
    oracle[33, 7] ^= 1
    whole = _metrics(native, oracle, rows_axis=0)
    deferred, read_back = _chunked(native, oracle, 8)
    summed_inline, none_read = _chunked(native, oracle, 8, reread=False)
    assert read_back == [(0, 8), (8, 16), (16, 24), (24, 32)] and none_read == []
    for m in (deferred, summed_inline):
        assert m.nmse == pytest.approx(whole.nmse, rel=1e-12) and m.cosine == pytest.approx(whole.cosine, rel=1e-12)
        assert m.rmse == pytest.approx(whole.rmse, rel=1e-12)
        m.nmse, m.cosine, m.rmse = whole.nmse, whole.cosine, whole.rmse
        assert m == whole
    identical, nothing_read = _chunked(native, native.copy(), 8)
    assert identical.bit_exact and nothing_read == []


def test_sums_skip_non_finite_positions_and_survive_float32_overflow() -> None:
    native = np.array([[1e30, np.inf], [3.0, 2.0], [np.nan, 4.0]], np.float32)
    oracle = native.copy()
    oracle[1, 0] = 5.0
    m, _ = _chunked(native, oracle, 1, "float32")
    rmse, nmse, cosine = _exact_sums(native, oracle, "float32")
    assert m.rmse == pytest.approx(rmse, rel=1e-12) and m.nmse == pytest.approx(nmse, rel=1e-12)
    assert m.cosine == pytest.approx(cosine, rel=1e-12)


def test_float16_and_integer_sums_match_the_float64_definition() -> None:
    rng = np.random.default_rng(5)
    halves = rng.standard_normal((64, 32)).astype(np.float16)
    other = halves.copy()
    other[60, 1] = np.float16(7.0)
    ints = rng.integers(-1000, 1000, size=(64, 32), dtype=np.int32)
    ints_other = ints.copy()
    ints_other[2, 2] += 5
    for native, oracle, dtype in ((halves, other, "float16"), (ints, ints_other, "int32")):
        m, _ = _chunked(native, oracle, 16, dtype)
        rmse, nmse, cosine = _exact_sums(native, oracle, dtype)
        assert m.rmse == pytest.approx(rmse, rel=1e-12) and m.nmse == pytest.approx(nmse, rel=1e-12)
        assert m.cosine == pytest.approx(cosine, rel=1e-12)


_METRICS_UNDER_BLAS_THREADS = """
import numpy as np
from sessions.compare.tensor_diff import DiffAccumulator, Tolerance
rng = np.random.default_rng(7)
oracle = rng.standard_normal(1_000_000).astype(np.float32)
native = oracle + rng.standard_normal(oracle.size).astype(np.float32) * np.float32(1e-3)
acc = DiffAccumulator("float32", oracle.shape, Tolerance())
acc.add(native.view(np.uint32), oracle.view(np.uint32), 0)
m = acc.finish()
print(repr(m.nmse), repr(m.cosine))
"""


def test_nmse_and_cosine_read_the_same_whatever_number_of_threads_blas_uses() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    printed = set()
    for threads in ("1", "2"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(root)}
        done = subprocess.run([sys.executable, "-c", _METRICS_UNDER_BLAS_THREADS], env=env, capture_output=True, text=True, timeout=120, check=True)
        printed.add(done.stdout.strip())
    assert len(printed) == 1, f"the last bits follow the thread count: {printed}"


def test_the_worst_ulp_element_is_a_real_difference_where_a_signed_zero_swap_is_as_far() -> None:
    """-0 against +0 is one representable step, as is any 1-ULP difference: the swap came first
    and was named the worst element, in a chunk and across chunks."""
    oracle = bf16_bits([0.0, 1.0, 2.0, 3.0])
    native = oracle.copy()
    native[0], native[2] = 0x8000, native[2] + 1
    m = _metrics(native, oracle)
    assert m.max_ulp == 1 and m.worst_ulp_at is not None and m.worst_ulp_at.coord == [2]
    acc = DiffAccumulator("bfloat16", (2, 2), Tolerance())
    acc.add(native[:2].reshape(1, 2), oracle[:2].reshape(1, 2), 0)
    acc.add(native[2:].reshape(1, 2), oracle[2:].reshape(1, 2), 1)
    assert acc.finish().worst_ulp_at.coord == [1, 0]


def test_a_scalars_element_is_at_the_empty_coordinate_of_its_shape() -> None:
    """It was shown at [0], a coordinate a shape [] has not."""
    acc = DiffAccumulator("float32", (), Tolerance())
    acc.add(np.array([1.5], np.float32).view(np.uint32), np.array([2.5], np.float32).view(np.uint32), 0)
    m = acc.finish()
    assert m.shape == [] and m.first_difference is not None and m.first_difference.coord == [] and m.worst_ulp_at.coord == []
