"""The readable summary of a comparison, in the order an investigation reads it.

Warnings about the inputs first (a weights mismatch invalidates everything below), then the
verdict in one line (the same words every surface uses), where the inputs came from, the first
finding with both values as bits and decimals, the worst ops, token parity, execution state and
whatever could not be aligned. The default is a summary a person reads in one screen; `full`
lists everything.
"""

from __future__ import annotations

import sys

from sessions.compare.align_modes import POSITIONS
from sessions.compare.comparison import (
    WORST_ORDER,
    Comparison,
    PairResult,
    no_dispatch_difference,
    unaligned_count,
    unaligned_key,
    worst_ops,
)
from sessions.compare.pair_results import first_with_key, post_eos_differing
from sessions.compare.profiles import whole_op
from sessions.compare.tensor_diff import ElementSample, TensorMetrics
from sessions.compare.token_parity import POST_EOS, step_word
from sessions.compare.verdict import Finding, Kind
from sessions.printable import printable


def _element(sample: ElementSample | None) -> str:
    if sample is None:
        return "none"
    ulp = "undefined (NaN)" if sample.ulp is None else str(sample.ulp)
    return (
        f"at {sample.coord}: native {sample.native_hex} ({sample.native_decimal}) vs "
        f"oracle {sample.oracle_hex} ({sample.oracle_decimal}), {ulp} ULP"
    )


def _counts(m: TensorMetrics) -> str:
    parts = [f"{m.differing}/{m.size} {m.unit} differ ({m.fraction_differing:.3%})"]
    if m.max_ulp is not None:
        parts.append(f"max {m.max_ulp} ULP steps, p99 {m.p99_ulp}{'' if m.p99_exact else ' (bucket edge)'}")
    if m.p99_ulp_error is not None:
        parts.append(f"ULP error p99 {m.p99_ulp_error:.3g}, max {m.max_ulp_error:.3g}")
    for name, value in (
        ("signed-zero-only", m.signed_zero_only),
        ("NaN mismatch", m.nan_mismatch),
        ("NaN payload", m.nan_payload),
        ("Inf mismatch", m.inf_mismatch),
        ("Inf sign", m.inf_sign),
    ):
        if value:
            parts.append(f"{value} {name}")
    return ", ".join(parts)


def _no_value_error(m: TensorMetrics) -> str:
    """Why a pair that differs has no element to show for its largest error."""
    return "(quantized blocks are compared as bytes, not values)" if m.unit == "bytes" else "(no element differs in value by a finite amount)"


def _pair_block(title: str, pair: PairResult) -> list[str]:
    m = pair.metrics
    lines = [
        f"{title}: {pair.key}",
        f"  native {pair.native_name!r} (seq {pair.native_seq}), oracle {pair.oracle_name!r} (seq {pair.oracle_seq}), {m.dtype} {m.shape}",
        f"  {_counts(m)}",
        f"  first differing element {_element(m.first_difference)}",
        *([f"  first element beyond tolerance {_element(m.beyond_elsewhere)}"] if m.beyond_elsewhere is not None else []),
        f"  worst ULP element {_element(m.worst_ulp_at)}",
        f"  max abs error {m.max_abs_error:.6g} " + (_element(m.max_abs_at) if m.max_abs_at is not None else _no_value_error(m)),
        f"  max rel error {m.max_rel_error:.6g}; RMSE {m.rmse:.6g}; NMSE {m.nmse:.6g}; cosine {m.cosine:.12g}",
    ]
    return lines


