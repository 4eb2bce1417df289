"""Local or inherited: did this op compute differently, or only receive different inputs?

Once the runs part, nearly every later op differs, and most of them do nothing wrong: they pass
on what they were given. The test is a rerun: compute the op on the oracle's route from the
native's own captured inputs. If that gives the native's bits, the op did exactly what the
oracle would have done with those inputs -- its error is inherited. If not, the op itself
computes differently -- it is local, and "native vs oracle's route on the native's inputs" is
its local error, beside the total.

The verdict holds only if the rerun is faithful to the oracle, so that is checked: on the
oracle's own inputs its route must give the oracle's own bits. The route is MLX, so it is the
oracle's own code only when the oracle ran on MLX. Otherwise (llama.cpp as the oracle), or when
the route fails that check, the candidate contracts that give the oracle's own bits decide, the
route among them if it gives them too. When nothing faithful agrees, the op is left
undetermined, with the reason, rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from backends.diagnosis.candidates import (
    ErrorFigure,
    candidate_inputs,
    compare_bits,
    record_bits,
    run_candidate,
)
from backends.diagnosis.registry import candidates_for, declared_candidate
from backends.rerun.inputs import (
    WEIGHT_NAMES,
    RerunInputError,
    mx_to_bits,
    why_not_rerunnable,
)
from backends.rerun.ops import RerunOpError
from backends.rerun.segment import OpRerun, RerunOptions, RerunSession, closer_to_exact
from sessions.compare.comparison import PairResult
from sessions.compare.key import OpKey
from sessions.compare.profiles import whole_op
from sessions.progress import run_to_end

NATIVE_ON_ORACLE_ROUTE = RerunOptions(source="native", route_from="oracle")
ORACLE_ON_ITS_ROUTE = RerunOptions(source="oracle", route_from="oracle")


class Locality(StrEnum):
    LOCAL = "local"
    INHERITED = "inherited"
    UNDETERMINED = "undetermined"


@dataclass
class Classification:
    key: OpKey
    kind: str
    """The pair's kind under the verdict model (diverged, contract-mismatch, signed-zero-only, ...)."""
    locality: Locality
    why: str
    """One sentence: what the rerun showed."""
    total: ErrorFigure
    """Native vs oracle, as captured."""
    local: ErrorFigure | None = None
    """Native vs the oracle's route on the native's inputs (the reference, as the oracle is in
    `total`): the part of the error this op adds."""
    inputs_agree: bool | None = None
    weights_differ: bool = False
    """The op's weights differ bit for bit between the sides' weights (each side's reruns read its own)."""
    oracle_route: list[str] = field(default_factory=list)
    """The route the rerun followed and where each choice came from."""
    closer_to_exact: str = "unknown"
    """On the native's inputs, against float64: 'native', "oracle's route", 'oracle' (its record, when the inputs agree
    and its route cannot be rerun faithfully), 'tie' or 'unknown'."""
    rmse_from_exact: dict[str, float] = field(default_factory=dict)
    route_bits: np.ndarray | None = field(default=None, repr=False)
    """The oracle's route on the native's inputs (canonical layout): the candidates' second yardstick."""


def _closer(op: OpRerun, reference: str, name: str) -> tuple[str, dict[str, float]]:
    """Which of the native and `reference` (the rerun, or the oracle's record) is nearer float64."""
    native, other = op.exact.get("native"), op.exact.get(reference)
    if native is None or other is None:
        return "unknown", {}
    return closer_to_exact(native, other, name), {"native": native.rmse, name: other.rmse}


def weights_differ_at(session: RerunSession, key: OpKey) -> bool:
    """Whether the two sides' weights of this op differ bit for bit (each side's reruns read its own)."""
    if key.op not in WEIGHT_NAMES or session.weights_path is not None:
        return False  # a file named for the reruns (`--weights`) is read for both sides
    hashes = session.native.meta.weights_hash, session.oracle.meta.weights_hash
    files = session.weights("native").path, session.weights("oracle").path
    if (hashes[0] and hashes[0] == hashes[1]) or (files[0] is not None and files[0] == files[1]):
        # The same weights, said by the runs or read from one file: a real model's GGUF weight was
        # decoded twice more for every op classified.
        return False
    try:
        native, oracle = (session.weights(side).get(key.op, key.layer) for side in ("native", "oracle"))
    except RerunInputError:
        return False
    return native.shape != oracle.shape or not np.array_equal(mx_to_bits(native)[0], mx_to_bits(oracle)[0])


