"""Reading a compared pair back from the comparison alone: no profile, no second alignment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.compare.comparison import Comparison, iter_compare
from sessions.compare.document import dumps, loads
from sessions.compare.options import CompareOptions
from sessions.compare.pair_tensors import iter_read_pair_bits, read_pair_bits
from sessions.progress import Progress, run_to_end

ORACLE_PROFILE = """name = "my-mlx"
[[rule]]
name = "model.layers.{layer}.self_attn.sdpa"
op = "sdpa"
layout = "1 heads rows dim -> rows (heads dim)"
"""


def _heads_rows_dim() -> np.ndarray:
    return bf16_bits(np.random.default_rng(3).standard_normal((4, 64, 8)))


def _captures(tmp_path: Path, oracle_name: str = "model.layers.0.self_attn.sdpa") -> tuple[Path, Path]:
    heads_rows_dim = _heads_rows_dim()
    merged = heads_rows_dim.transpose(1, 0, 2).reshape(64, 32).copy()
    oracle = heads_rows_dim.copy()
    oracle[1, 50, 3] ^= 1
    n = write_capture(tmp_path / "n.h5", "native", [T("kqv_out-0", merged, layer=0, dtype="bfloat16")])
    o = write_capture(tmp_path / "o.h5", "oracle", [T(oracle_name, oracle[None].copy(), layer=0, dtype="bfloat16")])
    return n, o


def _compare_with_user_profile(tmp_path: Path) -> tuple[Path, Path, Comparison]:
    """Compared through a user TOML profile that is deleted afterwards, the way a user's
    edited or moved profile is gone when the pair is viewed."""
    native, oracle = _captures(tmp_path)
    profile = tmp_path / "my-mlx.toml"
    profile.write_text(ORACLE_PROFILE, encoding="utf-8")
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(oracle_profile=str(profile))))
    profile.unlink()
    return native, oracle, loads(dumps(comparison))


def test_both_sides_come_back_in_the_canonical_layout_the_metrics_describe(tmp_path: Path) -> None:
    native, oracle, comparison = _compare_with_user_profile(tmp_path)
    (pair,) = comparison.pairs
    with open_capture(native) as n, open_capture(oracle) as o:
        native_bits, oracle_bits, dtype = read_pair_bits(n, o, pair)
    assert dtype == "bfloat16" and native_bits.shape == oracle_bits.shape == (64, 32)
    assert np.array_equal(native_bits, _heads_rows_dim().transpose(1, 0, 2).reshape(64, 32))
    differing = np.argwhere(native_bits != oracle_bits).tolist()
    assert differing == [[50, 1 * 8 + 3]]
    assert pair.metrics.first_difference is not None and pair.metrics.first_difference.coord == differing[0]


def test_reading_a_pair_reports_progress_per_side(tmp_path: Path) -> None:
    native, oracle, comparison = _compare_with_user_profile(tmp_path)
    with open_capture(native) as n, open_capture(oracle) as o:
        labels = {p.label for p in iter_read_pair_bits(n, o, comparison.pairs[0]) if isinstance(p, Progress)}
    assert labels == {"reading native step 0 prefill layer 0 sdpa", "reading oracle step 0 prefill layer 0 sdpa"}


def test_a_capture_rewritten_since_the_comparison_is_refused_with_the_file_and_record(tmp_path: Path) -> None:
    native, oracle, comparison = _compare_with_user_profile(tmp_path)
    _captures(tmp_path, oracle_name="model.layers.0.self_attn.o_proj")
    with open_capture(native) as n, open_capture(oracle) as o, pytest.raises(CaptureError) as error:
        read_pair_bits(n, o, comparison.pairs[0])
    assert error.value.path == str(oracle) and error.value.location == "record seq 0"
    assert "is 'model.layers.0.self_attn.o_proj' (bfloat16)" in error.value.problem
    assert "the capture changed since it was compared" in error.value.problem