def render(c: Comparison, top: int = 10, full: bool = False) -> str:
    """The summary an engineer reads first; `full` adds every provenance field, every contract
    finding and dispatch difference, the error growth and every token step."""
    v = c.verdict
    # Engine names and hashes come from the captures: a line separator (U+2028) or a zero-width
    # space passes their check and would forge a line or hide a difference, so they are escaped.
    out = [f"WARNING: {printable(w)}" for w in c.provenance.warnings]
    out.append(v.headline)
    out += [f"  - {reason}" for reason in v.reasons]
    out += [
        "",
        f"native     {printable(c.native_path)} [profile {c.native_profile}]",
        f"oracle     {printable(c.oracle_path)} [profile {c.oracle_profile}]",
        f"provenance {printable(c.provenance.summary)}",
        f"alignment  {c.alignment.words()}",
        f"tolerance  {tolerance_text(c)}",
        f"ops        {counts_line(c)}",
    ]
    out += ["", *_first_block(c)]
    out += ["", f"Worst ops ({WORST_ORDER}; top {top})"]
    out += [
        f"  {p.key.text():40} {p.verdict:17} NMSE {p.metrics.nmse:.3e}  ULP error p99 {_ulp_error(p.metrics.p99_ulp_error)}  differing {p.metrics.differing:,}/{p.metrics.size:,}"
        for p in worst_ops(c, top)
    ] or [f"  none: {'every compared op is bit-exact' if c.pairs else 'no op was compared'}"]
    limit = sys.maxsize if full else 5  # --full lists every one: it cut them at 50, and then pointed at --full for the rest
    out += ["", _token_header(c)]
    out += _token_lines(c, full, limit)
    out += ["", f"Execution contracts ({c.contracts.checked} pairs, {c.contracts.unrecorded} without contract ids)"]
    out += [f"  {f.key}: {f.text()}" for f in c.contracts.findings[:limit]] or ["  no findings"]
    out += _more(len(c.contracts.findings), limit)
    out += ["", "Dispatch"]
    out += [
        f"  {d.key} differs in {', '.join(d.fields)}\n    native: {d.native_summary}\n    oracle: {d.oracle_summary}"
        for d in c.dispatch_differences[:limit]
    ] or [f"  {c.dispatch_not_compared or no_dispatch_difference(c)}"]
    out += _more(len(c.dispatch_differences), limit)
    if c.dispatch_not_compared and c.dispatch_differences:
        out += [f"  {c.dispatch_not_compared}"]  # compared in part (runs cut differently): said under what was found
    out += ["", f"Unaligned records ({len(c.unaligned)}, plus {len(c.post_eos_unaligned)} post-EOS: invalid, not failures)"]
    out += [f"  {unaligned_key(u)} {u.side} {u.name!r} (seq {u.seq}): {u.why()}" for u in c.unaligned[:limit]] or ["  none"]
    out += _more(len(c.unaligned), limit)
    if full:
        out += ["", "Provenance"]
        for f in c.provenance.fields:
            mark = "  " if f.same else "!="
            out.append(f"  {mark} {f.field:15} native {_short(f.native):40} oracle {_short(f.oracle)}")
        out += ["", "Error growth (execution order: max ULP, NMSE, elements differing)"]
        out += [f"  {g.key.text():40} {_ulp(g.max_ulp):>8}  {g.nmse:.3e}  {g.differing:,}" for g in c.error_growth if g.differing] or [
            "  flat: every compared pair is bit-exact"
        ]
    else:
        out += ["", "(--full lists provenance field by field, the error growth, and every finding and token step)"]
    return "\n".join(out) + "\n"


def tolerance_text(c: Comparison) -> str:
    """The tolerance every surface names. With a policy, its rules come first and the bounds hold
    where none applies: "bit-exact; per-op rules from P" was said of a policy whose [default]
    bounded every op to 1 ULP."""
    tol = c.tolerance
    given = ", ".join(f"{name}={value}" for name, value in (("atol", tol.atol), ("rtol", tol.rtol), ("max_ulp", tol.max_ulp)) if value is not None) or "bit-exact"
    if c.tolerance_policy:  # a path, or a session file's op rules
        return f"per-op rules from {printable(c.tolerance_policy)}; {given} where none applies (bit differences are still counted)"
    return given if tol.is_bit_exact else f"{given} (bit differences are still counted)"


def counts_line(c: Comparison) -> str:
    """The pairs by kind and the records without a partner, as every surface counts them (the
    HTML and the window's tree gave only the bit-exact count beside the text's kinds)."""
    counts = c.verdict.counts
    kinds = ", ".join(f"{counts[k]:,} {k}" for k in Kind if k in counts and k != Kind.UNALIGNED)
    return f"{len(c.pairs):,} aligned ({kinds or 'none'}); {unaligned_count(c.unaligned)}"


