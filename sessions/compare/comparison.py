"""Native vs oracle comparison: alignment, execution state, then tensors, streamed pair by pair.

The order is the investigation's: provenance and execution state (kernel/contract ids,
dispatch) come from index metadata and are settled before the first tensor byte is read;
tensors are then read in bounded chunks (sessions.compare.pair_reader), with the disk kept busy ahead
of the comparison (sessions.capture.read_ahead), so a pair of multi-GB captures streams through at
about the speed of reading it. Each byte is read once, except that a chunked pair which
differs only after some identical chunks reads those chunks' oracle side again for its
NMSE/cosine sums (see DiffAccumulator). `iter_compare` yields `Progress` (bytes compared) and
returns the `Comparison`; closing the generator cancels it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from operator import attrgetter, is_not, itemgetter

import numpy as np

from sessions.capture.format import RERUN_ROLE
from sessions.capture.read_ahead import ReadAhead
from sessions.capture.reader import Capture, Record
from sessions.compare.align import (
    AlignedPair,
    AlignedPairs,
    Alignment,
    align,
    call_spans,
    cut_alike,
    made_alike,
)
from sessions.compare.align_modes import ALIGN_MODES, POSITIONS
from sessions.compare.byte_checks import ByteChecks
from sessions.compare.contracts import (
    ContractCheck,
    ContractFinding,
    check_contracts,
    validated_routes,
)
from sessions.compare.dispatch_diff import (
    DispatchDifference,
    compare_dispatch,
    events_by_record,
)
from sessions.compare.early_checks import early_stretches
from sessions.compare.key import OpKey
from sessions.compare.mapped_record import BatchRow, batch_of
from sessions.compare.options import CompareOptions
from sessions.compare.page_release import kept_in_page_cache
from sessions.compare.pair_compare import PairOutcome, iter_compare_pairs
from sessions.compare.pair_reader import (
    PairReader,
    pair_byte_counts,
    read_ahead_spans,
)
from sessions.compare.pair_results import (
    PairResult,
    PairResults,
    differing_rows,
    pair_kinds,
)
from sessions.compare.parallel_compare import (
    check_threads,
    iter_compare_in_workers,
    worker_count,
)
from sessions.compare.profile_identity import ProfileIdentity, identify
from sessions.compare.profiles import (
    CANONICAL_OPS,
    Profile,
    ProfileError,
    detect_profile,
    resolve_profile,
    rows_axis,
)
from sessions.compare.provenance_diff import ProvenanceDiff, diff_provenance
from sessions.compare.record_columns import groups
from sessions.compare.record_sources import sources_for
from sessions.compare.tensor_diff import SPECIAL_ELEMENTS, TensorMetrics, Tolerance
from sessions.compare.token_parity import (
    StepLogits,
    TokenParity,
    compare_tokens,
    shared_eos_step,
    token_words,
    tokens_by_step,
)
from sessions.compare.unaligned import (
    BY_DESIGN,
    NO_PARTNER,
    NOT_RERUN,
    REASON_WORDS,
    UnalignedRecord,
)
from sessions.compare.verdict import (
    FAILING,
    Finding,
    Kind,
    Verdict,
    classify_pair,
    judge,
)
from sessions.gc_pause import garbage_collection_paused
from sessions.progress import Progress, ProgressGenerator
from sessions.side_file import same_file

READ_AHEAD_BYTES = 256 * 1024 * 1024
"""How far ahead of the comparison (both sides together) the kernel is asked to be reading."""


@dataclass
class AlignmentMode:
    """How the pairs were made, for every surface to say: by the same calls or by position, and
    how each run was cut into forward calls and batched."""

    mode: str
    native_calls: list[str]
    """The native run's forward calls in order ("text-before 0-4", "visual 5-1012", ...)."""
    oracle_calls: list[str]
    native_batch: str
    """"" for one request, else e.g. "row 3 of a batch of 8"."""
    oracle_batch: str
    cut_alike: bool
    """Both runs made the same forward calls (`align.cut_alike`). Paired by calls when they did
    not (`--align calls`, or `auto` without recorded positions and with prompts of different
    lengths), the report said "same calls" over a list of records without partners."""

    @property
    def is_plain(self) -> bool:
        """Same calls and one request on each side: nothing a user needs told about the pairing."""
        return self.mode != POSITIONS and self.cut_alike and not self.native_batch and not self.oracle_batch

    def short(self) -> str:
        """"by the same calls", "by calls, cut differently" or "by position", with the batch rows: for a
        strip or a table cell, after "aligned" ("aligned same calls" read as a typo)."""
        batch = [f"{side} is {text}" for side, text in (("native", self.native_batch), ("oracle", self.oracle_batch)) if text]
        batch_text = f" ({'; '.join(batch)})" if batch else ""
        # A side with no call has no record its profile maps: nothing says how it was cut, and
        # "cut differently" read as a finding about runs cut alike.
        uncut = " and ".join(side for side, calls in (("native", self.native_calls), ("oracle", self.oracle_calls)) if not calls)
        cut = f"by calls (the {uncut} run has no record its profile maps to an op)" if uncut else "by calls, cut differently"
        how = "by position" if self.mode == POSITIONS else "by the same calls" if self.cut_alike else cut
        return f"{how}{batch_text}"

    def words(self) -> str:
        """One line: "by the same calls", or how each run was cut: "by position: native prefill 0-1026; oracle text-before 0-4, ..."."""
        if self.mode != POSITIONS and self.cut_alike:
            return self.short()
        return f"{self.short()}: native {_calls_text(self.native_calls)}; oracle {_calls_text(self.oracle_calls)}"


