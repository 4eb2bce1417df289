"""The one place the viewer reads the diff engine's `Comparison` (sessions.compare.comparison).

Every verdict, count and label shown in the panels comes from the comparison; this module
only turns them into display text and finds things in it, so the panels stay free of
domain logic and a change in the engine's result shape is absorbed here.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from backends.dispatch.timeline import Timeline, build_timeline
from backends.rerun.segment import rerunnable_keys
from sessions.capture.reader import Capture, CaptureError
from sessions.capture.record_attributes import RecordAttributes, iter_records_attributes
from sessions.compare.comparison import (
    Comparison,
    PairResult,
    token_finding,
    unaligned_key,
    worst_ops,
)
from sessions.compare.contracts import KIND_WORDS, ContractFinding
from sessions.compare.dispatch_diff import DispatchDifference
from sessions.compare.in_child import iter_compare_in_child
from sessions.compare.key import OpKey, grouped_by_key
from sessions.compare.options import CompareOptions
from sessions.compare.pair_tensors import pair_sides
from sessions.compare.provenance_diff import EXPECTED_TO_DIFFER
from sessions.compare.token_parity import (
    POST_EOS,
    TokenStep,
    TopEntry,
    step_word,
    token_words,
)
from sessions.compare.unaligned import BY_DESIGN, UnalignedRecord
from sessions.compare.verdict import NOT_EXACT, SEVERITY, Finding, Kind
from sessions.gc_pause import garbage_collection_paused
from sessions.progress import ProgressGenerator
from sessions.report.plot_bins import worst_per_bin
from sessions.report.text import counts_line, tolerance_text, ulp_error_figure
from viewer.tensor.tensor_loader import SliceSpec, TensorRequest


@dataclass
class ViewedComparison:
    """The engine's comparison plus what the panels look up in it, found once (`of`), on the
    worker thread: over a real model's hundreds of thousands of pairs these take seconds the
    window must not wait for."""

    comparison: Comparison
    findings: dict[OpKey, list[ContractFinding]]
    """Contract findings by op key."""
    dispatch_of: dict[OpKey, list[DispatchDifference]]
    """Dispatch differences by op key."""
    pair_of: dict[OpKey, PairResult]
    """Each op's pair, by its key (the first pair under a key, as a search in order finds)."""
    growth: GrowthSeries
    rerunnable: list[str]
    """The keys a rerun can recompute (`rerunnable_keys`), as text."""
    tree: TreePlaces
    worst: list[PairResult]
    """The worst WORST_OPS_SHOWN differing ops, worst first (`worst_ops`)."""
    differing: int
    """How many pre-EOS ops differ in all."""
    position_of: dict[int, int]
    """Each pair's place in the comparison's pairs, by id(pair)."""
    stepped: list[int]
    """Places of the pairs F8 steps through (every kind that is not bit-exact, before EOS), ascending."""
    summary: str
    """The tree's line under the verdict (`summary_line`): counting a real model's unaligned
    records by reason took 19 ms of the comparison's arrival."""
    timeline: Timeline | None = None
    """Both captures' dispatch events on one call axis (`build_timeline`), when the captures were given."""
    timeline_problem: str = ""
    """Why there is no timeline, when building it failed."""

    @classmethod
    def of(cls, comparison: Comparison, native: Capture | None = None, oracle: Capture | None = None) -> ViewedComparison:
        """With the captures, the dispatch timeline too: built here, before the comparison
        arrives, a worker building it after competed with the window for the interpreter lock
        while the window drew the comparison."""
        pair_of = {pair.key: pair for pair in reversed(comparison.pairs)}
        differing = worst_ops(comparison, len(comparison.pairs))
        timeline, problem = None, ""
        if native is not None and oracle is not None:
            try:
                timeline = build_timeline(native, oracle, comparison)
            except Exception as exc:  # a capture's dispatch table can be anything: the window says why, never crashes
                problem = f"{type(exc).__name__}: {exc}"
        return cls(
            comparison,
            comparison.contracts.by_key(),
            grouped_by_key(comparison.dispatch_differences),
            pair_of,
            _growth_series(comparison),
            [key.text() for key in rerunnable_keys(comparison)],
            tree_places(comparison),
            differing[:WORST_OPS_SHOWN],
            len(differing),
            {id(pair): i for i, pair in enumerate(comparison.pairs)},
            [i for i, pair in enumerate(comparison.pairs) if pair.verdict in NOT_EXACT],
            summary_line(comparison),
            timeline,
            problem,
        )