def _route_check(session: RerunSession, key: OpKey, op: OpRerun, weights_differ: bool) -> tuple[bool, str]:
    """Whether the oracle's route, rerun on the oracle's own inputs, gives the oracle's bits. With
    the same inputs, the rerun on the native's already is that rerun, unless the weights differ:
    it read the native's, and the oracle's route then "did not reproduce the oracle"."""
    vs_oracle = op.three_way["rerun vs oracle"]
    if op.inputs_agree and vs_oracle is not None and not weights_differ:
        return vs_oracle.bit_exact, f"{vs_oracle.differing:,} elements differ"
    check = run_to_end(session.iter_rerun(key, ORACLE_ON_ITS_ROUTE))
    own = check.ops[0].three_way["rerun vs oracle"]
    if own is None:
        return False, "the oracle capture has no record to check against"
    return own.bit_exact, f"{own.differing:,} elements differ"


@dataclass
class OracleContracts:
    """The candidates that give the oracle's own bits from the oracle's own inputs, each with its
    bits on the native's inputs (registry order, the oracle's declared contract first)."""

    on_native: dict[str, np.ndarray]

    def verdict(self, native_bits: np.ndarray) -> bool | None:
        """True: every one gives the native's bits (inherited); False: none does (local); None:
        they disagree, and the oracle's bits cannot say which it ran."""
        same = {bool(np.array_equal(bits, native_bits)) for bits in self.on_native.values()}
        return same.pop() if len(same) == 1 else None


def _oracle_contracts(session: RerunSession, key: OpKey) -> OracleContracts | None:
    """Where the rerun's (MLX) route cannot play the oracle -- llama.cpp as the oracle -- the
    contracts the oracle demonstrably ran can: each candidate is run on the oracle's own inputs
    with the kernels the oracle's call chose, and those giving its bits are run on the native's.
    None when no candidate gives the oracle's bits."""
    oracle_bits = record_bits(session.captured["oracle"], key)
    if oracle_bits is None:
        return None
    try:
        own = candidate_inputs(session, "oracle", key, None, engine="oracle")
        theirs = candidate_inputs(session, "native", key, None, engine="oracle")
    except RerunInputError:
        return None
    declared = declared_candidate(session, "oracle", key)
    on_native: dict[str, np.ndarray] = {}
    for candidate in sorted(candidates_for(key.op), key=lambda c: c.id != declared):
        judged = run_candidate(candidate, own, oracle_bits)
        if judged.vs_native is not None and judged.vs_native.bit_exact:
            again = run_candidate(candidate, theirs, None)
            if again.bits is not None:
                on_native[candidate.id] = again.bits
    return OracleContracts(on_native) if on_native else None


def _names(names: list[str]) -> str:
    return ", ".join(name if name.startswith("the ") else f"`{name}`" for name in names)


def _decide_by_contracts(found: Classification, contracts: OracleContracts, native_bits: np.ndarray, dtype: str, route_note: str) -> None:
    names = _names(list(contracts.on_native))
    found.route_bits = next(iter(contracts.on_native.values()))
    found.local = compare_bits(native_bits, found.route_bits, dtype)
    found.oracle_route = [f"{name}: it gives the oracle's own bits from the oracle's inputs" for name in contracts.on_native]
    found.closer_to_exact, found.rmse_from_exact = "unknown", {}
    which = f"the contracts that give the oracle's own bits from its own inputs ({names}{route_note})"
    verdict = contracts.verdict(native_bits)
    if verdict is True:
        found.locality = Locality.INHERITED
        found.why = f"{which} give the native's bits on the native's inputs: the difference was already in the inputs"
    elif verdict is False:
        found.locality = Locality.LOCAL
        found.why = f"{which} differ from the native on the native's inputs ({found.local.text()}): this op computes differently"
    else:
        agree = [name for name, bits in contracts.on_native.items() if np.array_equal(bits, native_bits)]
        found.why = (
            f"{which} disagree on the native's inputs: {_names(agree)} give the native's bits and "
            f"{_names([n for n in contracts.on_native if n not in agree])} do not, so the oracle's bits cannot say which it ran"
        )


