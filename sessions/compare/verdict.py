"""The one verdict model: what each aligned op is, what the whole comparison is, and where it first parts.

Every surface -- CLI text, JSON, the tree's icons, Ctrl+J and F8, the Overview, the window's
verdict strip, the HTML report, a gate's table -- reads these values and never re-derives them,
so no two surfaces can disagree about the same pair. The rules, in order of precedence:

- A pair after the shared EOS step is `post-eos`: invalid, never a failure.
- A pair whose kernel or effective contract differs (sessions.compare.contracts) is
  `contract-mismatch`: its tensors were not expected to agree, whatever their bits.
- A pair whose bits differ beyond the tolerance is `signed-zero-only` when every differing
  element is a +0/-0 swap, else `diverged`.
- A pair whose bits pass (bit-exact, or within a tolerance that is set) but whose attention
  calls were dispatched differently is `dispatch-only`: the bits pass here, and another device
  may pick another kernel. A tolerance is a bound on bits, so it never hides how the work was
  split, as it never hides a contract: a pair would otherwise pass with bits that differ and
  fail with bits that agree.
- Otherwise `within-tolerance` when its bits differ within a tolerance, else `bit-exact`.

The comparison's word is the most serious kind present: CONTRACT MISMATCH, then DIVERGENCE
(bits, tokens or records that could not be aligned), SIGNED-ZERO-ONLY, DISPATCH-ONLY, else
PARITY. The first finding is the earliest failing pair in the native run's execution order;
failing tokens and unaligned records are findings only when no pair fails.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from sessions.compare.key import OpKey


class Kind(StrEnum):
    BIT_EXACT = "bit-exact"
    WITHIN_TOLERANCE = "within-tolerance"
    DIVERGED = "diverged"
    SIGNED_ZERO_ONLY = "signed-zero-only"
    CONTRACT_MISMATCH = "contract-mismatch"
    DISPATCH_ONLY = "dispatch-only"
    POST_EOS = "post-eos"
    UNALIGNED = "unaligned"
    TOKENS = "tokens"
    """Greedy tokens differ at a step; only ever a finding (and the tree's mark on that step), never a pair's kind."""


MEANING: dict[Kind, str] = {
    Kind.BIT_EXACT: "every stored bit of the pair is equal (signed zeros and NaN payloads included)",
    Kind.WITHIN_TOLERANCE: "bits differ, but every element is within the tolerance given for this op",
    Kind.DIVERGED: "bits differ beyond any tolerance",
    Kind.SIGNED_ZERO_ONLY: "the only differences are -0.0 against +0.0",
    Kind.CONTRACT_MISMATCH: "the two sides ran different kernels or arithmetic contracts here: their bits are not expected to agree",
    Kind.DISPATCH_ONLY: "bits are equal here (or within the tolerance given), but the attention work was split into different primitive calls (another device may pick another kernel)",
    Kind.POST_EOS: "after both runs emitted the shared stop token: invalid, never a failure",
    Kind.UNALIGNED: "a record the other run has no partner for",
    Kind.TOKENS: "the greedy tokens, or which of them is a stop, differ at this step (the tree marks the step; its logits may still be bit-exact)",
}
"""One sentence per kind, for legends, tooltips and help."""

FAILING = frozenset({Kind.DIVERGED, Kind.SIGNED_ZERO_ONLY, Kind.CONTRACT_MISMATCH, Kind.DISPATCH_ONLY, Kind.UNALIGNED, Kind.TOKENS})
"""Kinds that make a comparison fail (exit 1)."""
NOT_EXACT = FAILING | {Kind.WITHIN_TOLERANCE}
"""Kinds F8 steps through: everything a user should look at, passing or not."""

SEVERITY: dict[Kind, int] = {
    Kind.POST_EOS: 0,
    Kind.BIT_EXACT: 0,
    Kind.WITHIN_TOLERANCE: 1,
    Kind.DISPATCH_ONLY: 2,
    Kind.SIGNED_ZERO_ONLY: 3,
    Kind.UNALIGNED: 4,
    Kind.TOKENS: 5,
    Kind.DIVERGED: 5,
    Kind.CONTRACT_MISMATCH: 6,
}
"""How serious a kind is: a group of ops (a layer, a step) shows its most serious member's kind."""

PARITY = "PARITY"
DIVERGENCE = "DIVERGENCE"
CONTRACT_MISMATCH = "CONTRACT MISMATCH"
SIGNED_ZERO_ONLY = "SIGNED-ZERO-ONLY"
DISPATCH_ONLY = "DISPATCH-ONLY"
UNUSABLE = "UNUSABLE"
"""Not a comparison's word: what every surface says when an input cannot be read (exit 2)."""

WORD_BY_KIND: tuple[tuple[frozenset[Kind], str], ...] = (
    (frozenset({Kind.CONTRACT_MISMATCH}), CONTRACT_MISMATCH),
    (frozenset({Kind.DIVERGED, Kind.TOKENS, Kind.UNALIGNED}), DIVERGENCE),
    (frozenset({Kind.SIGNED_ZERO_ONLY}), SIGNED_ZERO_ONLY),
    (frozenset({Kind.DISPATCH_ONLY}), DISPATCH_ONLY),
)

EXIT_PARITY, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2


def word_of(kind: str) -> str:
    """The comparison word a finding of `kind` makes on its own (PARITY for a passing kind)."""
    return next((word for kinds, word in WORD_BY_KIND if kind in kinds), PARITY)


@dataclass(frozen=True)
class Finding:
    """One place where the runs part, named by its key and kind."""

    kind: Kind
    key: OpKey
    detail: str
    """One line that says what differs there, for a person."""


@dataclass
class Verdict:
    word: str
    first: Finding | None
    """The first failing place; None exactly when the word is PARITY."""
    reasons: list[str] = field(default_factory=list)
    """Why the comparison fails, one short line each; empty at parity."""
    counts: dict[str, int] = field(default_factory=dict)
    """Aligned pairs per kind, plus unaligned records."""
    tokens_compared: bool = True
    """Whether any token step was compared: captures without token tables agree on none."""
    shared_eos: int | None = None
    """The step both runs stopped at, when they did: what the ops and tokens were compared up to."""
    reason_kinds: list[str] = field(default_factory=list)
    """The kind each of `reasons` is about, in the same order."""

    def reasons_besides_first(self) -> list[str]:
        """What else fails, beside the first finding's kind: a strip naming the first finding
        listed the reasons after the first, which dropped another kind's when the first finding
        was not of the most serious kind (a divergence before a contract mismatch)."""
        first = None if self.first is None else str(self.first.kind)
        return [reason for reason, kind in zip(self.reasons, self.reason_kinds) if kind != first]

    def first_of(self) -> int:
        """How many findings there are of the first finding's kind (1 for tokens: one first step)."""
        if self.first is None:
            return 0
        return 1 if self.first.kind == Kind.TOKENS else max(1, self.counts.get(str(self.first.kind), 1))

    @property
    def passed(self) -> bool:
        return self.word == PARITY

    @property
    def exit_code(self) -> int:
        return EXIT_PARITY if self.passed else EXIT_FAILED

    @property
    def headline(self) -> str:
        """The sentence every surface leads with: the word, and where to look first."""
        if self.first is None:
            tokens = "the tokens agree" if self.tokens_compared else "no token step was recorded by both runs to compare"
            ops = "every aligned op" if self.shared_eos is None else f"every aligned op up to the shared EOS (step {self.shared_eos})"
            return f"{self.word}: {ops} is bit-exact or within tolerance, and {tokens}"
        return f"{self.word}: first {self.first.kind} at {self.first.key} ({self.first.detail})"


def classify_pair(
    *, post_eos: bool, contract_mismatch: bool, bit_exact: bool, within_tolerance: bool, signed_zero_only: bool, dispatch_differs: bool, tolerance_set: bool
) -> Kind:
    if post_eos:
        return Kind.POST_EOS
    if contract_mismatch:
        return Kind.CONTRACT_MISMATCH
    if not bit_exact and not (tolerance_set and within_tolerance):
        return Kind.SIGNED_ZERO_ONLY if signed_zero_only else Kind.DIVERGED
    if dispatch_differs:
        return Kind.DISPATCH_ONLY
    return Kind.BIT_EXACT if bit_exact else Kind.WITHIN_TOLERANCE


def judge(
    pair_findings: list[Finding],
    token_finding: Finding | None,
    unaligned_findings: list[Finding],
    pair_kinds: list[Kind],
    tokens_compared: bool = True,
    shared_eos: int | None = None,
) -> Verdict:
    """The comparison's verdict from its classified parts.

    `pair_findings` are the failing pairs in execution order, `pair_kinds` every pair's kind
    (for the counts), `unaligned_findings` the unaligned records before the shared EOS,
    `tokens_compared` whether any token step was compared, `shared_eos` the step both runs
    stopped at (None: a PARITY headline does not speak of one)."""
    present = {f.kind for f in pair_findings} | {f.kind for f in unaligned_findings}
    if token_finding is not None:
        present.add(Kind.TOKENS)
    word = next((w for kinds, w in WORD_BY_KIND if kinds & present), PARITY)
    ordered = [*pair_findings, *([token_finding] if token_finding else []), *unaligned_findings]
    counts = Counter(str(k) for k in pair_kinds)
    if unaligned_findings:
        counts[str(Kind.UNALIGNED)] = len(unaligned_findings)
    reasons = _reasons(pair_findings, token_finding, unaligned_findings)
    first = ordered[0] if ordered else None
    return Verdict(word, first, [text for _, text in reasons], dict(counts), tokens_compared, shared_eos, [str(kind) for kind, _ in reasons])


def _reasons(pairs: list[Finding], token: Finding | None, unaligned: list[Finding]) -> list[tuple[Kind, str]]:
    by_kind = Counter(f.kind for f in pairs)
    reasons = []
    for kind in (Kind.CONTRACT_MISMATCH, Kind.DIVERGED, Kind.SIGNED_ZERO_ONLY, Kind.DISPATCH_ONLY):
        if by_kind[kind]:
            first = next(f for f in pairs if f.kind == kind)
            reasons.append((kind, f"{by_kind[kind]} op(s) {kind}, first at {first.key}"))
    if token is not None:
        reasons.append((Kind.TOKENS, f"the token steps differ from step {token.key.step} ({token.detail})"))
    if unaligned:
        reasons.append((Kind.UNALIGNED, f"{len(unaligned)} record(s) could not be aligned, first at {unaligned[0].key}"))
    return reasons