WORST_OPS_SHOWN = 1000
"""Rows of the Worst ops table: past the first divergence of a real model's run nearly every op
differs, and a table row costs about what a tree row does (0.3 ms)."""


TreePath = tuple[int, str, "int | str"]
"""Where a pair sits in the alignment tree: (step, segment, layer), or for a model-level op
"before"/"after" in place of the layer."""
UNALIGNED_BRANCH = "unaligned"
POST_EOS_BRANCH = "post-eos unaligned"
"""Records after the shared EOS step without a partner: shown, as `report` lists them, never as findings."""
BY_DESIGN_STATUS = "by design"
"""The tree's status for an unaligned record the runs hold differently by design (`BY_DESIGN`):
not a finding, so not the failing look of Kind.UNALIGNED."""
MANUAL_MARKER = " [manual]"
"""Marks a pair the user made by hand, in its row and in what the filter matches."""


@dataclass(eq=False)
class TreeGroup:
    """A step, segment or layer row of the alignment tree, before (or after) its row exists:
    what it holds and the worst verdict below it. Built for every pair on the worker thread;
    the tree makes a group's rows when it is opened."""

    label: str
    path: tuple[Any, ...] = ()
    """Where it sits (step, segment, layer place), which its row holds to find it again."""
    status: str | None = None
    children: dict[Any, TreeGroup] = field(default_factory=dict)
    pairs: list[PairResult] = field(default_factory=list)
    records: list[UnalignedRecord] = field(default_factory=list)
    records_status: str | None = None
    """The status of every one of `records` (post-EOS), where their reason does not give it."""

    def record_status(self, record: UnalignedRecord) -> str:
        return self.records_status or unaligned_status(record)

    def child(self, part: Any, label: str) -> TreeGroup:
        found = self.children.get(part)
        if found is None:
            found = self.children[part] = TreeGroup(label, (*self.path, part))
        return found

    def find(self, path: tuple[Any, ...]) -> TreeGroup | None:
        group: TreeGroup | None = self
        for part in path:
            group = group.children.get(part) if group is not None else None
        return group

    def worsen(self, status: str) -> None:
        """A group shows the worst verdict below it, so a collapsed tree still points at the problem."""
        if self.status is None or SEVERITY[status] > SEVERITY[self.status]:
            self.status = status


@dataclass(frozen=True)
class TreePlaces:
    """The alignment tree's groups and what its filter searches, for every pair at once."""

    root: TreeGroup
    """Steps, then segments, then layer places (pairs below them), in execution order; last,
    the unaligned records' branch (UNALIGNED_BRANCH) when there are any."""
    path_of: dict[int, TreePath]
    """A pair's group, by id(pair)."""
    search: np.ndarray
    """One lower-case line per pair (`search_text`), UTF-8, in the order of the comparison's pairs (`search_lines`)."""
    records: list[UnalignedRecord] = field(default_factory=list)
    """The records without a partner, those before the shared EOS first: what `record_search` lines describe."""
    record_path_of: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    """A record's group, by id(record)."""
    record_search: np.ndarray = field(default_factory=lambda: search_lines([]))
    """One lower-case line per record of `records` (`record_search_text`)."""

    def matches(self, needle: str, limit: int) -> tuple[list[int], int]:
        """Positions (in the comparison's pairs) of the first `limit` pairs whose line holds
        `needle`, and how many pairs' lines do. One vectorised search of every line costs the
        same whatever the needle (240,000 lines: 11 ms); walking one joined string with
        str.find took 150 ms a key for a needle every line holds twice ("decode")."""
        return _found(self.search, needle, limit)

    def record_matches(self, needle: str, limit: int) -> tuple[list[int], int]:
        """`matches` among the records without a partner (positions in `records`)."""
        return _found(self.record_search, needle, limit)


def _found(lines: np.ndarray, needle: str, limit: int) -> tuple[list[int], int]:
    if not needle or "\n" in needle or "\0" in needle:
        return [], 0
    found = np.flatnonzero(np.strings.find(lines, needle.encode()) >= 0)
    return found[:limit].tolist(), len(found)


def search_lines(lines: list[str]) -> np.ndarray:
    """Filter lines as fixed-width UTF-8 bytes: a substring of the text is a substring of its
    UTF-8 bytes. Each line is bounded by the index's field widths, so the padding is too."""
    return np.array([line.replace("\n", " ").encode() for line in lines], dtype=np.bytes_)