def classify(session: RerunSession, pair: PairResult) -> Classification:
    """Local, inherited or undetermined, for one aligned pair whose bits differ."""
    key = pair.key
    found = Classification(key, str(pair.verdict), Locality.UNDETERMINED, "", ErrorFigure.of(pair.metrics))
    whole = whole_op(key)
    if whole != key:
        found.why = f"a stage inside {whole} that only an engine without fused kernels writes out: {whole}'s rerun computes it, and its error is split there"
        return found
    why = why_not_rerunnable(key.op)
    if why is not None:
        found.why = f"{key.op} cannot be rerun ({why}), so its error cannot be split"
        return found
    try:
        result = run_to_end(session.iter_rerun(key, NATIVE_ON_ORACLE_ROUTE))
        (op,) = result.ops
        found.oracle_route = result.route_sources
        found.inputs_agree = op.inputs_agree
        weights_differ = found.weights_differ = weights_differ_at(session, key)
        route_ok, route_detail = _route_check(session, key, op, weights_differ)
    except (RerunInputError, RerunOpError, ValueError) as exc:
        found.why = f"cannot be rerun on the oracle's route from the native's inputs: {exc}"
        return found
    found.route_bits = op.bits
    found.closer_to_exact, found.rmse_from_exact = _closer(op, "rerun", "oracle's route")
    native_bits = record_bits(session.captured["native"], key)
    if native_bits is None or native_bits.shape != op.bits.shape:
        found.why = "the rerun's output has no native record of its shape to compare with"
        return found
    # Bit-identical inputs and weights: local by definition. With other weights, the difference
    # may be the weights' alone, which a route that cannot reproduce the oracle cannot tell.
    oracle_bits = record_bits(session.captured["oracle"], key) if not route_ok and op.inputs_agree and not weights_differ else None
    if oracle_bits is not None and oracle_bits.shape == native_bits.shape:
        # Bit-identical inputs, different outputs: local by definition, whatever a rerun can
        # reproduce; the oracle's own record is what it does with these inputs.
        found.route_bits = oracle_bits
        found.local = compare_bits(native_bits, oracle_bits, op.dtype)
        found.closer_to_exact, found.rmse_from_exact = _closer(op, "oracle", "oracle")
        found.locality = Locality.LOCAL
        found.why = (
            f"native and oracle read bit-identical inputs and their outputs differ ({found.local.text()}): this op computes "
            f"differently (the oracle's route does not reproduce the oracle's own bits, {route_detail}, so its record is the reference)"
        )
        return found
    found.local = compare_bits(native_bits, op.bits, op.dtype)
    if not (route_ok and session.oracle.meta.mlx_version()):
        # The rerun's route is MLX: it is the oracle's own code only when the oracle ran on MLX
        # and it passed the check. Otherwise its reproducing the oracle's bits may be a
        # coincidence of these inputs, and the contracts that reproduce them decide, the route
        # among them.
        contracts = _oracle_contracts(session, key)
        if contracts is not None:
            if route_ok:
                contracts.on_native = {"the oracle's route": op.bits, **contracts.on_native}
            _decide_by_contracts(found, contracts, native_bits, op.dtype, "" if route_ok else f"; the oracle's route does not, {route_detail}")
            return found
    if not route_ok:
        found.why = (
            f"the oracle's route does not reproduce the oracle's own bits from its own inputs ({route_detail}), so the rerun "
            f"cannot say what the oracle would have done with the native's inputs"
        )
    elif found.local.bit_exact and weights_differ:
        found.locality = Locality.INHERITED
        found.why = (
            "the oracle's route gives the native's bits from the native's inputs and weights, and the oracle's from the oracle's: "
            f"this op's weights differ between the runs{', and its inputs are bit-identical' if op.inputs_agree else ''}"
        )
    elif found.local.bit_exact:
        found.locality = Locality.INHERITED
        found.why = "the oracle's route on the native's inputs gives the native's bits: the difference was already in the inputs"
    else:
        found.locality = Locality.LOCAL
        agree = " from the same inputs" if op.inputs_agree else " on the native's inputs"
        found.why = f"the oracle's route{agree} differs from the native ({found.local.text()}): this op computes differently"
    return found