def _calls_text(calls: list[str], shown: int = 4) -> str:
    if not calls:
        return "no call (no record with known positions)"
    more = f", and {len(calls) - shown} more call(s)" if len(calls) > shown else ""
    return ", ".join(calls[:shown]) + more


def _batch_text(batch: BatchRow | None) -> str:
    return "" if batch is None else batch.text()


@dataclass(slots=True)
class GrowthPoint:
    key: OpKey
    max_ulp: int | None
    nmse: float
    differing: int
    """Elements that differ: a pair differing only by NaN against numbers, or by quantized bytes,
    has max ULP 0 or none and NMSE 0, and the error growth called such a DIVERGENCE "flat"."""


@dataclass
class Comparison:
    native_path: str
    oracle_path: str
    native_profile: str
    """The profile's name, for display; `native_profile_identity` says which file and content."""
    oracle_profile: str
    native_profile_identity: ProfileIdentity
    oracle_profile_identity: ProfileIdentity
    tolerance: Tolerance
    """The bounds of every pair no policy rule fits (`CompareOptions.tolerance_for`): the command
    line's, else the policy's [default]. The command line's alone said "bit-exact" of a policy
    whose default bounded every op to 1 ULP."""
    tolerance_policy: str
    """The policy file whose rules judged pairs ("" when none): per-op tolerances override `tolerance`."""
    provenance: ProvenanceDiff
    contracts: ContractCheck
    dispatch_differences: list[DispatchDifference]
    dispatch_not_compared: str
    """Why the attention calls were not compared ("" when they were): runs cut into different
    calls, or a capture that records none (`dispatch_not_compared`)."""
    pairs: Sequence[PairResult]
    unaligned: list[UnalignedRecord]
    post_eos_unaligned: list[UnalignedRecord]
    """Records after the shared EOS step without a partner: invalid, never failures."""
    first_divergence: int | None
    """Index into `pairs` of the earliest (execution order) pre-EOS pair that is not bit-exact:
    where the bits first part, whether or not that fails (a tolerance may allow it)."""
    tokens: TokenParity
    verdict: Verdict
    """What every surface says about this comparison (sessions.compare.verdict)."""
    alignment: AlignmentMode

    @property
    def compared_pairs(self) -> list[PairResult]:
        """The pairs before the shared EOS, in execution order: those the error growth follows."""
        return [r for r in self.pairs if not r.post_eos]

    @property
    def error_growth(self) -> list[GrowthPoint]:
        """Each compared pair's worst ULP and NMSE in execution order: derived from the pairs, not
        stored beside them (a real model's 220,000 points doubled the document's items). The
        JSON document still carries it (`DERIVED_PROPERTIES`)."""
        return [GrowthPoint(r.key, r.metrics.max_ulp, r.metrics.nmse, r.metrics.differing) for r in self.compared_pairs]


def profile_for(choice: str | None, capture: Capture, side: str) -> Profile:
    """The named profile, or the built-in one most of the capture's record names fit."""
    if choice is not None:
        return resolve_profile(choice)
    if not len(capture.index):
        raise ProfileError(f"{capture.path}: /index holds no records: the {side} run has nothing to compare (did its recorder write none?)")
    found = detect_profile(capture.names)
    if found is None:
        raise ProfileError(f"{capture.path}: no built-in profile recognises most of the {side} record names; pass --{side}-profile")
    return found


def resolve_profiles(native: Capture, oracle: Capture, options: CompareOptions) -> tuple[Profile, Profile]:
    """The (native, oracle) profiles a comparison with `options` uses: given, or detected.

    Raises ProfileError. A caller that keys anything on the profiles (the sidecar cache)
    resolves them once and passes them to `iter_compare`, so the key and the result come
    from the same reading of a profile file that may be edited meanwhile."""
    return profile_for(options.native_profile, native, "native"), profile_for(options.oracle_profile, oracle, "oracle")