def place_label(place: int | str) -> str:
    """A layer group's label, or where model-level ops sit: before or after the layers."""
    return f"layer {place}" if isinstance(place, int) else f"{place} layers"


def search_text(pair: PairResult, path: TreePath) -> str:
    """What the filter box matches a pair against when its row may not exist yet: its row's cells,
    its groups' labels, and its key as `report` prints it (a key copied from a terminal finds its op)."""
    manual = MANUAL_MARKER if pair.manual_reason is not None else ""
    return f"{pair_op_label(pair)}{manual} {pair.verdict} step {path[0]} {path[1]} {place_label(path[2])} {pair.key.text()}".lower()


def record_search_text(record: UnalignedRecord, status: str) -> str:
    """What the filter box matches a record without a partner against: its row's cells, its
    key as `report` prints it, and its step group's label."""
    return f"{unaligned_label(record)} {status} {record.why()} {unaligned_key(record).text()} step {record.step}".lower()


RECORDS_BY_STEP_FROM = 1_000
"""A branch of more records without a partner than this holds them in a group per step: made
all at once when the branch opened, a real run's 40,000 took 1.5 s."""


class _RecordPlaces:
    """The records without a partner as `TreePlaces` holds them, filled branch by branch."""

    def __init__(self) -> None:
        self.records: list[UnalignedRecord] = []
        self.path_of: dict[int, tuple[Any, ...]] = {}
        self.lines: list[str] = []

    def add_branch(self, root: TreeGroup, part: str, label: str, records: list[UnalignedRecord], status: str | None) -> None:
        """The branch of `records` (`status`: every record's, else each one's own), under a group
        per step when there are many (RECORDS_BY_STEP_FROM)."""
        branch = root.child(part, label)
        by_step = len(records) > RECORDS_BY_STEP_FROM
        for record in records:
            group = branch.child(record.step, f"step {record.step}") if by_step else branch
            group.records.append(record)
            group.records_status = status
            look = status or unaligned_status(record)
            if look != BY_DESIGN_STATUS:
                group.worsen(look)
                branch.worsen(look)
            self.records.append(record)
            self.path_of[id(record)] = group.path
            self.lines.append(record_search_text(record, look))


def _place(step: int, segment: str, layer: int, layered: set[tuple[int, str]]) -> int | str:
    """A layer's group, or for a model-level op (layer -1) where it ran, before or after the
    layers seen so far, so the tree reads top to bottom in execution order, like every other surface."""
    if layer >= 0:
        return layer
    return "after" if (step, segment) in layered else "before"


def tree_places(comparison: Comparison) -> TreePlaces:
    layered: set[tuple[int, str]] = set()
    leaves: dict[TreePath, list[PairResult]] = {}
    path_of: dict[int, TreePath] = {}
    lines = []
    for pair in comparison.pairs:
        key = pair.key
        if key.layer >= 0:
            layered.add((key.step, key.segment))
        path = (key.step, key.segment, _place(key.step, key.segment, key.layer, layered))
        leaves.setdefault(path, []).append(pair)
        path_of[id(pair)] = path
        lines.append(search_text(pair, path))
    root = TreeGroup("")
    for path, grouped in leaves.items():
        worst = max((p.verdict for p in grouped), key=SEVERITY.__getitem__)
        group = root
        for label, part in zip((f"step {path[0]}", path[1], place_label(path[2])), path):
            group = group.child(part, label)
            group.worsen(worst)
        group.pairs = grouped
    places = _RecordPlaces()
    if comparison.unaligned:
        designed = sum(u.reason in BY_DESIGN for u in comparison.unaligned)
        by_design = f", {designed} by design" if designed else ""
        places.add_branch(root, UNALIGNED_BRANCH, f"Unaligned records ({len(comparison.unaligned)}{by_design})", comparison.unaligned, None)
        for record in comparison.unaligned:
            if unaligned_status(record) != Kind.UNALIGNED:
                continue
            where = (record.step, record.segment, _place(record.step, record.segment, record.layer, layered))
            for depth in range(1, 4):
                group = root.find(where[:depth])
                if group is not None:
                    group.worsen(Kind.UNALIGNED)  # where the missing partner would sit: a collapsed tree points there
    tokens = token_finding(comparison.tokens, comparison.pairs, comparison.unaligned)
    if tokens is not None:
        # A tree whose every op is bit-exact still points at the step whose tokens differ: down to
        # its logits op's group when there is one, else its step and segment.
        logits = next((pair for pair in reversed(comparison.pairs) if pair.key == tokens.key), None)
        where = path_of[id(logits)] if logits is not None else (tokens.key.step, tokens.key.segment)
        for depth in range(1, len(where) + 1):
            group = root.find(where[:depth])
            if group is not None:
                group.worsen(Kind.TOKENS)
    if comparison.post_eos_unaligned:
        count = len(comparison.post_eos_unaligned)
        label = f"Post-EOS records without a partner ({count}: invalid, not failures)"
        places.add_branch(root, POST_EOS_BRANCH, label, comparison.post_eos_unaligned, Kind.POST_EOS)
    return TreePlaces(root, path_of, search_lines(lines), places.records, places.path_of, search_lines(places.lines))


