"""One gate case judged where its captures are: reuse an unchanged result, else compare in a child.

This runs on whichever machine holds the captures (a Dask worker; sessions.gate.cluster), and
returns only small things: the case's result, the fingerprint that lets the next gate reuse
it, and, when asked, the case's HTML report. Tensors never leave this machine.

The comparison itself runs in a child process (sessions.compare.in_child): a capture that
crashes libhdf5 ends that child, not the worker, so the case becomes UNUSABLE with the reason
and the worker goes on with the next case. Structure checks also run in children, as every
open does (sessions.capture.reader).

Incremental gates: a previous result is reused when both captures' stat fields (device,
inode, size, mtime, ctime) are unchanged -- ctime too, because a writer can restore an old
mtime but only the kernel sets ctime -- and the profiles the comparison used still hash the
same. A capture whose stat fields moved (a copy, a touch, an edit) is judged again: nothing
short of reading every tensor byte tells a touch from a tensor edited in place, which keeps
the file's size, root attributes and index (a stale PARITY is the one answer a gate must never
give). The options are part of the cache key (sessions.gate.cache), not of the fingerprint.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from sessions.capture.reader import CaptureError
from sessions.compare.comparison import Comparison, worst_ops
from sessions.compare.in_child import iter_compare_in_child
from sessions.compare.layout_transform import LayoutError
from sessions.compare.profile_identity import ProfileIdentity, identify
from sessions.compare.profiles import ProfileError, builtin_profiles, load_profile_file
from sessions.compare.provenance_diff import SAME_FILE_WARNING
from sessions.gate.manifest import EOS_REQUIRE, GateCase
from sessions.gate.result import (
    NO_SHARED_EOS,
    SAME_FILE,
    SHORT_OF_BUDGET,
    CaseFinding,
    CaseResult,
    CaseTokens,
    WorstOp,
    unusable,
)
from sessions.progress import Progress, ProgressGenerator
from sessions.report.html_page import render_html


@dataclass(frozen=True)
class FileStamp:
    """A file as the file system sees it now; any difference means it may have changed."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @staticmethod
    def of(path: str) -> FileStamp:
        st = os.stat(path)
        return FileStamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class CaseFingerprint:
    """What a judged case's result depends on besides its options (which key the cache)."""

    native_stamp: FileStamp
    oracle_stamp: FileStamp
    native_profile: ProfileIdentity
    oracle_profile: ProfileIdentity


@dataclass
class CachedCase:
    """A previous judgment of the same case with the same options: what a worker may reuse."""

    result: CaseResult
    fingerprint: CaseFingerprint


@dataclass
class CaseOutcome:
    result: CaseResult
    fingerprint: CaseFingerprint | None
    """None when the case could not be judged: nothing to reuse next time."""
    html: str | None = None
    """The case's own HTML report (sessions.report.html_page), when the gate asked for one."""


def case_unusable(case: GateCase, reason: str) -> CaseResult:
    return unusable(case.name, case.native, case.oracle, case.eos, case.options.tolerance, reason)