def _heads(pairs: list[AlignedPair], native_dispatch: np.ndarray) -> dict[tuple[int, str, int, str], int]:
    """Head counts per (step, segment, layer, op): from ops whose canonical axis 0 is heads,
    and from the query-head count of the dispatch events an op made."""
    heads_first = {op for op, axes in CANONICAL_OPS.items() if axes.startswith("heads")}
    candidates = map(pairs.__getitem__, pairs.op_rows(heads_first).tolist()) if isinstance(pairs, AlignedPairs) else pairs
    heads = {(p.key.step, p.key.segment, p.key.layer, p.key.op): p.native.shape[0] for p in candidates if p.key.op in heads_first and p.native.shape}
    events = events_by_record(native_dispatch)
    for p in pairs if events else ():
        made = events.get(p.native.record.seq)
        if made and int(made[0]["q_heads"]) > 0:  # type: ignore[call-overload]
            heads[(p.key.step, p.key.segment, p.key.layer, f"dispatch:{p.key.op}")] = int(made[0]["q_heads"])  # type: ignore[call-overload]
    return heads


def _within(metrics: TensorMetrics, tolerance: Tolerance) -> bool:
    return metrics.bit_exact if tolerance.is_bit_exact else metrics.beyond_tolerance == 0


def iter_compare(
    native: Capture,
    oracle: Capture,
    options: CompareOptions = CompareOptions(),
    profiles: tuple[Profile, Profile] | None = None,
) -> ProgressGenerator[Comparison]:
    """Compare two open captures; yields Progress(bytes done, bytes total, label).

    `profiles` are (native, oracle) profiles already resolved for `options` (resolve_profiles);
    None resolves them here. Records are anchored by their source tensor names where a
    profile matches on them (the llama.cpp profile's unnamed output projection), read only
    then. Raises ProfileError when a profile cannot be found or read, and CaptureError when a
    tensor cannot be read (the capture is unusable as input).
    """
    kept = kept_in_page_cache(native.descriptor, oracle.descriptor)
    with garbage_collection_paused(), ByteChecks(check_threads(options), kept) as checks:
        return (yield from _iter_compare(native, oracle, options, profiles, checks))


def _iter_compare(
    native: Capture, oracle: Capture, options: CompareOptions, profiles: tuple[Profile, Profile] | None, checks: ByteChecks
) -> ProgressGenerator[Comparison]:
    yield Progress(0, 1, "aligning records")
    if options.alignment not in ALIGN_MODES:
        raise ValueError(f"alignment {options.alignment!r} is not one of {', '.join(ALIGN_MODES)}")
    if checks.threads > 1:  # one thread checks nothing early (`ByteChecks.check_early`): finding the stretches took 0.18 s for nothing
        checks.check_early(early_stretches(native, oracle, options.max_steps))
    native_profile, oracle_profile = resolve_profiles(native, oracle, options) if profiles is None else profiles
    native_tokens, oracle_tokens = _tokens_within(native.tokens, options.max_steps), _tokens_within(oracle.tokens, options.max_steps)
    alignment: Alignment = align(
        _records_within(native, options.max_steps),
        _records_within(oracle, options.max_steps),
        native_profile,
        oracle_profile,
        native_sources=sources_for(native, native_profile),
        oracle_sources=sources_for(oracle, oracle_profile),
        overrides=options.overrides,
        mode=options.alignment,
        native_batch=batch_of(native),
        oracle_batch=batch_of(oracle),
    )
    reruns = [side for side, capture in (("native", native), ("oracle", oracle)) if capture.meta.role == RERUN_ROLE]
    if reruns:
        alignment.unaligned = _not_rerun(alignment.unaligned, reruns)
        native_tokens, oracle_tokens = native_tokens[:0], oracle_tokens[:0]
    tokens_unrecorded = _tokens_unrecorded(native.tokens, oracle.tokens) if not reruns else ""
    if tokens_unrecorded:
        native_tokens, oracle_tokens = native_tokens[:0], oracle_tokens[:0]
    routes = validated_routes(
        native_profile.contracts,
        oracle_profile.contracts,
        _provenance_contracts(native),
        _provenance_contracts(oracle),
    )
    contracts = check_contracts(alignment.pairs, routes, native.meta.engine_name == oracle.meta.engine_name)
    batches = (native.meta.batch_size, oracle.meta.batch_size)
    not_compared = dispatch_not_compared(alignment, len(native.dispatch), len(oracle.dispatch))
    dispatch = compare_dispatch(_dispatch_comparable(alignment, not_compared), native.dispatch, oracle.dispatch, batches)
    sizes = pair_byte_counts(alignment.pairs)
    total = int(sizes.sum()) or 1
    yield Progress(0, total, f"execution state checked: {len(contracts.findings)} contract finding(s), {len(dispatch)} dispatch difference(s)")
    eos = shared_eos_step(tokens_by_step(native_tokens), tokens_by_step(oracle_tokens))
    heads = _heads(alignment.pairs, native.dispatch)
    contract_keys = set(contracts.by_key())
    dispatch_keys = {d.key for d in dispatch}
    logits: dict[int, tuple[int, StepLogits]] = {}
    workers = worker_count(options)
    spans, span_bytes_done = read_ahead_spans(native, oracle, alignment.pairs, sizes)
    checks.end_early()
    with ReadAhead(spans, READ_AHEAD_BYTES) as read_ahead:

        def after_pair(index: int) -> None:
            read_ahead.consumed(span_bytes_done[index])

        if workers > 1:
            outcomes = yield from iter_compare_in_workers(native, oracle, alignment.pairs, options, heads, workers, sizes, checks, after_pair)
        else:
            with PairReader(native, oracle, checks) as reader:
                outcomes = yield from iter_compare_pairs(reader, alignment.pairs, options, heads, (0, total), after_pair)
    results = _judge_pairs(alignment.pairs, outcomes, options, eos, contract_keys, dispatch_keys, logits, _emitting_ends(alignment))
    tokens = compare_tokens(native_tokens, oracle_tokens, {step: agreement for step, (_, agreement) in logits.items()})
    comparison = _assemble(native, oracle, native_profile, oracle_profile, options, alignment, contracts, (dispatch, not_compared), results, tokens, eos)
    if tokens_unrecorded:
        comparison.provenance.warnings.append(tokens_unrecorded)
    return comparison