def unaligned_status(record: UnalignedRecord) -> str:
    """A record's look in the tree: a finding (Kind.UNALIGNED), or by design (grey: the runs hold it differently)."""
    return BY_DESIGN_STATUS if record.reason in BY_DESIGN else Kind.UNALIGNED


VIEWER_OPTIONS = CompareOptions(chunk_bytes=4 * 1024 * 1024)


def iter_compare_pair(native: Capture, oracle: Capture, options: CompareOptions = VIEWER_OPTIONS) -> ProgressGenerator[ViewedComparison]:
    """The diff runs in a child process: on a worker thread it held the interpreter lock for
    150-250 ms at a time (h5py reads, numpy), and a file that crashes libhdf5 mid-diff would
    take the window down. The window keeps its own open captures for showing tensors, and
    keeps the comparison away from the cyclic collector (`for_window`), whose walks over its
    objects stalled the window for a second at a time."""
    comparison = yield from iter_compare_in_child(native.path, oracle.path, options, for_window=True)
    with garbage_collection_paused(keep_made=True):
        return ViewedComparison.of(comparison, native, oracle)


# -- pairs ------------------------------------------------------------------------------------


def pairs(viewed: ViewedComparison) -> list[PairResult]:
    return viewed.comparison.pairs


def first_pair(viewed: ViewedComparison) -> PairResult | None:
    return viewed.comparison.pairs[0] if viewed.comparison.pairs else None


def first_finding(viewed: ViewedComparison | None) -> Finding | None:
    return None if viewed is None else viewed.comparison.verdict.first


EVIDENCE_TABS = {Kind.TOKENS: "Token parity", Kind.DISPATCH_ONLY: "Dispatch timeline"}
"""The tab that shows a finding of these kinds; any other finding's pair is shown in Tensor diff."""


def evidence_tab(finding: Finding) -> str:
    return EVIDENCE_TABS.get(finding.kind, "Tensor diff")


def finding_place(finding: Finding) -> str:
    """Where the window shows a finding, in words: its tab, or the tree (an op's contract card, a record without a partner)."""
    return f"in the {EVIDENCE_TABS[finding.kind]} tab" if finding.kind in EVIDENCE_TABS else "in the tree"


def first_finding_pair(viewed: ViewedComparison | None) -> PairResult | None:
    """The pair the verdict's first finding names, when it names an aligned op (Ctrl+J's target)."""
    first = first_finding(viewed)
    return None if first is None else find_pair(viewed, first.key)


def first_finding_record(viewed: ViewedComparison | None) -> UnalignedRecord | None:
    """The unaligned record the verdict's first finding names, when it names one: an unaligned
    finding's, or a token step's logits that only one run recorded (a run that stopped earlier)."""
    first = first_finding(viewed)
    if viewed is None or first is None or find_pair(viewed, first.key) is not None:
        return None  # a pair the finding names is where it points, on arrival as for Ctrl+J
    return next((u for u in viewed.comparison.unaligned if unaligned_key(u) == first.key), None)


def neighbour_divergence(viewed: ViewedComparison, current: PairResult | None, direction: int, among: Sequence[int] | None = None) -> PairResult | None:
    """The next (or previous) pair worth stepping through with F8: every kind that is not
    bit-exact, before EOS, or of those the places `among` (ascending; the filter's). Found by
    bisection in places worked out on the worker thread."""
    pairs, stepped = viewed.comparison.pairs, viewed.stepped if among is None else among
    here = viewed.position_of.get(id(current), -1 if direction > 0 else len(pairs))
    if direction > 0:
        at = bisect_right(stepped, here)
        return pairs[stepped[at]] if at < len(stepped) else None
    at = bisect_left(stepped, here)
    return pairs[stepped[at - 1]] if at > 0 else None


