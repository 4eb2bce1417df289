"""Execution-state check: kernel and numerical contract of every aligned pair, before any data.

Parity is a property of the executed circuit. When the two sides ran different kernels, or
the same kernel under a different declared or shape-selected (effective) contract, their
tensors are not expected to agree and reading them would only produce a misleading diff --
so this check runs on index metadata alone, first, and fails closed:

- KERNEL_CONTRACT_MISMATCH: the effective contract ids differ -- always; the kernel ids or
  declared contract ids differ -- when both captures come from the same engine (across
  engines those are each engine's own names for its kernels, and only the effective
  contract, the arithmetic that actually ran, is comparable).
- ROUTE_MISSING: a record names some of kernel / declared / effective contract but not all.
- ROUTE_UNVALIDATED: the effective contract is neither the declared one nor a route the
  profiles (or the capture's provenance "contracts" table) validate for that composite.

A pair where neither record names any of the three ids has nothing to compare; it is counted
as unrecorded, not as a failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sessions.capture.reader import Record
from sessions.compare.aligned_pairs import AlignedPair, AlignedPairs
from sessions.compare.key import OpKey, grouped_by_key

KERNEL_CONTRACT_MISMATCH = "KERNEL_CONTRACT_MISMATCH"
ROUTE_MISSING = "ROUTE_MISSING"
ROUTE_UNVALIDATED = "ROUTE_UNVALIDATED"
KIND_WORDS: dict[str, str] = {
    KERNEL_CONTRACT_MISMATCH: "kernel or contract differs",
    ROUTE_MISSING: "contract route incomplete",
    ROUTE_UNVALIDATED: "contract route not validated",
}
"""Each finding kind in the words every sentence uses; the JSON's `kind` field keeps the code."""


@dataclass
class ContractIds:
    kernel_id: str
    contract_id: str
    effective_contract_id: str


@dataclass
class ContractFinding:
    kind: str
    key: OpKey
    """The aligned pair's key."""
    native: ContractIds
    oracle: ContractIds
    detail: str

    def text(self) -> str:
        """The finding as every sentence says it: its kind in words, then its detail."""
        return f"{KIND_WORDS[self.kind]}: {self.detail}"


@dataclass
class ContractCheck:
    findings: list[ContractFinding]
    checked: int
    unrecorded: int

    def by_key(self) -> dict[OpKey, list[ContractFinding]]:
        return grouped_by_key(self.findings)


def _ids(record: Record) -> ContractIds:
    return ContractIds(record.kernel_id, record.contract_id, record.effective_contract_id)


def _route_problem(record: Record, routes: Mapping[str, tuple[str, ...]]) -> tuple[str, str] | None:
    if not (record.contract_id or record.effective_contract_id):
        return None  # a kernel id alone declares no contract (real-engine recorders name only the op)
    missing = [n for n in ("kernel_id", "contract_id", "effective_contract_id") if not getattr(record, n)]
    if missing:
        return ROUTE_MISSING, f"{record.name!r} (seq {record.seq}) names no {' / '.join(missing)}"
    declared = record.contract_id
    if record.effective_contract_id == declared or record.effective_contract_id in routes.get(declared, ()):
        return None
    return ROUTE_UNVALIDATED, (
        f"{record.name!r} (seq {record.seq}): route {record.effective_contract_id!r} is not validated for {declared!r}"
    )


def _pair_findings(pair: AlignedPair, routes: Mapping[str, tuple[str, ...]], same_engine: bool) -> list[ContractFinding]:
    n, o = pair.native.record, pair.oracle.record
    n_ids, o_ids = _ids(n), _ids(o)
    findings: list[ContractFinding] = []
    for side, record in (("native", n), ("oracle", o)):
        problem = _route_problem(record, routes)
        if problem is not None:
            findings.append(ContractFinding(problem[0], pair.key, n_ids, o_ids, f"{side}: {problem[1]}"))
    compared = ("kernel_id", "contract_id", "effective_contract_id") if same_engine else ("effective_contract_id",)
    differing = [f for f in compared if getattr(n_ids, f) and getattr(o_ids, f) and getattr(n_ids, f) != getattr(o_ids, f)]
    if differing:
        detail = "; ".join(f"{f}: native {getattr(n_ids, f)!r} vs oracle {getattr(o_ids, f)!r}" for f in differing)
        findings.append(ContractFinding(KERNEL_CONTRACT_MISMATCH, pair.key, n_ids, o_ids, detail))
    return findings


def check_contracts(pairs: list[AlignedPair], routes: Mapping[str, tuple[str, ...]], same_engine: bool) -> ContractCheck:
    """Compare ids pair by pair; `routes` maps composite contracts to their validated routes.

    `same_engine` (both captures name the same engine) extends the comparison to kernel ids
    and declared contract ids.
    """
    if _none_recorded(pairs):
        return ContractCheck([], len(pairs), len(pairs))
    findings: list[ContractFinding] = []
    unrecorded = 0
    clean: set[tuple[str, ...]] = set()  # both sides' ids found to raise nothing: a finding depends on the ids alone
    for pair in pairs:
        n, o = pair.native.record, pair.oracle.record
        ids = (n.kernel_id, n.contract_id, n.effective_contract_id, o.kernel_id, o.contract_id, o.effective_contract_id)
        if ids in clean:
            continue
        if not any(ids):
            unrecorded += 1
            continue
        found = _pair_findings(pair, routes, same_engine)
        if found:
            findings.extend(found)
        else:
            clean.add(ids)
    return ContractCheck(findings, len(pairs), unrecorded)


ID_FIELDS = ("kernel_id", "contract_id", "effective_contract_id")


def _none_recorded(pairs: Sequence[AlignedPair]) -> bool:
    """Whether no record of any pair has a kernel or contract id, found on the index columns
    (an id's first byte) for pairs that are columns (`AlignedPairs`): most captures record none,
    and a look at each pair's records took 0.1 s of a 240,000-record comparison."""
    if not isinstance(pairs, AlignedPairs) or not len(pairs):
        return False
    for side, rows in zip((pairs.native, pairs.oracle), pairs.index_rows()):
        index = np.ascontiguousarray(side.records.columns.index)
        raw = index.view(np.uint8).reshape(len(index), index.dtype.itemsize)
        for name in ID_FIELDS:
            if raw[rows, index.dtype.fields[name][1]].any():
                return False
    return True


def validated_routes(*tables: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
    """Union of route tables (profile [contracts], provenance "contracts"); malformed entries are ignored."""
    merged: dict[str, set[str]] = {}
    for table in tables:
        for contract, routes in table.items():
            if isinstance(routes, (list, tuple)):
                merged.setdefault(str(contract), set()).update(str(r) for r in routes)
    return {k: tuple(sorted(v)) for k, v in merged.items()}