def _judge_pairs(
    pairs: Sequence[AlignedPair],
    outcomes: list[PairOutcome],
    options: CompareOptions,
    eos: int | None,
    contract_keys: set[OpKey],
    dispatch_keys: set[OpKey],
    logits: dict[int, tuple[int, StepLogits]],
    emitting_ends: dict[int, int],
) -> PairResults:
    """Every pair's (within tolerance, kind), judged once per distinct (metrics object, tolerance,
    post-EOS, contract finding, dispatch difference) on columns: a real run's pairs share a few
    metrics objects (identical pairs one per dtype and shape) and tolerances. No `PairResult`
    is built here (`PairResults` builds one when asked). Judged pair by pair with an object
    each, this took 0.43 s for 240,000 pairs."""
    count = len(pairs)
    metrics: list[TensorMetrics] = list(map(itemgetter(0), outcomes))
    agreements = list(map(itemgetter(1), outcomes))
    # The key objects only for a set to look them up in, or for pairs without key columns.
    keys = list(map(itemgetter(0), pairs)) if contract_keys or dispatch_keys or not isinstance(pairs, AlignedPairs) else []
    steps = pairs.keys_columns.step if isinstance(pairs, AlignedPairs) else np.fromiter(map(attrgetter("step"), keys), np.int64, count)
    post_eos = steps > eos if eos is not None else np.zeros(count, dtype=bool)
    contract = np.fromiter(map(contract_keys.__contains__, keys), bool, count) if contract_keys else np.zeros(count, dtype=bool)
    differs = np.fromiter(map(dispatch_keys.__contains__, keys), bool, count) if dispatch_keys else np.zeros(count, dtype=bool)
    if options.policy is None:
        tolerances: list[Tolerance] = [options.tolerance]
        tolerance_of = np.zeros(count, dtype=np.int64)
    else:
        each = [options.tolerance_for(pair.key, pair.native.record.dtype) for pair in pairs]
        tolerance_ids = np.fromiter(map(id, each), np.int64, count)
        _, first_of, tolerance_of = np.unique(tolerance_ids, return_index=True, return_inverse=True)
        tolerances = [each[i] for i in first_of.tolist()]
    metric_ids = np.fromiter(map(id, metrics), np.int64, count)
    facts = groups(metric_ids, tolerance_of.reshape(-1), *(flag.astype(np.int64) for flag in (post_eos, contract, differs))) if count else None
    kinds: list[Kind] = []
    if facts is None:
        within, bit_exact, kind_codes = np.zeros(0, dtype=bool), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    else:
        judged_within, judged_kind, judged_exact = [], [], []
        for at in facts.first.tolist():
            within_one, kind = _judged(metrics[at], tolerances[int(tolerance_of[at])], bool(post_eos[at]), bool(contract[at]), bool(differs[at]))
            if kind not in kinds:
                kinds.append(kind)
            judged_within.append(within_one)
            judged_kind.append(kinds.index(kind))
            judged_exact.append(metrics[at].bit_exact)
        within = np.array(judged_within, dtype=bool)[facts.of_row]
        kind_codes = np.array(judged_kind, dtype=np.int64)[facts.of_row]
        bit_exact = np.array(judged_exact, dtype=bool)[facts.of_row]
    for at in np.flatnonzero(np.fromiter(map(is_not, agreements, repeat(None)), bool, count)).tolist():
        _keep_logits(logits, pairs[at], agreements[at], emitting_ends)  # type: ignore[arg-type]
    return PairResults(pairs, metrics, post_eos, within, kind_codes, kinds, bit_exact)