def result_of(case: GateCase, comparison: Comparison, seconds: float) -> CaseResult:
    """The case's result from its comparison: the verdict as the comparison gives it, plus the gate's rules."""
    verdict, tokens, budget = comparison.verdict, comparison.tokens, case.token_budget
    eos = tokens.shared_eos_step
    rules = []
    warnings = [w for w in comparison.provenance.warnings if w != SAME_FILE_WARNING]  # said once, by the rule
    if SAME_FILE_WARNING in comparison.provenance.warnings:
        rules.append(f"{SAME_FILE}: the native and the oracle are one file, so every op is bit-exact whatever it holds")
    if case.eos == EOS_REQUIRE and eos is None:
        rules.append(f'{NO_SHARED_EOS} within the {tokens.compared_steps} token steps compared (eos = "require")')
    if budget is not None and eos is None and tokens.compared_steps < budget:
        rules.append(f"{SHORT_OF_BUDGET}: {tokens.compared_steps} of {budget} token steps captured and no shared EOS")
    worst = worst_ops(comparison, 1)
    return CaseResult(
        name=case.name,
        native=case.native,
        oracle=case.oracle,
        word=verdict.word,
        first=None if verdict.first is None else CaseFinding(str(verdict.first.kind), verdict.first.key.text(), verdict.first.detail),
        reasons=list(verdict.reasons),
        rule_failures=rules,
        tokens=CaseTokens(tokens.compared_steps, budget, eos is not None, eos, tokens.first_divergence_step),
        worst_op=None if not worst else WorstOp(worst[0].key.text(), str(worst[0].verdict), worst[0].metrics.max_ulp, worst[0].metrics.nmse, worst[0].metrics.differing),
        eos_rule=case.eos,
        tolerance=comparison.tolerance,
        native_profile=comparison.native_profile,
        oracle_profile=comparison.oracle_profile,
        tolerance_policy=comparison.tolerance_policy,
        alignment=comparison.alignment.mode,
        native_profile_file=_profile_file(case.options.native_profile),
        oracle_profile_file=_profile_file(case.options.oracle_profile),
        warnings=warnings,
        seconds=seconds,
    )


def _profile_file(given: str | None) -> str:
    """The profile file a case's option names, absolute; "" for a built-in or detected profile."""
    return os.path.abspath(given) if given is not None and given not in builtin_profiles() else ""


def _profile_unchanged(identity: ProfileIdentity) -> bool:
    try:
        return identify(load_profile_file(identity.path)).sha256 == identity.sha256
    except ProfileError:
        return False


def _reused(case: GateCase, previous: CachedCase, fingerprint: CaseFingerprint) -> CaseOutcome:
    result = replace(previous.result, name=case.name, native=case.native, oracle=case.oracle, worker=None, reused=True, report=None)
    return CaseOutcome(result, fingerprint)


def iter_judge_case(case: GateCase, previous: CachedCase | None = None, want_html: bool = False) -> ProgressGenerator[CaseOutcome]:
    """Judge one case; yields Progress, returns its outcome. Closing the generator kills any child it runs.

    `previous` is the cached judgment of this case under the same options, if any; it is
    reused when the fingerprint says nothing it depends on has changed. Every failure to read
    a capture or a profile becomes an UNUSABLE result with its reason, never an exception.
    """
    started = time.monotonic()
    try:
        stamps = FileStamp.of(case.native), FileStamp.of(case.oracle)
    except FileNotFoundError as exc:  # in report's words for the same file
        return CaseOutcome(case_unusable(case, str(CaptureError(exc.filename, "file", "does not exist"))), None)
    except OSError as exc:
        return CaseOutcome(case_unusable(case, f"{exc.filename}: {exc.strerror}"), None)
    profiles_unchanged = previous is not None and all(
        _profile_unchanged(p) for p in (previous.fingerprint.native_profile, previous.fingerprint.oracle_profile)
    )
    if previous is not None and profiles_unchanged and (previous.fingerprint.native_stamp, previous.fingerprint.oracle_stamp) == stamps:
        return _reused(case, previous, previous.fingerprint)
    yield Progress(0, 1, f"{case.name}: checking the captures")
    try:
        comparison = yield from iter_compare_in_child(Path(case.native), Path(case.oracle), case.options, complete_only=True)
    except (CaptureError, ProfileError, LayoutError) as exc:
        return CaseOutcome(case_unusable(case, str(exc)), None)
    result = result_of(case, comparison, time.monotonic() - started)
    fingerprint = CaseFingerprint(stamps[0], stamps[1], comparison.native_profile_identity, comparison.oracle_profile_identity)
    return CaseOutcome(result, fingerprint, render_html(comparison, judged=(result.judgment(named=False), result.passed)) if want_html else None)