def stepped_under_filter(viewed: ViewedComparison, text: str, causes: dict[OpKey, str]) -> list[int]:
    """The places F8 steps through that the tree's filter `text` may show: their search lines
    (`search_text`) or their cause column (`causes`, a diagnosis's words) hold it. The tree's
    filter, cell by cell, decides among them (`FindingSteps.step`)."""
    found, _ = viewed.tree.matches(text.lower(), len(viewed.comparison.pairs))
    needle = text.lower()
    caused = [viewed.position_of[id(viewed.pair_of[key])] for key, word in causes.items() if needle in word.lower() and key in viewed.pair_of]
    return np.intersect1d(np.asarray(viewed.stepped, dtype=np.int64), np.asarray(found + caused, dtype=np.int64)).tolist()


def stepped_place(viewed: ViewedComparison, pair: PairResult) -> tuple[int, int]:
    """(which, of how many): `pair`'s place among the pairs F8 steps through, counted from 1."""
    return bisect_left(viewed.stepped, viewed.position_of.get(id(pair), -1)) + 1, len(viewed.stepped)


def find_pair(viewed: ViewedComparison | None, key: OpKey) -> PairResult | None:
    """The pair with this key (from the verdict, the timeline, a bookmark or a saved selection).

    A key of the other pairing mode finds the same op: by position a key carries the positions it
    holds, by calls none, and a bookmark made in one mode was "not in this comparison" in the
    other. Of several pairs cut from one call, none is guessed."""
    if viewed is None:
        return None
    pair = viewed.pair_of.get(key)
    if pair is not None:
        return pair
    if key.positions:
        return viewed.pair_of.get(key.whole_call())
    cut = [found for other, found in viewed.pair_of.items() if other.positions and other.whole_call() == key][:2]
    return cut[0] if len(cut) == 1 else None


def pair_op_label(pair: PairResult) -> str:
    """The op under its layer row; with the positions it holds when the runs were cut differently."""
    occurrence = f" #{pair.key.occurrence}" if pair.key.occurrence else ""
    positions = ""
    if pair.key.positions:
        first, stop = pair.key.positions
        positions = f" @ {first}" if stop - first == 1 else f" @ {first}–{stop - 1}"
    return f"{pair.key.op}{occurrence}{positions}"


def pair_ulp_error_text(pair: PairResult) -> str:
    """The p99 standard ULP error, the tree's ranking column (max and step count are in the tooltip)."""
    m = pair.metrics
    if m.bit_exact:
        return "0"
    if m.p99_ulp_error is None:
        return "NaN" if m.nan_mismatch or m.nan_payload else "bytes" if m.max_ulp is None else "—"
    return ulp_error_figure(m.p99_ulp_error)


def pair_max_ulp_text(pair: PairResult) -> str:
    m = pair.metrics
    if m.bit_exact:
        return "0"
    if m.signed_zero_only == m.differing:
        return "±0 only"  # a swap is 1 ULP by bits and no error: "1" read as a real 1-ULP error
    if m.max_ulp is None:
        return "NaN" if m.nan_mismatch or m.nan_payload else "—"
    return f"{m.max_ulp:,}"


def pair_differing_text(pair: PairResult) -> str:
    m = pair.metrics
    return "0" if m.bit_exact else f"{m.differing:,} ({share_text(m.differing, m.size)})"


def share_text(part: int, whole: int) -> str:
    """A share in two significant digits that never rounds to 0% or 100% unless it is."""
    if part == whole:
        return "100%"
    percent = 100 * part / whole
    if percent >= 99:
        return ">99%"
    if percent >= 10:
        return f"{percent:.0f}%"
    if percent < 0.01:
        return "<0.01%"
    return f"{percent:.2g}%"


def pair_tooltip(pair: PairResult, viewed: ViewedComparison | None = None) -> str:
    m = pair.metrics
    lines = [
        f"{pair.key}: {pair.verdict}",
        f"native {pair.native_name!r} (seq {pair.native_seq}), oracle {pair.oracle_name!r} (seq {pair.oracle_seq})",
        f"{m.dtype} {m.shape}: {m.differing:,} of {m.size:,} {m.unit} differ",
    ]
    if not m.bit_exact:
        lines.append(f"ULP error p99 {pair_ulp_error_text(pair)}, max {m.max_ulp_error or 0:.3g} ({pair_max_ulp_text(pair)} representable steps), NMSE {m.nmse:.3g}, signed-zero-only {m.signed_zero_only}, NaN {m.nan_mismatch + m.nan_payload}")
    if pair.post_eos:
        lines.append("after the shared EOS: not compared for parity")
    if viewed is not None:
        lines += [f.text() for f in viewed.findings.get(pair.key, [])]
        lines += [f"dispatch differs in {', '.join(d.fields)}" for d in viewed.dispatch_of.get(pair.key, [])]
    return "\n".join(lines)