def _tokens_unrecorded(native: np.ndarray, oracle: np.ndarray) -> str:
    """Why the greedy tokens are not compared ("" when they are): one capture records none (no
    /tokens table, as an import of tensors), which made every step of the other "missing" and
    the pair a token DIVERGENCE, as a capture without a dispatch table never made its calls differ."""
    unrecorded = [side for side, table in (("native", native), ("oracle", oracle)) if not len(table)]
    if len(unrecorded) != 1:
        return ""
    return f"the {unrecorded[0]} capture records no tokens, so the greedy tokens were not compared"


def _cut_alike(alignment: Alignment, roles: tuple[str, str]) -> bool:
    """`align.cut_alike`, except for a saved rerun: it holds only the calls it recomputed, each
    counted from position 0 when it recorded no positions, so its calls are alike when each is a
    call of the other run, as long. Any rerun was taken as cut alike, and one cut where the other
    run made no call read "same calls"."""
    calls = (alignment.native_calls, alignment.oracle_calls)
    if RERUN_ROLE not in roles:
        return cut_alike(*calls)
    rerun, other = calls if roles[0] == RERUN_ROLE else calls[::-1]
    lengths = {(c.step, c.segment): c.span[1] - c.span[0] for c in other}
    return all(lengths.get((c.step, c.segment)) == c.span[1] - c.span[0] for c in rerun)


def _not_rerun(unaligned: list[UnalignedRecord], reruns: list[str]) -> list[UnalignedRecord]:
    """A run compared with a rerun of some of its ops (the viewer's Save and compare, `rerun
    --save` then `report`): its records the rerun does not hold are by design, and the rerun has
    no tokens to compare. A rerun that reproduced its route side bit for bit read as DIVERGENCE,
    for the 332 records it never recomputed and the tokens it never emitted."""
    detail = f"the {' and '.join(reruns)} capture is a rerun, which holds only the ops it recomputed"
    return [replace(u, reason=NOT_RERUN, detail=detail) if u.reason == NO_PARTNER and u.side not in reruns else u for u in unaligned]


CUT_APART = (
    "compared only in the calls both runs made alike (the same positions in one call each, as decode steps are); "
    "elsewhere the runs were cut into different calls, so their attention calls differ by construction"
)


def _dispatch_comparable(alignment: Alignment, not_compared: str) -> Sequence[AlignedPair]:
    """The pairs whose attention calls are compared: all, none where a side records none, and,
    of runs cut differently, the whole records of calls both made over the same positions: with
    the prompt cut differently, a decode step's calls that differed in their primitive read PARITY."""
    if not not_compared:
        return alignment.pairs
    if not_compared != CUT_APART:
        return []
    spans = call_spans(alignment.native_calls, alignment.oracle_calls)
    return [pair for pair in alignment.pairs if made_alike(pair, spans)]


def dispatch_not_compared(alignment: Alignment, native_events: int, oracle_events: int) -> str:
    """Why the runs' attention calls cannot be compared pair by pair ("" when they can). A
    capture that records no calls (an import, an engine without a dispatch table) says nothing
    about how its engine split the work: every attention op of a bit-identical pair was
    dispatch-only against it. Runs paired by position are compared call by call when they were
    cut alike (each record is then one pair): a user's `--align positions` turned a dispatch
    difference into PARITY."""
    if alignment.mode == POSITIONS and not cut_alike(alignment.native_calls, alignment.oracle_calls):
        return CUT_APART
    unrecorded = [side for side, events in (("native", native_events), ("oracle", oracle_events)) if not events]
    if len(unrecorded) == 2:
        return "not compared: neither capture records its attention calls"
    if unrecorded:
        return f"not compared: the {unrecorded[0]} capture records no attention calls (no dispatch table), so how its engine split the work is unknown"
    return ""


