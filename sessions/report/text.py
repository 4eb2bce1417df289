"""The readable summary of a comparison, in the order an investigation reads it.

Warnings about the inputs first (a weights mismatch invalidates everything below), then
execution state, then the first divergence with both values as bits and decimals, the worst
ops, token parity and whatever could not be aligned.
"""

from __future__ import annotations

from sessions.compare.comparison import Comparison, PairResult
from sessions.compare.tensor_diff import ElementSample, TensorMetrics

MAX_LISTED = 50


def _element(sample: ElementSample | None) -> str:
    if sample is None:
        return "-"
    ulp = "undefined (NaN)" if sample.ulp is None else str(sample.ulp)
    return (
        f"at {sample.coord}: native {sample.native_hex} ({sample.native_decimal}) vs "
        f"oracle {sample.oracle_hex} ({sample.oracle_decimal}), {ulp} ULP"
    )


def _counts(m: TensorMetrics) -> str:
    parts = [f"{m.differing}/{m.size} elements differ ({m.fraction_differing:.3%})"]
    if m.max_ulp is not None:
        parts.append(f"max {m.max_ulp} ULP, p99 {m.p99_ulp}{'' if m.p99_exact else ' (bucket edge)'}")
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


def _pair_block(title: str, pair: PairResult) -> list[str]:
    m = pair.metrics
    lines = [
        f"{title}: {pair.label}",
        f"  native {pair.native_name!r} (seq {pair.native_seq}), oracle {pair.oracle_name!r} (seq {pair.oracle_seq}), {m.dtype} {m.shape}",
        f"  {_counts(m)}",
        f"  first differing element {_element(m.first_difference)}",
        f"  worst ULP element {_element(m.worst_ulp_at)}",
        f"  max abs error {m.max_abs_error:.6g} {_element(m.max_abs_at)}",
        f"  max rel error {m.max_rel_error:.6g}; RMSE {m.rmse:.6g}; NMSE {m.nmse:.6g}; cosine {m.cosine:.12g}",
    ]
    return lines


def render(c: Comparison, top: int = 10) -> str:
    out: list[str] = []
    for warning in c.provenance.warnings:
        out.append(f"WARNING: {warning}")
    out.append(f"VERDICT: {c.verdict.upper()}" + (f" ({'; '.join(c.reasons)})" if c.reasons else ""))
    out.append(f"native {c.native_path} [profile {c.native_profile}]")
    out.append(f"oracle {c.oracle_path} [profile {c.oracle_profile}]")
    tol = c.tolerance
    out.append(
        "tolerance: bit-exact"
        if tol.atol is None and tol.rtol is None and tol.max_ulp is None
        else f"tolerance: atol={tol.atol} rtol={tol.rtol} max_ulp={tol.max_ulp} (bit differences are still counted)"
    )
    out += ["", "Provenance"]
    for f in c.provenance.fields:
        mark = "  " if f.native == f.oracle else "!="
        out.append(f"  {mark} {f.field:15} native {_short(f.native):40} oracle {_short(f.oracle)}")
    out += ["", f"Execution contracts ({c.contracts.checked} pairs, {c.contracts.unrecorded} without contract ids)"]
    out += [f"  {f.kind} {f.pair}: {f.detail}" for f in c.contracts.findings[:MAX_LISTED]] or ["  no findings"]
    out += ["", "Dispatch"]
    out += [
        f"  DISPATCH_DIFFERENCE {d.pair} ({', '.join(d.fields)}):\n    native: {d.native_summary}\n    oracle: {d.oracle_summary}"
        for d in c.dispatch_differences[:MAX_LISTED]
    ] or ["  no differences"]
    out.append("")
    f = c.first_finding
    out.append("First finding: none" if f is None else f"First finding: {f.kind} at {f.label}")
    if c.first_divergence is None:
        out.append(f"First divergence: none; all {sum(not p.post_eos for p in c.pairs)} compared pairs are bit-exact")
    else:
        out += _pair_block("First divergence", c.pairs[c.first_divergence])
    if c.first_beyond_tolerance is not None and c.first_beyond_tolerance != c.first_divergence:
        out += _pair_block("First beyond tolerance", c.pairs[c.first_beyond_tolerance])
    worst = sorted(
        (p for p in c.pairs if not p.post_eos and not p.metrics.bit_exact),
        key=lambda p: (p.metrics.nmse, p.metrics.max_ulp or 0, p.metrics.differing),
        reverse=True,
    )[:top]
    out += ["", f"Top {top} worst ops (by NMSE, then max ULP)"]
    out += [
        f"  {p.label:45} NMSE {p.metrics.nmse:.3e}  max ULP {p.metrics.max_ulp}  differing {p.metrics.differing}/{p.metrics.size}"
        for p in worst
    ] or ["  none"]
    out += ["", "Error growth (execution order: max ULP, NMSE)"]
    out += [f"  {g.label:45} {g.max_ulp!s:>8}  {g.nmse:.3e}" for g in c.error_growth if g.max_ulp] or ["  flat: every compared pair is bit-exact"]
    out += ["", _token_header(c)]
    for s in c.tokens.steps[:MAX_LISTED]:
        note = " (post-EOS, invalid, not a failure)" if s.status == "post_eos" else ""
        out.append(f"  step {s.step}: {s.status:8} native {s.native_token}{'*' if s.native_stop else ''} oracle {s.oracle_token}{'*' if s.oracle_stop else ''}{note}")
        if s.native_top or s.oracle_top:
            n = ", ".join(f"{e.token_id}:{e.decimal}" for e in s.native_top)
            o = ", ".join(f"{e.token_id}:{e.decimal}" for e in s.oracle_top)
            out.append(f"      top native [{n}]\n      top oracle [{o}]")
    post = [p for p in c.pairs if p.post_eos and not p.metrics.bit_exact]
    if post:
        out.append(f"  {len(post)} tensor pair(s) after the shared EOS differ: post-EOS, not failures")
    out += ["", f"Unaligned records ({len(c.unaligned)}, plus {len(c.post_eos_unaligned)} post-EOS: invalid, not failures)"]
    out += [f"  {u.side} seq {u.seq} {u.name!r} step {u.step} {u.segment} layer {u.layer} occ {u.occurrence}: {u.reason}: {u.detail}" for u in c.unaligned[:MAX_LISTED]] or ["  none"]
    if len(c.unaligned) > MAX_LISTED:
        out.append(f"  ... {len(c.unaligned) - MAX_LISTED} more (all are in the JSON report)")
    return "\n".join(out) + "\n"


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _token_header(c: Comparison) -> str:
    t = c.tokens
    eos = "no shared EOS" if t.shared_eos_step is None else f"shared EOS at step {t.shared_eos_step}"
    first = "tokens agree" if t.first_divergence_step is None else f"first token divergence at step {t.first_divergence_step}"
    return f"Token parity ({t.compared_steps} compared steps, {eos}, {first}; * = stop token)"