def unaligned(viewed: ViewedComparison) -> list[UnalignedRecord]:
    return viewed.comparison.unaligned


def unaligned_label(record: UnalignedRecord) -> str:
    """A row per record, or per stretch of positions a record paired by position lacks a partner for."""
    layer = f" layer {record.layer}" if record.layer >= 0 else ""
    positions = ""
    if record.key is not None and record.key.positions:
        first, stop = record.key.positions
        positions = f", position {first}" if stop - first == 1 else f", positions {first}–{stop - 1}"
    op = f" as {record.key.op}" if record.key is not None and record.key.op != record.name else ""  # llama.cpp's Qcur-0 is q_proj, and q_rope
    return f"{record.side}: {record.name}{op} (step {record.step} {record.segment}{layer}{positions})"


def unaligned_explanation(record: UnalignedRecord) -> str:
    """What Tensor diff says with a record without a partner selected: it has nothing to compare."""
    return f"{unaligned_label(record)} has no partner, so nothing to compare: {record.why()}"


# -- headline, banners ------------------------------------------------------------------------


def summary_line(c: Comparison) -> str:
    aligned = "" if c.alignment.is_plain else f"; aligned {c.alignment.short()}"
    step = c.tokens.first_divergence_step
    tokens = "" if step is None else f"; tokens differ from step {step}"
    # As report's text counts them: records after the shared EOS are no findings, but they are there.
    post_eos = f"; {len(c.post_eos_unaligned)} post-EOS without a partner (invalid, not failures)" if c.post_eos_unaligned else ""
    return f"{counts_line(c)}{post_eos}{tokens}; profiles {c.native_profile} / {c.oracle_profile}{aligned}"


def headline(viewed: ViewedComparison) -> str:
    return viewed.comparison.verdict.headline


def tolerance_label(viewed: ViewedComparison | None) -> str:
    """The tolerance a comparison was judged with, short enough for the status bar."""
    if viewed is None:
        return "tolerance…"
    c = viewed.comparison
    tol = c.tolerance
    bounds = [f"{name} {value:g}" for name, value in (("atol", tol.atol), ("rtol", tol.rtol), ("max ULP", tol.max_ulp)) if value is not None]
    shown = ", ".join(bounds) or "bit-exact"
    # The policy's rules first, as `report` says: "bit-exact + policy.toml" read as bit-exact.
    return f"tolerance: {Path(c.tolerance_policy).name}, else {shown}" if c.tolerance_policy else f"tolerance: {shown}"


def tolerance_tooltip(viewed: ViewedComparison | None) -> str:
    """The tolerance in the words of `report`'s tolerance line, and how to change it."""
    judged = "" if viewed is None else f"Judged with: {tolerance_text(viewed.comparison)}.\n"
    return f"{judged}Change the tolerance or the per-op policy file and compare again (Ctrl+T)."


def banner_messages(viewed: ViewedComparison) -> list[tuple[str, str]]:
    """Provenance warnings: what makes the whole comparison suspect. The verdict itself is the
    verdict strip's, and contract findings have their own card."""
    return [("error" if "MISMATCH" in w else "warning", w) for w in viewed.comparison.provenance.warnings]


def contract_card(viewed: ViewedComparison) -> tuple[str, str] | None:
    """The contract findings as a card (rich text): a headline short enough for one line at 1280
    px (which op, what each side ran; the verdict strip above names the mismatch) and the details
    (kernel, declared and effective contract per side, and why that matters) -- settled from
    index metadata before any tensor byte was read."""
    findings = viewed.comparison.contracts.findings
    if not findings:
        return None
    first = findings[0]
    ran = {side: escape(ids.effective_contract_id or ids.kernel_id or "not recorded") for side, ids in (("native", first.native), ("oracle", first.oracle))}
    headline = f"<b>At <code>{escape(str(first.key))}</code></b> native ran <code>{ran['native']}</code>, oracle <code>{ran['oracle']}</code>"
    rows = "".join(
        f"<tr><td><b>{side}</b>&nbsp;&nbsp;</td><td>kernel <code>{escape(ids.kernel_id or 'not recorded')}</code>, "
        f"declared <code>{escape(ids.contract_id or 'not recorded')}</code>, effective <code>{escape(ids.effective_contract_id or 'not recorded')}</code></td></tr>"
        for side, ids in (("native", first.native), ("oracle", first.oracle))
    )
    ops = len({f.key for f in findings})
    # F8 steps through every op that is not bit-exact; under a filter, through the ops it shows.
    more = f" {ops - 1} more op(s) have contract findings (filter the tree by “contract-mismatch”, then F8 steps through them)." if ops > 1 else ""
    details = (
        f"{escape(KIND_WORDS[first.kind].capitalize())}, found from the index before any tensor data was read:<table>{rows}</table>"
        f"Why it matters: the two runs executed different arithmetic here, so their bits are not expected to agree, "
        f"and every later difference may be inherited from this op.{more}"
    )
    return headline, details