def _records_within(capture: Capture, max_steps: int | None) -> Sequence[Record]:
    """The capture's records of the steps a budget of `max_steps` covers (all when None: the
    capture's `Records`, whose index columns alignment groups by, `record_columns`)."""
    if max_steps is None:
        return capture.records
    return [r for r in capture.records if r.step < max_steps]


def _tokens_within(table: np.ndarray, max_steps: int | None) -> np.ndarray:
    """The token table's rows of the steps a budget of `max_steps` covers (all when None)."""
    return table if max_steps is None else table[table["step"] < max_steps]


def _provenance_contracts(capture: Capture) -> dict[str, object]:
    table = capture.meta.provenance.get("contracts", {}) if isinstance(capture.meta.provenance, dict) else {}
    return table if isinstance(table, dict) else {}


def _keep_logits(logits: dict[int, tuple[int, StepLogits]], pair: AlignedPair, agreement: StepLogits, emitting_ends: dict[int, int]) -> None:
    """The agreement of the step's last logits record (its last segment emits the token). Paired
    by position, only a pair that holds the position the step's token comes from: a pair of
    earlier rows (the other run recorded logits only there) gave "logits differ at the oracle's
    token" of position 7 beside a token emitted at position 11."""
    step, seq = pair.key.step, pair.native.record.seq
    if pair.key.positions and emitting_ends.get(step) not in (None, pair.key.positions[1]):
        return
    if step in logits and logits[step][0] > seq:
        return
    logits[step] = (seq, agreement)


def _emitting_ends(alignment: Alignment) -> dict[int, int]:
    """Paired by position: each step's end in the native run, past the position its token comes
    from (the end of the step's furthest call); by calls, none."""
    if alignment.mode != POSITIONS:
        return {}
    ends: dict[int, int] = {}
    for call in alignment.native_calls:
        ends[call.step] = max(ends.get(call.step, call.span[1]), call.span[1])
    return ends


def _judged(metrics: TensorMetrics, tolerance: Tolerance, post_eos: bool, contract: bool, dispatch: bool) -> tuple[bool, Kind]:
    """Whether a pair is within its tolerance, and its kind under the one verdict model."""
    within = _within(metrics, tolerance)
    kind = classify_pair(
        post_eos=post_eos,
        contract_mismatch=contract,
        bit_exact=metrics.bit_exact,
        within_tolerance=within,
        signed_zero_only=metrics.differing == metrics.signed_zero_only,
        dispatch_differs=dispatch,
        tolerance_set=not tolerance.is_bit_exact,
    )
    return within, kind


def _pair_detail(r: PairResult, contracts: dict[OpKey, list[ContractFinding]], dispatch: dict[OpKey, DispatchDifference]) -> str:
    m = r.metrics
    if r.verdict == Kind.CONTRACT_MISMATCH:
        return "; ".join(f.text() for f in contracts[r.key])
    differing = f"{m.differing:,} of {m.size:,} {m.unit} differ{_how_they_differ(m)}{_first_position(r)}{_beyond_tolerance(m)}"
    if r.verdict == Kind.DISPATCH_ONLY:
        bits = "bits identical" if m.bit_exact else f"bits within tolerance ({differing})"
        return f"{bits}, attention calls differ in {', '.join(dispatch[r.key].fields)}"
    return differing


def _how_they_differ(m: TensorMetrics) -> str:
    """The headline's measure of the differing elements. NaN against a number has no ULP
    distance: a pair differing only so read "max 0 ULP", and a +0/-0 swap is no error at all."""
    if not m.differing:
        return ""
    if m.signed_zero_only == m.differing:
        return ", all +0/-0 swaps"
    special = [(getattr(m, count), words) for count, words in SPECIAL_ELEMENTS]
    for count, words in special[:2]:  # NaNs have no ULP distance: their count alone says what differs
        if count == m.differing:
            return f", each {words}"
    said = "".join(f", {count:,} {words}" for count, words in special if count)
    return ("" if m.max_ulp is None else f", max {m.max_ulp:,} ULP") + said


def _beyond_tolerance(m: TensorMetrics) -> str:
    beyond = m.beyond_elsewhere
    return "" if beyond is None else f"; {m.beyond_tolerance:,} beyond tolerance, first at {beyond.coord}"


def _first_position(r: PairResult) -> str:
    """Where in the prompt the pair first differs, when it was paired by position."""
    first = r.metrics.first_difference
    if not r.key.positions or first is None or len(first.coord) != len(r.metrics.shape):
        return ""
    axis = rows_axis(r.key.op)
    rows = r.metrics.per_row
    row = first.coord[axis]
    if rows is not None and len(rows.differing) == r.metrics.shape[axis]:
        # The lowest differing row, not the row of the first differing element in storage
        # order: of an op laid out heads first, that was head 0's, past a lower row of head 5.
        row = next((row for row, count in enumerate(rows.differing) if count), row)
    return f", first at position {r.key.positions[0] + row}"


