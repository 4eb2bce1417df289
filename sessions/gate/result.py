"""What a gate says: one result per case, one summary line, one exit code, one JSON document.

A case's word is its comparison's `verdict.word` (sessions.compare.verdict), read, never
re-derived, or UNUSABLE when the case could not be judged at all. On top of the verdict a
gate has its own rules, because a claim like "5/5 images pass 64/64 token steps" needs more
than a passing comparison: a case whose captures stop before its token budget (without a
shared EOS) has not shown 64 steps, and a case under `eos = "require"` has not shown that
both runs stop together until they do. Those rule failures are listed beside the word, which
stays what the comparison said. The gate's exit code follows `report`: 0 every case passes,
1 any case fails, 2 any case is unusable (docs/gate.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.compare.document import check_types, from_plain
from sessions.compare.json_plain import plain
from sessions.compare.tensor_diff import Tolerance
from sessions.compare.verdict import (
    CONTRACT_MISMATCH,
    DISPATCH_ONLY,
    DIVERGENCE,
    EXIT_FAILED,
    EXIT_PARITY,
    EXIT_UNUSABLE,
    PARITY,
    SIGNED_ZERO_ONLY,
    UNUSABLE,
    word_of,
)
from sessions.side_file import parse_problem, read_side_file

GATE_FORMAT = "parity-xray-gate"
GATE_VERSION = 1

FAILING_WORDS = (CONTRACT_MISMATCH, DIVERGENCE, SIGNED_ZERO_ONLY, DISPATCH_ONLY)
"""The comparison words that fail a case, most serious first (the summary's order)."""
NO_SHARED_EOS = "no shared EOS"
SHORT_OF_BUDGET = "short of the token budget"
SAME_FILE = "same file"
"""A case whose native and oracle are one file (a manifest's slip, a link): its PARITY shows nothing."""
RULES = (SAME_FILE, NO_SHARED_EOS, SHORT_OF_BUDGET)
"""The gate's own rules; every rule failure's text starts with one of these."""
KEYS_NAMED = 3
"""How many distinct first-finding keys the summary line names per word before saying how many more."""


class GateFormatError(ValueError):
    pass


@dataclass
class CaseFinding:
    """The comparison's first finding, in the key's one text form (`0:visual:0:sdpa`)."""

    kind: str
    key: str
    detail: str


@dataclass
class CaseTokens:
    compared: int
    """Token steps compared: before the shared EOS, within the budget."""
    budget: int | None
    eos_reached: bool
    eos_step: int | None
    """The shared EOS step (both runs emit the same stop token), when reached."""
    first_divergence_step: int | None

    def compared_text(self) -> str:
        """Steps compared, out of the budget when there is one ("64/64"); every surface writes it so."""
        return f"{self.compared}" if self.budget is None else f"{self.compared}/{self.budget}"

    def eos_text(self) -> str:
        return f"step {self.eos_step}" if self.eos_reached else "not reached"


@dataclass
class WorstOp:
    key: str
    kind: str
    max_ulp: int | None
    nmse: float
    differing: int


@dataclass
class CaseResult:
    name: str
    native: str
    oracle: str
    word: str
    """The comparison's verdict word, or UNUSABLE."""
    first: CaseFinding | None
    reasons: list[str]
    """The verdict's reasons; for an UNUSABLE case, why it could not be judged."""
    rule_failures: list[str]
    """The gate's own rules this case breaks (RULES), though its comparison may pass."""
    tokens: CaseTokens | None
    worst_op: WorstOp | None
    eos_rule: str
    tolerance: Tolerance
    native_profile: str | None
    oracle_profile: str | None
    tolerance_policy: str = ""
    """The policy file whose rules judged the case's ops ("" when none), as `report` names it."""
    alignment: str = ""
    """How the comparison paired the records: `calls` or `positions` (`--align auto` chooses; ""
    when the case could not be judged). A case's verdict means little without it: runs cut
    differently are compared position by position, and their dispatch is then not compared."""
    native_profile_file: str = ""
    """The profile file the case named (absolute), "" for a built-in or detected profile: the
    window compares the case with it (it read a case judged under its own profile with the
    built-in one, and said DIVERGENCE of a case the gate passed)."""
    oracle_profile_file: str = ""
    warnings: list[str] = field(default_factory=list)
    """What `report` warns of above its verdict (sessions.compare.provenance_diff): different
    weights or requests, captures that look swapped. A gate printed none of them."""
    seconds: float = 0.0
    """Wall time of the judgment on its worker (a reused result keeps the time it took then)."""
    worker: str | None = None
    reused: bool = False
    """Taken from the gate cache: neither capture nor the options changed since it was judged."""
    report: str | None = None
    """The case's own HTML report, relative to the gate's HTML summary."""

    @property
    def passed(self) -> bool:
        return self.word == PARITY and not self.rule_failures

    def judgment(self, named: bool = True) -> str:
        """The gate's word on the case, for a surface showing its comparison alone (the case's own
        HTML report, a window opened on it): a comparison's PARITY read as the case's, which a
        rule (no shared EOS, short of the budget) had failed. Not `named` in the case's HTML
        report, which the gate's cache keeps for any case of the same pair and options."""
        rules = f" ({'; '.join(self.rule_failures)})" if self.rule_failures else ""
        budget = self.tokens.budget if self.tokens is not None else None
        steps = f"; judged over the first {budget} token steps" if budget is not None else ""
        return f"Gate{f' case {self.name}' if named else ''}: {self.word}, {'pass' if self.passed else 'FAIL'}{rules}{steps}"

    def notes(self) -> list[str]:
        """Why the case fails the gate's rules or could not be judged, then what `report` would
        warn of: every surface's notes (the table, the progress line, the HTML, the window)."""
        return self.rule_failures + (self.reasons if self.word == UNUSABLE else []) + [f"WARNING: {w}" for w in self.warnings]

    @property
    def exit_code(self) -> int:
        if self.word == UNUSABLE:
            return EXIT_UNUSABLE
        return EXIT_PARITY if self.passed else EXIT_FAILED


@dataclass
class GateResult:
    manifest: str
    cluster: str
    """Where the cases were judged: a LocalCluster of N workers, or the scheduler's address."""
    dashboard: str | None
    created: str
    """ISO 8601 time the gate finished."""
    seconds: float
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def exit_code(self) -> int:
        return max((c.exit_code for c in self.cases), default=EXIT_UNUSABLE)

    @property
    def headline(self) -> str:
        """The summary line: "38/40 pass; 1 divergence at 0:visual:17:sdpa; 1 unusable"."""
        return summary_line(self.cases)


def _keys(keys: list[str]) -> str:
    """Distinct keys in order, `×n` where n cases share one: forty cases failing at one op is one place."""
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    named = [key if n == 1 else f"{key} ×{n}" for key, n in counts.items()]
    shown = ", ".join(named[:KEYS_NAMED])
    return shown if len(named) <= KEYS_NAMED else f"{shown} and {len(named) - KEYS_NAMED} more"


def _place(first: CaseFinding, word: str) -> str:
    """The first finding's key, with its kind when that is not what makes the word: a case is a
    DIVERGENCE for its tokens while its first finding is a dispatch-only op before them, and "2
    divergence at" named two keys where nothing diverged."""
    return first.key if word_of(first.kind) == word else f"{first.key} ({first.kind})"


def summary_line(cases: list[CaseResult]) -> str:
    parts = [f"{sum(c.passed for c in cases)}/{len(cases)} pass"]
    for word in FAILING_WORDS:
        group = [c for c in cases if c.word == word]
        if group:
            parts.append(f"{len(group)} {word.lower()} at {_keys([_place(c.first, word) for c in group if c.first is not None])}")
    for rule in RULES:
        broke = [c.name for c in cases if any(f.startswith(rule) for f in c.rule_failures)]
        if broke:
            parts.append(f"{len(broke)} {rule} ({_keys(broke)})")
    unusable = sum(c.word == UNUSABLE for c in cases)
    if unusable:
        parts.append(f"{unusable} unusable")
    return "; ".join(parts)


def unusable(name: str, native: str, oracle: str, eos_rule: str, tolerance: Tolerance, reason: str) -> CaseResult:
    """A case that could not be judged (unreadable capture, crashed reader, lost worker), and why."""
    return CaseResult(name, native, oracle, UNUSABLE, None, [reason], [], None, None, eos_rule, tolerance, None, None)


def gate_to_dict(gate: GateResult) -> dict[str, Any]:
    counts = {
        "cases": len(gate.cases),
        "passed": sum(c.passed for c in gate.cases),
        "failed": sum(not c.passed and c.word != UNUSABLE for c in gate.cases),
        "unusable": sum(c.word == UNUSABLE for c in gate.cases),
        "reused": sum(c.reused for c in gate.cases),
    }
    return {"format": GATE_FORMAT, "version": GATE_VERSION, **plain(gate), "counts": counts}


def dumps(gate: GateResult) -> str:
    return json.dumps(gate_to_dict(gate), indent=1, allow_nan=False)


MAX_GATE_BYTES = 256 * 1024**2
"""A gate document of a hundred thousand cases is tens of MB; a bigger file, or a device, is refused before it is read."""


def load_gate_file(path: str | Path) -> GateResult:
    """The gate document at `path`; raises GateFormatError, also when it cannot be read. It may
    be someone else's file: anything but a regular file (a FIFO hung the window) is refused."""
    try:
        text = read_side_file(path, MAX_GATE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateFormatError(f"cannot read it ({exc})") from None
    return loads(text)


def loads(text: str) -> GateResult:
    """A gate document back (the viewer opens one); raises GateFormatError for anything else."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is one; so is an integer of 4,300 digits
        raise GateFormatError(f"not JSON ({parse_problem(exc)})") from None
    if not isinstance(data, dict) or data.get("format") != GATE_FORMAT or data.get("version") != GATE_VERSION:
        raise GateFormatError(f"not a {GATE_FORMAT} version {GATE_VERSION} document")
    try:
        gate = from_plain(GateResult, data)
        check_types(gate, GateResult, "gate")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GateFormatError(f"malformed gate document ({type(exc).__name__}: {exc})") from None
    unknown = next((c.word for c in gate.cases if c.word not in (PARITY, UNUSABLE, *FAILING_WORDS)), None)
    if unknown is not None:
        raise GateFormatError(f"malformed gate document (a case's word is {unknown!r}, not one of {', '.join((PARITY, *FAILING_WORDS, UNUSABLE))})")
    return gate
