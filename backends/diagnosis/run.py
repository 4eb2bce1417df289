"""`iter_diagnose`: say why the runs part, not only where.

For the differing ops it is asked about (one op, the first N local ones, or all), it classifies
each as local or inherited (backends.diagnosis.classify), tries the registry's candidate
contracts at each local op on the native's own inputs (backends.diagnosis.registry), and, for
a whole run, measures how much of the final logits' error each local op explains
(backends.diagnosis.budget). The result leads with one sentence that every surface -- the
CLI, the JSON, the HTML page, the viewer's panel -- shows first.

A plain generator: it yields Progress per op and returns the Diagnosis; closing it cancels.
Candidates run only at local ops; inherited ops cost one rerun each.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from backends.diagnosis.budget import (
    Budget,
    BudgetRow,
    Injection,
    NotMeasurable,
    Replay,
    baseline,
    final_logits_pair,
    measure,
    squared_error,
)
from backends.diagnosis.candidates import (
    CandidateInputs,
    CandidateResult,
    ErrorFigure,
    bits_array,
    call_shape,
    candidate_inputs,
    declared_contract,
    output_bits,
    record_bits,
    recorded_head_split,
    run_candidate,
)
from backends.diagnosis.classify import Classification, Locality, classify
from backends.diagnosis.named_weights import named_weights_mismatch
from backends.diagnosis.registry import (
    HEAD_SPLIT,
    REGISTRY,
    candidates_for,
    declared_candidate,
)
from backends.rerun.inputs import RerunInputError
from backends.rerun.ops import RerunOpError
from backends.rerun.segment import RerunSession
from sessions.capture.reader import Capture
from sessions.compare.comparison import (
    Comparison,
    PairResult,
    not_aligned,
    unaligned_key,
)
from sessions.compare.key import OpKey
from sessions.compare.profiles import whole_op
from sessions.compare.provenance_diff import hashed_apart
from sessions.compare.verdict import Kind
from sessions.progress import Progress, ProgressGenerator

MODES = ("op", "first", "all")
UNDETERMINED_RUN = 1000
"""`--first` stops after this many differing ops in a row of one segment name are undetermined
(a segment of another name, the text after a VLM's visual prefix, starts the count again:
its ops may be rerun where the prefix's could not). What leaves an op
undetermined (weights the captures do not hold, a stage no rerun computes) usually holds for
every later op too: a run diverged from its first steps with no weights at hand walked all its
88,000 differing ops for 79 s to say what the first thousand had said."""


@dataclass(frozen=True)
class DiagnoseOptions:
    mode: str = "first"
    """'op' (one key), 'first' (walk differing ops until `first` local ones are found) or 'all'."""
    key: OpKey | None = None
    first: int = 1
    budget: bool = True
    """With mode 'all': replay each local op to the final logits."""
    weights_path: str | None = None
    """The weights file the reruns read, instead of the one each capture references."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "op" and self.key is None:
            raise ValueError("mode 'op' needs a key")
        if self.first < 1:
            raise ValueError(f"--first needs at least 1 local op, not {self.first}")


@dataclass
class OpDiagnosis:
    classification: Classification
    candidates: list[CandidateResult] = field(default_factory=list)
    native_ran: str | None = None
    """The candidate that reproduces the native's bits exactly: when several do, the one the
    native's record declares, else one whose calls match the calls the native recorded."""
    also_exact: list[str] = field(default_factory=list)
    closest: str | None = None
    """With no exact reproduction: the candidate closest to the native's bits."""
    oracle_ran: str | None = None
    """The candidate that reproduces the oracle's route on the same inputs."""
    native_declared: str = ""
    oracle_declared: str = ""
    native_declared_id: str | None = None
    oracle_declared_id: str | None = None
    """The candidates that compute what each side's record declares, on data of its dtype
    (`registry.registry_id`); None: it declares none, or nothing a candidate computes."""
    native_declared_exact: bool | None = None
    """Whether the candidate computing the contract the native's record declares gives its bits:
    False is a record that misstates what the native ran. None when it declares none, one no
    candidate computes, or one that could not run here, and when its bits are a copy of the
    route's (`copy.plus_zero`): a contract names the arithmetic, not a copy taken after it."""
    native_call_rows: int | None = None
    oracle_call_rows: int | None = None
    """Set when the two sides computed this op in calls of different shapes (runs cut differently):
    the rows of each side's call, by which its kernels were chosen."""

    @property
    def key(self) -> OpKey:
        return self.classification.key

    def result(self, candidate_id: str) -> CandidateResult:
        return next(c for c in self.candidates if c.id == candidate_id)


@dataclass
class DispatchNote:
    """A dispatch-only op: identical bits here, different calls; which candidates give those bits."""

    key: OpKey
    native_summary: str
    oracle_summary: str
    reproducing: list[str]


@dataclass
class ContractNote:
    """A contract-only mismatch: identical bits, records that declare different contracts. Which
    candidates give those bits from the native's inputs says which declaration, if either, is true."""

    key: OpKey
    native_declared: str
    oracle_declared: str
    native_declared_id: str | None = None
    oracle_declared_id: str | None = None
    """As `OpDiagnosis`'s."""
    candidates: list[CandidateResult] = field(default_factory=list)
    """Every candidate for the op on the native's inputs, judged against the bits both sides hold."""
    reproducing: list[str] = field(default_factory=list)
    """The candidates that give those bits, registry order (a copy of the oracle's record computes no contract)."""

    def declared_text(self, side: str) -> str:
        """Whether `side`'s declared contract gives the bits, in words."""
        declared = self.native_declared if side == "native" else self.oracle_declared
        if not declared:
            return f"the {side} declares none"
        named = self.native_declared_id if side == "native" else self.oracle_declared_id
        result = next((c for c in self.candidates if c.id == named), None)
        if result is None:
            return f"the {side}'s `{declared}` is no candidate's, so it cannot be checked"
        if result.vs_native is None:
            return f"the {side}'s `{declared}` could not run ({result.skipped or 'its output has another shape'})"
        return f"the {side}'s `{declared}` {'does' if result.vs_native.bit_exact else 'does not'}"


@dataclass
class Diagnosis:
    native_path: str
    oracle_path: str
    mode: str
    verdict: str
    """The sentence every surface leads with."""
    comparison_word: str
    ops: list[OpDiagnosis] = field(default_factory=list)
    """Classified ops in execution order."""
    dispatch: list[DispatchNote] = field(default_factory=list)
    contract_only: list[ContractNote] = field(default_factory=list)
    """Contract-mismatch ops whose bits are identical, looked at as dispatch-only ones are."""
    budget: Budget | None = None
    unexplained: str = ""
    """What the comparison found that no rerun explains (records without a partner, tokens with
    no op classified), in its own words; "" when nothing. It makes the exit status 1."""
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"
    mlx_version: str = mx.__version__
    seconds: float = 0.0

    @property
    def local_chain(self) -> list[OpDiagnosis]:
        return [op for op in self.ops if op.classification.locality == Locality.LOCAL]

    def contracts(self) -> dict[str, int]:
        """How many local ops each reproducing contract explains, most first; unexplained ops under ''."""
        counts = Counter(op.native_ran or "" for op in self.local_chain)
        return dict(counts.most_common())

    def locality(self) -> dict[OpKey, str]:
        """Each classified op's word (local / inherited / undetermined / covered): every surface's
        (the text, the tree's column, the panel's table, the HTML). The window and the HTML said
        "undetermined" of the stages the text's count called covered."""
        covered = self.covered_keys()
        return {op.key: COVERED if op.key in covered else str(op.classification.locality) for op in self.ops}

    def covered_keys(self) -> set[OpKey]:
        """Undetermined stages (`STAGE_OF`) of an op this diagnosis classified: that op's verdict
        accounts for them, so they leave no doubt."""
        classified = {op.key for op in self.ops if op.classification.locality != Locality.UNDETERMINED}
        return {op.key for op in self.ops if op.classification.locality == Locality.UNDETERMINED and whole_op(op.key) in classified}

    @property
    def open_ops(self) -> list[OpDiagnosis]:
        """Undetermined ops that leave a doubt: not stages covered by a classified op."""
        covered = self.covered_keys()
        return [op for op in self.ops if op.classification.locality == Locality.UNDETERMINED and op.key not in covered]

    def counts_text(self) -> str:
        """How many ops each classification took: every surface's count line."""
        local, inherited = len(self.local_chain), sum(op.classification.locality == Locality.INHERITED for op in self.ops)
        covered = len(self.covered_keys())
        text = f"{len(self.ops)} differing op(s) classified: {local} local, {inherited} inherited, {len(self.open_ops)} undetermined"
        return text + (f", {covered} stage(s) covered by the op that computes them" if covered else "")


DIFFERENT_WEIGHTS = (
    "The runs used different weights (their weights hashes differ), and each op is rerun with the native capture's: "
    "a difference the weights alone make reads as inherited, not local."
)
"""Said first when the weights hashes differ: at the end among the notes, "all 324 ops inherited"
read as the answer."""


def _why_open(diagnosis: Diagnosis, op: OpDiagnosis) -> str:
    """Why `op` is undetermined; for a stage whose op is undetermined too, that op's reason: "its
    error is split there" pointed at an op left undetermined for a reason the sentence never gave."""
    whole = whole_op(op.key)
    owner = next((o for o in diagnosis.ops if o.key == whole and o.classification.locality == Locality.UNDETERMINED), None) if whole != op.key else None
    if owner is None:
        return op.classification.why
    return f"{op.classification.why}; {owner.key} itself is undetermined: {owner.classification.why}"


def _weights_differ(comparison: Comparison) -> bool:
    weights = next(f for f in comparison.provenance.fields if f.field == "weights_hash")
    return bool(weights.native and weights.oracle and not weights.same and not hashed_apart(weights))


COVERED = "covered"
"""The word for an undetermined stage of an op the diagnosis classified (`Diagnosis.covered_keys`)."""


def _preferred(ids: list[str], named: str | None, head_split: bool | None) -> str | None:
    """Of the candidates `ids` that give a side's bits, the one its record declares (`named`); else
    the first in registry order whose calls do not contradict the calls the side recorded (one
    call over all heads is not the head-chunk route, though on a CPU both give its bits)."""
    if named in ids:
        return named
    fitting = [i for i in ids if head_split is None or HEAD_SPLIT[i] in (None, head_split)]
    return (fitting or ids or [None])[0]


def _search(session: RerunSession, found: Classification) -> OpDiagnosis:
    """Every candidate for the op, on the native's own inputs, judged against both yardsticks."""
    key = found.key
    result = OpDiagnosis(
        found, native_declared=declared_contract(session, "native", key), oracle_declared=declared_contract(session, "oracle", key),
        native_declared_id=declared_candidate(session, "native", key), oracle_declared_id=declared_candidate(session, "oracle", key),
    )
    try:
        inputs = candidate_inputs(session, "native", key, found.route_bits)
    except RerunInputError as exc:
        session_note = f"candidates could not read the native's inputs: {exc}"
        result.candidates = [CandidateResult(c.id, c.description, c.source, skipped=session_note) for c in candidates_for(key.op)]
        return result
    native_bits = record_bits(session.captured["native"], key)
    result.candidates = [run_candidate(c, inputs, native_bits) for c in candidates_for(key.op)]
    ran = [c for c in result.candidates if c.vs_native is not None]
    exact = [c.id for c in ran if c.vs_native is not None and c.vs_native.bit_exact]
    copies = {c.id for c in candidates_for(key.op) if c.of_route}
    result.native_ran = _preferred(exact, result.native_declared_id, recorded_head_split(session.captured["native"], key))
    result.also_exact = [i for i in exact if i != result.native_ran]
    declared = next((c for c in ran if c.id == result.native_declared_id), None)
    if declared is not None and result.native_ran not in copies:
        # A copy of the route is the route's arithmetic plus a copy no record's contract names.
        result.native_declared_exact = declared.id in exact
    computed = [c for c in ran if c.id not in copies]
    if result.native_ran is None and computed:
        result.closest = min(computed, key=lambda c: c.vs_native.closeness()).id  # type: ignore[union-attr]
    oracle_shape = call_shape(session.captured["oracle"], key)
    shaped = [c for c in candidates_for(key.op) if any(oracle_shape[f] != getattr(inputs, f) for f in c.follows)]
    if shaped:
        # The oracle computed these rows in a call of another shape: the candidates whose kernel
        # follows that shape are judged again with the kernels the oracle's call chose.
        oracle_inputs = replace(inputs, **oracle_shape)
        again = {c.id: run_candidate(c, oracle_inputs, native_bits) for c in shaped}
        ran = [again.get(c.id, c) for c in ran]
        # Each candidate's line against the oracle's route is the one `oracle_ran` was judged by:
        # kept from the native's call shape, the table said 613 elements differ from the route
        # whose contract the sentence above it named.
        result.candidates = [replace(c, vs_oracle_route=again[c.id].vs_oracle_route) if c.id in again else c for c in result.candidates]
    oracle_exact = [c.id for c in ran if c.vs_oracle_route is not None and c.vs_oracle_route.bit_exact]
    result.oracle_ran = _preferred(oracle_exact, result.oracle_declared_id, recorded_head_split(session.captured["oracle"], key))
    if result.oracle_ran in {c.id for c in shaped} and oracle_shape["call_rows"] != inputs.call_rows:
        # Said only of a contract whose kernel follows the call's rows: of one that does not, the note was false.
        result.oracle_call_rows, result.native_call_rows = oracle_shape["call_rows"], inputs.call_rows
    return result


def _dispatch_note(session: RerunSession, comparison: Comparison, pair: PairResult) -> DispatchNote:
    difference = next((d for d in comparison.dispatch_differences if d.key == pair.key), None)
    reproducing: list[str] = []
    try:
        inputs = candidate_inputs(session, "native", pair.key, record_bits(session.captured["oracle"], pair.key))
    except RerunInputError:
        inputs = None
    if inputs is not None:
        native_bits = record_bits(session.captured["native"], pair.key)
        for candidate in candidates_for(pair.key.op):
            if candidate.id.startswith("attn.mlx_sdpa"):
                judged = run_candidate(candidate, inputs, native_bits)
                if judged.vs_native is not None and judged.vs_native.bit_exact:
                    reproducing.append(candidate.id)
    return DispatchNote(
        pair.key, difference.native_summary if difference else "", difference.oracle_summary if difference else "", reproducing
    )


def _contract_note(session: RerunSession, pair: PairResult) -> ContractNote:
    key = pair.key
    note = ContractNote(
        key, declared_contract(session, "native", key), declared_contract(session, "oracle", key),
        declared_candidate(session, "native", key), declared_candidate(session, "oracle", key),
    )
    bits = record_bits(session.captured["native"], key)
    try:
        inputs = candidate_inputs(session, "native", key, record_bits(session.captured["oracle"], key))
    except RerunInputError as exc:
        note.candidates = [CandidateResult(c.id, c.description, c.source, skipped=f"candidates could not read the native's inputs: {exc}") for c in candidates_for(key.op)]
        return note
    note.candidates = [run_candidate(c, inputs, bits) for c in candidates_for(key.op)]
    copies = {c.id for c in candidates_for(key.op) if c.of_route}
    note.reproducing = [c.id for c in note.candidates if c.id not in copies and c.vs_native is not None and c.vs_native.bit_exact]
    return note


def _bit_identical(comparison: Comparison, kind: Kind, options: DiagnoseOptions, diverged: bool) -> tuple[list[PairResult], int]:
    """The pairs of `kind` with identical bits this diagnosis looks at, and how many the run holds:
    `--op` looks at the op it names (report names such ops for diagnose --op), `--all` at every one,
    the default, when nothing diverged, at the first."""
    pairs = [p for p in comparison.pairs if p.verdict == kind and not p.post_eos and p.metrics.bit_exact]
    if options.mode == "op":
        return [p for p in pairs if p.key == options.key], len(pairs)
    return (pairs if options.mode == "all" else pairs[:1] if not diverged else []), len(pairs)


def _unexplained(comparison: Comparison, classified: bool) -> str:
    """What the comparison found that no rerun explains, in its words ("" when nothing): records
    without a partner, and differing tokens when no op was `classified`. A dispatch-only op looked
    at beside records without a partner read "Nothing computes differently" with exit 0."""
    verdict, first = comparison.verdict, comparison.verdict.first
    kinds = {Kind.UNALIGNED} | (set() if classified else {Kind.TOKENS})
    found = [f"the comparison's first finding is {first.kind} at {first.key} ({first.detail})"] if first is not None and first.kind in kinds else []
    found += [reason for reason, kind in zip(verdict.reasons, verdict.reason_kinds) if kind in kinds and (first is None or kind != first.kind)]
    return f"{'; '.join(found)}, which no rerun explains" if found else ""


def _targets(comparison: Comparison, options: DiagnoseOptions) -> tuple[list[PairResult], bool]:
    """The pairs to classify, and whether the op `--op` names is after the shared EOS step."""
    if options.mode == "op":
        assert options.key is not None
        pair = next((p for p in comparison.pairs if p.key == options.key), None)
        if pair is None:
            # A run that stops at the shared EOS leaves the other's later records without a
            # partner: report calls them invalid, not failures, and so does diagnose.
            if any(unaligned_key(u) == options.key for u in comparison.post_eos_unaligned):
                return [], True
            raise ValueError(not_aligned(comparison, options.key))
        whole_key = whole_op(options.key)
        whole = None if whole_key == options.key else next((p for p in comparison.pairs if p.key == whole_key), None)
        if whole is not None and not whole.metrics.bit_exact and not pair.metrics.bit_exact:
            pair = whole  # a stage is diagnosed as the op whose rerun computes it: "undetermined" sent users nowhere
        return ([pair] if not pair.metrics.bit_exact and not pair.post_eos else []), pair.post_eos
    return [p for p in comparison.pairs if not p.post_eos and not p.metrics.bit_exact], False


def iter_diagnose(native: Capture, oracle: Capture, comparison: Comparison, options: DiagnoseOptions = DiagnoseOptions()) -> ProgressGenerator[Diagnosis]:
    """Diagnose the pair's differences; yields Progress per op classified, returns the Diagnosis.

    Raises ValueError for a bad option or a key the comparison does not hold; CaptureError when
    a capture changed since it was compared. What cannot be rerun is reported per op, never raised."""
    started = time.perf_counter()
    targets, after_eos = _targets(comparison, options)
    yield Progress(0, max(1, len(targets)), "finding records by canonical key")
    session = RerunSession(native, oracle, comparison, options.weights_path)
    diagnosis = Diagnosis(str(native.path), str(oracle.path), options.mode, "", comparison.verdict.word)
    diagnosis.notes.extend(comparison.provenance.warnings)  # one file twice, other weights: said as report says them
    if options.key is not None and targets and targets[0].key != options.key:
        diagnosis.notes.append(f"{options.key} is a stage inside {targets[0].key}, whose rerun computes it: {targets[0].key} is diagnosed.")
    locals_found, open_run = 0, 0
    for number, pair in enumerate(targets):
        yield Progress(number, len(targets), f"classifying {pair.key.text()}")
        found = classify(session, pair)
        op = _search(session, found) if found.locality == Locality.LOCAL else OpDiagnosis(found)
        diagnosis.ops.append(op)
        locals_found += found.locality == Locality.LOCAL
        same_stage = number > 0 and targets[number - 1].key.segment == pair.key.segment
        open_run = (open_run if same_stage else 0) + 1 if found.locality == Locality.UNDETERMINED else 0
        if options.mode == "first" and (locals_found >= options.first or open_run >= UNDETERMINED_RUN):
            break
    # A dispatch-only or contract-mismatch pair whose bits differ is a target like any pair whose bits differ.
    noted, dispatch_only = _bit_identical(comparison, Kind.DISPATCH_ONLY, options, bool(targets))
    declared, contract_only = _bit_identical(comparison, Kind.CONTRACT_MISMATCH, options, bool(targets))
    total = len(targets) + len(noted) + len(declared)
    for number, pair in enumerate(noted):
        yield Progress(len(targets) + number, total, f"checking the dispatch-only {pair.key.text()}")
        diagnosis.dispatch.append(_dispatch_note(session, comparison, pair))
    for number, pair in enumerate(declared):
        yield Progress(len(targets) + len(noted) + number, total, f"checking the declared contracts of {pair.key.text()}")
        diagnosis.contract_only.append(_contract_note(session, pair))
    if options.mode == "all" and options.budget and diagnosis.local_chain:
        diagnosis.budget = yield from _iter_budget(session, comparison, diagnosis)
    if options.mode != "op":
        diagnosis.unexplained = _unexplained(comparison, classified=bool(diagnosis.ops))
    diagnosis.verdict = verdict_sentence(diagnosis, len(targets), dispatch_only, after_eos, contract_only)
    if diagnosis.ops and options.weights_path is None and _weights_differ(comparison):  # a file named for the reruns is read for both sides
        diagnosis.verdict = f"{DIFFERENT_WEIGHTS} {diagnosis.verdict}"
    mismatch = None if options.weights_path is None or not diagnosis.ops else named_weights_mismatch(Path(options.weights_path), native, oracle)
    if mismatch is not None:
        diagnosis.verdict = f"{mismatch} {diagnosis.verdict}"
    if options.mode == "first" and len(diagnosis.ops) < len(targets):
        why = f"{locals_found} local op(s)" if open_run < UNDETERMINED_RUN else f"{open_run:,} differing ops in a row could not be classified"
        diagnosis.notes.append(f"Stopped after {why}; {len(targets) - len(diagnosis.ops):,} later differing op(s) were not classified (--all, or the window's scope \"Every differing op\", classifies every one).")
    diagnosis.seconds = time.perf_counter() - started
    return diagnosis


# -- the budget ------------------------------------------------------------------------------


def _injection(session: RerunSession, op: OpDiagnosis) -> Injection:
    """The op's result as the native computes it from the oracle's inputs (see budget's docstring)."""
    key, found = op.key, op.classification
    native_bits = record_bits(session.captured["native"], key)
    assert native_bits is not None
    logical = session.captured["native"].find(key.step, key.segment, key.layer, key.op).record.dtype  # type: ignore[union-attr]
    if found.inputs_agree:
        return Injection(key, bits_array(native_bits, logical), "the native's record (its inputs equal the oracle's)")
    if op.native_ran is not None:
        candidate = next(c for c in REGISTRY if c.id == op.native_ran)
        inputs: CandidateInputs = candidate_inputs(session, "oracle", key, record_bits(session.captured["oracle"], key))
        bits = output_bits(candidate.run(inputs), inputs.dtype)
        return Injection(key, bits_array(bits, inputs.dtype), f"{op.native_ran} on the oracle's inputs")
    return Injection(key, bits_array(native_bits, logical), "the native's record: no candidate reproduces this op, so this carries upstream error too")


def _iter_budget(session: RerunSession, comparison: Comparison, diagnosis: Diagnosis) -> ProgressGenerator[Budget]:
    final = final_logits_pair(comparison)
    if final is None:
        return Budget(None, None, notes=["No logits pair before the shared EOS: there is no final error to share out."])
    budget = Budget(final.key, ErrorFigure.of(final.metrics))
    replay = Replay(session, final.key)
    oracle_final = record_bits(session.captured["oracle"], final.key)
    native_final = record_bits(session.captured["native"], final.key)
    assert oracle_final is not None and native_final is not None
    logical = final.metrics.dtype
    chain = diagnosis.local_chain
    # Each row against the replay from its own op with nothing changed: from a later op the
    # replay starts on the oracle's captured state, not the first replay's, and where the replay
    # does not reproduce the oracle exactly, an injection that changed nothing read as 97% of
    # the final error against a reference replayed from the first op.
    references: dict[tuple[int, str, int], np.ndarray] = {}
    total_error = squared_error(native_final, oracle_final, logical)
    for number, op in enumerate(chain):
        yield Progress(number, len(chain), f"replaying from {op.key.text()} to the final logits")
        start = (op.key.step, op.key.segment, op.key.layer)
        if start not in references:
            try:
                references[start], exact = baseline(replay, op.key, oracle_final, logical)
            except (NotMeasurable, RerunInputError, RerunOpError) as exc:
                if number == 0:
                    budget.notes.append(f"The run cannot be replayed from {op.key}: {exc}")
                    return budget
                budget.rows.append(BudgetRow(op.key, op.classification.local, not_measured=f"the run cannot be replayed from it: {exc}"))
                continue
            budget.baseline_exact = exact and budget.baseline_exact is not False
        try:
            injection = _injection(session, op)
        except (RerunInputError, RerunOpError, ValueError) as exc:
            budget.rows.append(BudgetRow(op.key, op.classification.local, not_measured=f"its injection could not be computed: {exc}"))
            continue
        budget.rows.append(measure(replay, injection, op.classification.local, references[start], total_error, logical))
    if budget.baseline_exact is False:
        budget.notes.append(
            "The replay without any change does not give the oracle's final logits bit for bit; each share is measured against "
            "the replay from the same op with nothing changed."
        )
    return budget


# -- the sentence ----------------------------------------------------------------------------


def _names(ids: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in ids)


def _contract_clause(op: OpDiagnosis) -> str:
    """Which contract the native ran, and whether that is what its record declares."""
    uncomputed = bool(op.native_declared) and op.native_declared_id is None
    declared = f"the native declares `{op.native_declared}`" + (", which no candidate computes" if uncomputed else "")
    if op.native_ran is not None:
        also = f", and {_names(op.also_exact)} give{'s' if len(op.also_exact) == 1 else ''} the same bits" if op.also_exact else ""
        if op.native_declared_exact is False or uncomputed:
            return f"{declared}, but its bits are reproduced by `{op.native_ran}` (bit-exact){also}"
        return f"the native ran `{op.native_ran}` (bit-exact reproduction){also}"
    lead = f"{declared}, which does not reproduce its bits, and " if op.native_declared_exact is False else ""
    if op.closest is not None:
        closest = op.result(op.closest).vs_native
        assert closest is not None
        return f"{lead}no candidate reproduces the native's bits exactly; the closest is `{op.closest}` ({closest.text()})"
    return f"{lead}no candidate could run on its inputs"


def _oracle_clause(op: OpDiagnosis) -> str:
    declared = f" (declared `{op.oracle_declared}`)" if op.oracle_declared and op.oracle_declared_id != op.oracle_ran else ""
    if op.oracle_ran is not None:
        shapes = ""
        if op.oracle_call_rows is not None:
            shapes = f" (in a call of {op.oracle_call_rows} row(s) against the native's {op.native_call_rows}: the kernel follows the call's shape)"
        return f"the oracle's contract on these inputs is `{op.oracle_ran}`{declared}{shapes}"
    route = "; ".join(op.classification.oracle_route)
    return f"no candidate reproduces the oracle's route ({route})" if route else "no candidate reproduces the oracle's route"


def _exact_clause(found: Classification) -> str:
    if found.closer_to_exact in ("native", "oracle's route", "oracle"):
        return f" Against the float64 reference the {found.closer_to_exact} is closer to exact."
    return " Against the float64 reference both are equally close." if found.closer_to_exact == "tie" else ""


def verdict_sentence(diagnosis: Diagnosis, diverged: int, dispatch_only: int, after_eos: bool = False, contract_only: int = 0) -> str:
    """The one sentence every surface leads with, ending in the comparison's first finding when no
    rerun explains it (`Diagnosis.unexplained`). `after_eos`: the op `--op` named is after the
    shared EOS step; `contract_only`: how many ops of the run have identical bits under
    contracts that do not match."""
    sentence = _sentence(diagnosis, diverged, dispatch_only, after_eos, contract_only)
    if not diagnosis.unexplained:
        return sentence
    return f"{sentence.removesuffix('.')}; {diagnosis.unexplained}."


def _sentence(diagnosis: Diagnosis, diverged: int, dispatch_only: int, after_eos: bool, contract_only: int) -> str:
    chain = diagnosis.local_chain
    if chain:
        first = chain[0]
        sentence = f"{first.key} is local: {_contract_clause(first)}; {_oracle_clause(first)}"
        later = diagnosis.ops[diagnosis.ops.index(first) + 1 :]
        inherited = sum(op.classification.locality == Locality.INHERITED for op in later)
        more = chain[1:]
        if more:
            same = all(op.native_ran == first.native_ran for op in more) and first.native_ran is not None
            explained = sum(op.native_ran is not None for op in more)
            if same:
                sentence += f"; {len(more)} more local op(s) with the same contract"
            else:
                sentence += f"; {len(more)} more local op(s), {'all' if explained == len(more) else explained} reproduced exactly by a candidate"
        if inherited:
            sentence += f"; {inherited} later op(s) are inherited"
        open_keys = {op.key for op in diagnosis.open_ops}
        earlier = [op for op in diagnosis.ops[: diagnosis.ops.index(first)] if op.key in open_keys]
        if earlier:
            sentence += f"; {len(earlier)} earlier differing op(s) could not be classified, first {earlier[0].key}, so the cause may lie before it"
        unknown = [op for op in later if op.key in open_keys]
        if unknown:
            # What leaves one op undetermined (a weights file that is not there) usually leaves them all.
            sentence += f"; {len(unknown)} later op(s) could not be classified, first {unknown[0].key} ({_why_open(diagnosis, unknown[0])})"
        return sentence + "." + _exact_clause(first.classification)
    if diagnosis.ops:
        if not diagnosis.open_ops:
            weighted = [op.key for op in diagnosis.ops if op.classification.weights_differ]
            weights = f"; the weights differ at {len(weighted)} of them, first {weighted[0]}" if weighted else ""
            return f"All {len(diagnosis.ops)} diagnosed op(s) are inherited: each did what the oracle's route does with its inputs{weights}."
        first_open = diagnosis.open_ops[0]
        return f"{first_open.key} is undetermined: {_why_open(diagnosis, first_open)}."
    if diagnosis.contract_only:
        declared = diagnosis.contract_only[0]
        more = f" ({'one' if diagnosis.mode == 'op' else 'the first'} of {contract_only} such ops)" if contract_only > 1 else ""
        return (
            f"{declared.key} has identical bits on both sides, but their records' contracts do not match{more}: the native declares "
            f"`{declared.native_declared or 'none'}`, the oracle `{declared.oracle_declared or 'none'}`. From the native's inputs "
            f"{_names(declared.reproducing) or 'no candidate'} give{'s' if len(declared.reproducing) == 1 else ''} these bits: "
            f"{declared.declared_text('native')}; {declared.declared_text('oracle')}."
        )
    if diagnosis.dispatch:
        note = diagnosis.dispatch[0]
        both = " and ".join(f"`{c}`" for c in note.reproducing) or "no MLX SDPA candidate"
        which = (
            f"{note.key} is dispatch-only" + (f" (one of {dispatch_only} such ops)" if dispatch_only > 1 else "")
            if diagnosis.mode == "op"
            else f"{dispatch_only} op(s) are dispatch-only, first {note.key}"
        )
        return (
            f"Nothing computes differently on this CPU: {which}, with identical bits. "
            f"The native ran {note.native_summary}; the oracle ran {note.oracle_summary}. Here {both} give the same bits "
            f"(MLX runs every SDPA call as its decomposed fallback on a CPU); on Metal the calls would take different kernels, "
            f"which this CPU cannot measure."
        )
    if after_eos:
        return "That op is after the shared EOS step: invalid, never a failure; nothing to diagnose there."
    if diverged == 0 and diagnosis.mode == "op":
        return "That op is bit-exact: nothing to diagnose there."
    return f"Nothing to diagnose: no aligned op before any shared EOS differs ({diagnosis.comparison_word})."