def token_finding(tokens: TokenParity, results: Sequence[PairResult], unaligned: list[UnalignedRecord]) -> Finding | None:
    """The first pre-EOS step whose greedy tokens differ, keyed by that step's logits op: the
    verdict's token finding, and where the tree marks it. Without a logits pair, the key of that
    step's logits record left without a partner: keyed without its positions, a run paired by
    position named a row no surface had."""
    step = tokens.first_divergence_step
    if step is None:
        return None
    row = next(s for s in tokens.steps if s.step == step)
    keys = results.keys() if isinstance(results, PairResults) else (r.key for r in results)
    logits = [key for key in keys if key.step == step and key.op == "logits"]
    alone = [u.key for u in unaligned if u.key is not None and u.key.step == step and u.key.op == "logits"]
    key = logits[-1] if logits else alone[-1] if alone else OpKey(step, row.segment, -1, "logits")
    if row.native_token is not None and row.native_token == row.oracle_token:
        # "greedy tokens differ" over token 148 on both sides sent users looking for a wrong token.
        stops = "native" if row.native_stop else "oracle"
        return Finding(Kind.TOKENS, key, f"token {row.native_token} on both sides, a stop only in the {stops} run")
    return Finding(Kind.TOKENS, key, f"native token {token_words(row.native_token, row.native_stop)} vs oracle token {token_words(row.oracle_token, row.oracle_stop)}")


def not_aligned(comparison: Comparison, key: OpKey) -> str:
    """Why `key` (a command's `--op`) names no pair, with what the user may have meant: the op's
    pairs when the runs were paired by position (their keys carry positions), or its records
    without a partner."""
    place = key._replace(positions=())
    said = f"{key} is not an aligned op of this comparison"
    if key.op not in CANONICAL_OPS:
        return f"{said}: '{key.op}' is no canonical op (they are {', '.join(CANONICAL_OPS)}; report lists the aligned ones)"
    if key.positions and comparison.alignment.mode != POSITIONS and any(p.key == place for p in comparison.pairs):
        # A key copied from the window or a report paired by position, given to a command pairing by calls.
        return (
            f"{said}: the records were paired by calls, where this op is {place}; its @ positions name a pair made by position "
            "(--align positions; in the window, Compare > Pair records > By token position)"
        )
    cut = [p.key.text() for p in comparison.pairs if p.key.positions and p.key._replace(positions=()) == place]
    if cut:
        more = f" and {len(cut) - 3} more" if len(cut) > 3 else ""
        return f"{said}: the records were paired by position, and this op's pairs are {', '.join(cut[:3])}{more}"
    if any(u.key is not None and u.key._replace(positions=()) == place for u in comparison.post_eos_unaligned):
        # Not "has no partner", which read as a capture gap: the run that stopped at the EOS made none by design.
        return (
            f"{said}: step {key.step} is after the shared EOS (step {comparison.verdict.shared_eos}), where one run stopped; "
            "post-EOS records are invalid, never failures"
        )
    alone = [u for u in comparison.unaligned if u.key is not None and u.key._replace(positions=()) == place]
    if alone:
        return f"{said}: " + "; ".join(f"its {u.side} record {u.name!r} is unpaired ({u.why()})" for u in alone)
    return said


WORST_ORDER = "a NaN or an infinity against a number first, then NMSE, then p99 ULP error"
"""How `worst_ops` ranks, in the words every surface heads its list with."""


def _finite_or_worst(value: float) -> float:
    return math.inf if math.isnan(value) else value


def no_dispatch_difference(c: Comparison) -> str:
    """What a comparison that found no dispatch difference says of the attention calls: runs cut
    differently and paired by calls compared the calls of their paired ops only, and "every
    attention op made the same primitive calls" was said of prefills never compared."""
    if c.alignment.mode != POSITIONS and not c.alignment.cut_alike:
        return "no differences among the ops paired by calls; the runs were cut differently, and the calls of records without a partner are not compared"
    return "no differences: every attention op made the same primitive calls on both sides"


