"""Execution state is compared before any tensor data, and fails closed."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture import format as cf
from sessions.capture.opening import open_capture
from sessions.capture.reader import CaptureError
from sessions.compare.comparison import iter_compare
from sessions.compare.contracts import (
    KERNEL_CONTRACT_MISMATCH,
    ROUTE_MISSING,
    ROUTE_UNVALIDATED,
)

X = bf16_bits(np.arange(12, dtype=np.float32).reshape(3, 4))


def _sdpa(name: str, kernel: str, declared: str, effective: str) -> T:
    data = X[None, None].copy() if name.startswith("model.") else X
    return T(name, data, layer=0, dtype="bfloat16", kernel_id=kernel, contract_id=declared, effective_contract_id=effective)


def _findings(tmp_path: Path, native: T, oracle: T, same_engine: bool = False) -> list[tuple[str, str]]:
    n = write_capture(tmp_path / "n.h5", "native", [native], engine_name="e" if same_engine else "native-engine")
    o = write_capture(tmp_path / "o.h5", "oracle", [oracle], engine_name="e" if same_engine else "oracle-engine")
    with open_capture(n) as a, open_capture(o) as b:
        work = iter_compare(a, b)
        while True:
            try:
                next(work)
            except StopIteration as stop:
                return [(f.kind, f.detail) for f in stop.value.contracts.findings]


def test_contract_mismatch_is_reported_before_any_tensor_is_read(tmp_path: Path) -> None:
    native = write_capture(tmp_path / "n.h5", "native", [_sdpa("sdpa", "k", "attn.single", "attn.single")], layout="datasets")
    oracle = write_capture(tmp_path / "o.h5", "oracle", [_sdpa("sdpa", "k", "attn.tiled", "attn.tiled")], layout="datasets")
    for path in (native, oracle):
        with h5py.File(path, "r+") as f:
            del f[cf.tensor_path(0)]
    labels: list[str] = []
    with open_capture(native, check_in_child=False) as n, open_capture(oracle, check_in_child=False) as o:
        work = iter_compare(n, o)
        with pytest.raises(CaptureError, match="t00000000"):
            for progress in work:
                labels.append(progress.label)
    assert any("1 contract finding" in label for label in labels)


def test_differing_effective_contracts_are_a_kernel_contract_mismatch(tmp_path: Path) -> None:
    profile_routes = ("attn.auto_qtile64", "attn.bf16.single_range", "attn.f32.tiled64x64")
    found = _findings(
        tmp_path,
        _sdpa("kqv_out-0", "native.attention", profile_routes[0], profile_routes[1]),
        _sdpa("model.layers.0.self_attn.sdpa", "oracle.kernel", profile_routes[0], profile_routes[2]),
    )
    assert [kind for kind, _ in found] == [KERNEL_CONTRACT_MISMATCH]
    assert "effective_contract_id" in found[0][1]


def test_kernel_ids_are_compared_only_between_captures_of_the_same_engine(tmp_path: Path) -> None:
    native, oracle = _sdpa("sdpa", "kernel.a", "c", "c"), _sdpa("sdpa", "kernel.b", "c", "c")
    assert _findings(tmp_path, native, oracle, same_engine=False) == []
    assert [k for k, _ in _findings(tmp_path, native, oracle, same_engine=True)] == [KERNEL_CONTRACT_MISMATCH]


def test_a_record_without_its_effective_route_fails_closed(tmp_path: Path) -> None:
    found = _findings(tmp_path, _sdpa("sdpa", "k", "c", ""), _sdpa("sdpa", "k", "c", "c"))
    assert ROUTE_MISSING in [kind for kind, _ in found]


def test_a_route_the_declared_contract_does_not_validate_fails_closed(tmp_path: Path) -> None:
    found = _findings(tmp_path, _sdpa("sdpa", "k", "c.plain", "c.other"), _sdpa("sdpa", "k", "c.plain", "c.other"))
    assert [kind for kind, _ in found] == [ROUTE_UNVALIDATED, ROUTE_UNVALIDATED]