def provenance_mismatches(viewed: ViewedComparison | None) -> set[str]:
    """Fields that differ and should not: the ones that make the runs incomparable or suspect."""
    if viewed is None:
        return set()
    return {f.field for f in viewed.comparison.provenance.fields if not f.same and f.field not in EXPECTED_TO_DIFFER}


def provenance_expected(viewed: ViewedComparison | None) -> set[str]:
    """Fields that differ by design between a port and its oracle (engine, version, compiler, device)."""
    if viewed is None:
        return set()
    return {f.field for f in viewed.comparison.provenance.fields if not f.same and f.field in EXPECTED_TO_DIFFER}


# -- error growth -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthSeries:
    """The error growth in execution order, as the Overview draws it: one entry per compared op."""

    pairs: list[PairResult]
    ulp_log: np.ndarray
    """log2(1 + max ULP) of each op: the upper plot's height."""
    nmse_log: np.ndarray
    """log10 of each op's NMSE, bit-exact ops on NMSE_FLOOR: the lower plot's height."""
    points: dict[str, tuple[np.ndarray, np.ndarray]]
    """Per verdict kind, the ops drawn as points of that colour in the upper and lower plots
    (`worst_per_bin`), as positions in the series."""
    position: dict[int, int]
    """An op's place in the series, by id(pair)."""
    parts: list[tuple[int, str]]
    """Where each segment of the prompt and the decode steps start in the series, and their
    names (`_parts`); empty when there are too many to mark."""


PARTS_SHOWN = 12
"""A run cut into more parts than this marks none: dozens of lines and names hid the points."""
DECODE_PART = "decode steps"


def _parts(pairs: list[PairResult]) -> list[tuple[int, str]]:
    """The Overview marks where the prompt's segments and the decode steps start, so a cluster of
    red reads as "the visual prefill" without a click on it. Step 0 is the prompt, its calls
    named by segment; every later step is one decode call."""
    names = [pair.key.segment if pair.key.step == 0 else DECODE_PART for pair in pairs]
    starts = [i for i in range(len(names)) if i == 0 or names[i] != names[i - 1]]
    if len(starts) > PARTS_SHOWN:
        return []
    return [(i, names[i]) for i in starts]


NMSE_FLOOR = 1e-30
"""NMSE of a bit-exact op is 0; it is drawn on this floor so a log axis can show it."""
POINT_BINS = 2000
"""Up to this many ops each is a point; a longer run is cut into this many equal stretches and
each verdict colour shows its worst op of each stretch (the lines still pass through every op).
pyqtgraph styles scatter points one by one in Python: a real model's 240,000 took seconds."""


def growth_series(viewed: ViewedComparison) -> GrowthSeries:
    return viewed.growth


def _growth_series(comparison: Comparison) -> GrowthSeries:
    """The error growth drawn from its pairs (`Comparison.compared_pairs`), not from growth points
    made and looked up again (a third of a real model's 1.2 s here)."""
    pairs = comparison.compared_pairs
    ulp_log = np.log2(1.0 + np.fromiter((float(pair.metrics.max_ulp or 0) for pair in pairs), dtype=np.float64, count=len(pairs)))
    nmse = np.fromiter((float(pair.metrics.nmse) for pair in pairs), dtype=np.float64, count=len(pairs))
    nmse_log = np.log10(np.maximum(nmse, NMSE_FLOOR))
    by_kind: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        by_kind.setdefault(pair.verdict, []).append(i)
    drawn = {}
    for kind, positions in by_kind.items():
        ops = np.asarray(positions, dtype=np.int64)
        drawn[kind] = worst_per_bin(ops, ulp_log[ops], len(pairs), POINT_BINS), worst_per_bin(ops, nmse_log[ops], len(pairs), POINT_BINS)
    return GrowthSeries(pairs, ulp_log, nmse_log, drawn, {id(pair): i for i, pair in enumerate(pairs)}, _parts(pairs))