def worst_ops(c: Comparison, top: int) -> list[PairResult]:
    """The pre-EOS pairs that differ, worst first: a NaN or an infinity against a number first
    (NMSE leaves them out, and such an op ranked last, below the top ten), then by NMSE, p99 ULP
    error and how many elements."""
    return sorted(
        (c.pairs[i] for i in differing_rows(c.pairs)),
        # A NaN NMSE (float64 sums that overflowed) ranks as the worst: NaN in a sort key orders nothing.
        key=lambda p: (p.metrics.nan_mismatch + p.metrics.inf_mismatch > 0, _finite_or_worst(p.metrics.nmse), p.metrics.p99_ulp_error or 0.0, p.metrics.differing),
        reverse=True,
    )[:top]


def unaligned_key(u: UnalignedRecord) -> OpKey:
    """An unaligned record's place: its canonical key when its profile gave it one, else its own name there."""
    return u.key if u.key is not None else OpKey(u.step, u.segment, u.layer, u.name, u.occurrence)


def unaligned_count(unaligned: list[UnalignedRecord]) -> str:
    """How many records are unaligned, and how many of those by design (`BY_DESIGN`): every
    surface's count, so "108 unaligned" of a llama.cpp capture's views never reads as 108
    problems."""
    designed = sum(u.reason in BY_DESIGN for u in unaligned)
    if not designed:
        return f"{len(unaligned):,} unaligned"
    return f"{len(unaligned):,} unaligned ({'all' if designed == len(unaligned) else f'{designed:,}'} by design)"


def _unaligned_findings(unaligned: list[UnalignedRecord]) -> list[Finding]:
    """Unaligned records are findings, except those the runs hold differently by design (a stage
    a profile declares one-sided, probabilities over caches padded differently): their consumers
    are compared."""
    ordered = sorted((u for u in unaligned if u.reason not in BY_DESIGN), key=lambda u: (u.step, u.side != "native", u.seq))
    return [Finding(Kind.UNALIGNED, unaligned_key(u), f"{u.side} {u.name!r}: {REASON_WORDS[u.reason]}" + (f" ({u.detail})" if u.detail else "")) for u in ordered]


def _assemble(
    native: Capture,
    oracle: Capture,
    native_profile: Profile,
    oracle_profile: Profile,
    options: CompareOptions,
    alignment: Alignment,
    contracts: ContractCheck,
    dispatch_check: tuple[list[DispatchDifference], str],
    results: PairResults,
    tokens: TokenParity,
    eos: int | None,
) -> Comparison:
    differing = differing_rows(results)
    first_divergence = differing[0] if differing else None
    failing = np.array([kind in FAILING for kind in results.kinds] or [False], dtype=bool)
    compared = [results[i] for i in np.flatnonzero(~results.post_eos & failing[results.kind_codes]).tolist()] if len(results) else []
    unaligned = [u for u in alignment.unaligned if eos is None or u.step <= eos]
    post_eos_unaligned = [u for u in alignment.unaligned if eos is not None and u.step > eos]
    # Ops after the shared EOS are invalid, never failures: their contracts and attention calls
    # are no findings either (the text, the HTML and the window's card listed them as errors).
    contracts = replace(contracts, findings=[f for f in contracts.findings if eos is None or f.key.step <= eos])
    dispatch = [d for d in dispatch_check[0] if eos is None or d.key.step <= eos]
    by_key = contracts.by_key()
    dispatch_by_key = {d.key: d for d in dispatch}
    pair_findings = [Finding(r.verdict, r.key, _pair_detail(r, by_key, dispatch_by_key)) for r in compared if r.verdict in FAILING]
    verdict = judge(pair_findings, token_finding(tokens, results, unaligned), _unaligned_findings(unaligned), pair_kinds(results), tokens.compared_steps > 0, eos)
    return Comparison(
        native_path=str(native.path),
        oracle_path=str(oracle.path),
        native_profile=native_profile.name,
        oracle_profile=oracle_profile.name,
        native_profile_identity=identify(native_profile),
        oracle_profile_identity=identify(oracle_profile),
        tolerance=options.tolerance if options.policy is None or not options.tolerance.is_bit_exact else options.policy.default.tolerance,
        tolerance_policy=options.policy.source if options.policy is not None else "",
        provenance=diff_provenance(native.meta, oracle.meta, same_file(native.path, oracle.path)),
        contracts=contracts,
        dispatch_differences=dispatch,
        dispatch_not_compared=dispatch_check[1],
        pairs=results,
        unaligned=unaligned,
        post_eos_unaligned=post_eos_unaligned,
        first_divergence=first_divergence,
        tokens=tokens,
        verdict=verdict,
        alignment=AlignmentMode(
            alignment.mode,
            [c.text() for c in alignment.native_calls],
            [c.text() for c in alignment.oracle_calls],
            _batch_text(batch_of(native)),
            _batch_text(batch_of(oracle)),
            _cut_alike(alignment, (native.meta.role, oracle.meta.role)),
        ),
    )