def _first_block(c: Comparison) -> list[str]:
    first = c.verdict.first
    if first is None:
        return ["First finding: none"]
    lines = [f"First finding: {first.kind} at {first.key}{_next_commands(c, first)}", f"  {first.detail}"]
    pair = first_with_key(c.pairs, first.key)
    if pair is not None and not pair.metrics.bit_exact:
        lines += _pair_block("  bits", pair)[1:]
    elif c.first_divergence is not None:
        lines += _pair_block("First bit difference", c.pairs[c.first_divergence])
    return lines


def _next_commands(c: Comparison, first: Finding) -> str:
    """The `rerun` and `diagnose` commands that look into the first finding: only for an aligned
    pair (an unaligned record has no partner to rerun against, nor has a token step whose logits
    only one run recorded), under the alignment that made its key (a key cut by position exists
    only when pairing by position). Not for a token step over bit-exact logits: both commands
    answered "nothing to diagnose there" of a stop mark one run set and the other did not."""
    pair = first_with_key(c.pairs, first.key)
    if first.kind == Kind.UNALIGNED or pair is None or (first.kind == Kind.TOKENS and pair.metrics.bit_exact):
        return ""
    whole = whole_op(first.key)
    # Runs cut differently name their pairing: under `auto` they pair by position, and a key made
    # by calls was refused by the very commands suggested for it.
    align = f" --align {c.alignment.mode}" if c.alignment.mode == POSITIONS or not c.alignment.cut_alike else ""
    stage = "" if whole == first.key else f"a stage of {whole}: "
    return f"  ({stage}rerun --op {whole}{align}, diagnose --op {whole}{align})"


def _token_lines(c: Comparison, full: bool, limit: int) -> list[str]:
    listed = c.tokens.steps if full else [s for s in c.tokens.steps if step_word(s) != "match"]
    out = []
    for s in listed[:limit]:
        note = " (invalid, not a failure)" if s.status == POST_EOS else ""
        out.append(f"  step {s.step}: {step_word(s):20} native {_token(s.native_token, s.native_stop)} oracle {_token(s.oracle_token, s.oracle_stop)}{note}")
        if s.logits is not None and not s.logits.identical:
            out.append(f"      {s.logits.summary()}")
        if full and s.logits is not None:
            n = ", ".join(f"{e.token_id}:{e.decimal}" for e in s.logits.native_top)
            o = ", ".join(f"{e.token_id}:{e.decimal}" for e in s.logits.oracle_top)
            out.append(f"      top native [{n}]\n      top oracle [{o}]")
    out += _more(len(listed), limit)
    post = post_eos_differing(c.pairs)
    if post:
        out.append(f"  {post} tensor pair(s) after the shared EOS differ: post-EOS, not failures")
    return out


def _token(token: int | None, stop: bool) -> str:
    return "none" if token is None else f"{token}{'*' if stop else ''}"


def _ulp(value: int | None) -> str:
    return "undefined (NaN)" if value is None else f"{value:,}"


def ulp_error_figure(value: float) -> str:
    """A p99 ULP error as every surface writes it (the viewer's tree and tables too): three
    significant digits, as whole numbers with separators from 1,000 to a million (29,900, not
    2.99e+04), in powers of ten past it (an oracle zero's ULP makes errors of 1e+20). The tree
    said 99 where the report said 98.7, so a user could not match the rows."""
    rounded = float(f"{value:.3g}")
    return f"{rounded:,.0f}" if 1000 <= rounded < 1e6 else f"{rounded:.3g}"


def _ulp_error(value: float | None) -> str:
    return "none (bytes or NaN)" if value is None else ulp_error_figure(value)


def _more(count: int, shown: int) -> list[str]:
    return [f"  ... {count - shown} more (all are in the JSON report and with --full)"] if count > shown else []


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text[:limit])
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _token_header(c: Comparison) -> str:
    t = c.tokens
    eos = "no shared EOS" if t.shared_eos_step is None else f"shared EOS at step {t.shared_eos_step}"
    return f"Token parity ({t.compared_steps} compared steps, {eos}, {t.outcome()}; * = stop token)"