# -- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRow:
    step: int
    native_token: str
    oracle_token: str
    verdict: str
    delta_logit: str
    kl: str
    top_overlap: str
    native_topk: str
    """The step's top-k as "token id: logit", most likely first."""
    oracle_topk: str
    native_top_ids: str
    """The same tokens' ids alone: what a narrow column shows whole enough to compare the rankings."""
    oracle_top_ids: str


def _top(entries: list[TopEntry]) -> str:
    return ",  ".join(f"{e.token_id}: {e.decimal}" for e in entries) or "—"


def _top_ids(entries: list[TopEntry]) -> str:
    return " ".join(str(e.token_id) for e in entries) or "—"


def _verdict(step: TokenStep, eos: int | None) -> str:
    word = step_word(step)
    return "EOS" if step.step == eos and word == "match" else word


def _row(step: TokenStep, eos: int | None) -> TokenRow:
    logits = step.logits
    tokens = (step.step, token_words(step.native_token, step.native_stop), token_words(step.oracle_token, step.oracle_stop), _verdict(step, eos))
    if logits is None:
        missing = "not compared" if step.status == POST_EOS else "not captured"
        return TokenRow(*tokens, "—", "—", "—", missing, missing, missing, missing)
    figures = ("0", "0", "100%") if logits.identical else (f"{logits.delta_logit:+.3g}", logits.kl_text(short=True), f"{logits.top_overlap:.0%}")
    tops = (_top(logits.native_top), _top(logits.oracle_top), _top_ids(logits.native_top), _top_ids(logits.oracle_top))
    return TokenRow(*tokens, *figures, *tops)


def token_rows(viewed: ViewedComparison) -> list[TokenRow]:
    parity = viewed.comparison.tokens
    return [_row(s, parity.shared_eos_step) for s in parity.steps]


def token_summary(viewed: ViewedComparison) -> str:
    parity = viewed.comparison.tokens
    eos = f"shared EOS at step {parity.shared_eos_step}; later steps are post-EOS (not compared)" if parity.shared_eos_step is not None else "no shared EOS"
    return f"{parity.compared_steps} step(s) compared, {parity.outcome()}; {eos}."


# -- tensors ----------------------------------------------------------------------------------


def tensor_request(viewed: ViewedComparison | None, native: Capture, oracle: Capture, pair: PairResult, spec: SliceSpec | None) -> TensorRequest | str:
    """What to load for a pair, or a sentence saying why it has no element view."""
    if viewed is None:
        return "Comparing…"
    dtype = pair.metrics.dtype
    if pair.metrics.size == 0:
        return f"{pair.key}: {dtype} {pair.metrics.shape} holds no elements, so there is nothing to show"
    try:
        native_side, oracle_side = pair_sides(native, oracle, pair)
    except CaptureError as exc:
        return f"{pair.key}: {exc.problem}"
    return TensorRequest(
        label=pair.key.text(),
        dtype=dtype,
        native=native,
        oracle=oracle,
        native_side=native_side,
        oracle_side=oracle_side,
        spec=spec,
        metrics=pair.metrics,
    )


# -- raw attributes ---------------------------------------------------------------------------


def row_title(row: PairResult | UnalignedRecord) -> str:
    """A tree row's name in the attributes window's title."""
    return row.key.text() if isinstance(row, PairResult) else unaligned_label(row)


def iter_row_attributes(native: Capture, oracle: Capture, row: PairResult | UnalignedRecord) -> ProgressGenerator[list[RecordAttributes]]:
    """A tree row's records, both sides of a pair or the one unaligned record, with their HDF5
    attributes; CaptureError when a capture no longer holds what was compared."""
    if isinstance(row, PairResult):
        native_side, oracle_side = pair_sides(native, oracle, row)
        sides = [("native", native, native_side.record), ("oracle", oracle, oracle_side.record)]
    else:
        capture = native if row.side == "native" else oracle
        record = capture.record(row.seq)
        if record is None or record.name != row.name:
            raise CaptureError(capture.path, f"record seq {row.seq}", f"is not {row.name!r} any more -- the capture changed since it was compared")
        sides = [(row.side, capture, record)]
    return (yield from iter_records_attributes(sides))
