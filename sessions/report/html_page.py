"""A self-contained HTML report of an investigation, to attach to a bug.

One file, nothing fetched: styles inline, the error-growth figure drawn here as inline SVG
(no plotting library), screenshots embedded as PNG data URIs. The order is the order an
investigation reads (as in `report_text`): what was compared and whether the inputs even
match, execution contracts, the first divergence with both values as decimals and bits, the
error growth, the worst ops, token parity, then the user's bookmarks and notes.
"""

from __future__ import annotations

import base64
import datetime as _dt
from html import escape as html_escape
from pathlib import Path

import numpy as np

from sessions.atomic_write import atomic_write_bytes
from sessions.compare.comparison import (
    WORST_ORDER,
    Comparison,
    no_dispatch_difference,
    unaligned_count,
    unaligned_key,
    worst_ops,
)
from sessions.compare.contracts import KIND_WORDS
from sessions.compare.key import OpKey
from sessions.compare.tensor_diff import ElementSample
from sessions.compare.token_parity import POST_EOS, step_word, token_words
from sessions.investigation.model import Bookmark, Investigation
from sessions.investigation.store import describe_os_error
from sessions.printable import excerpt, printable, printable_lines
from sessions.progress import Progress, ProgressGenerator
from sessions.report.plot_bins import bin_envelope, worst_per_bin
from sessions.report.text import counts_line, tolerance_text, ulp_error_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURE_WIDTH, FIGURE_HEIGHT = 900, 240
TOP_OPS = 10
MAX_TOKEN_ROWS = 64
SHOWN_VALUE_CHARACTERS = 4000
"""A provenance value (the prompt) shown up to this long; the JSON carries it whole."""

STYLE = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif; margin: 24px auto; max-width: 1100px; color: #1d2430; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; border-bottom: 1px solid #d5dae1; padding-bottom: 3px; margin-top: 28px; }
table { border-collapse: collapse; margin: 6px 0; max-width: 100%; } td, th { border: 1px solid #d5dae1; padding: 3px 8px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
td:first-child, th:first-child { overflow-wrap: normal; white-space: nowrap; }
th { background: #eef1f5; white-space: nowrap; } code, .bits { font-family: 'DejaVu Sans Mono', Menlo, monospace; font-size: 12.5px; }
.verdict-divergence { color: #b3261e; font-weight: bold; } .verdict-parity { color: #1e7d3a; font-weight: bold; }
.mismatch td { background: #fbe4e3; } .post-eos td { color: #8a8f98; } .differ td { background: #fbf1d6; }
.note { white-space: pre-wrap; background: #f6f8fa; border-left: 3px solid #4a90d9; padding: 6px 10px; margin: 6px 0; }
.muted { color: #5f6773; } img.shot { max-width: 100%; border: 1px solid #d5dae1; }
"""


def escape(text: str) -> str:
    """`text` for HTML, its control characters but line breaks written as escapes: notes, reasons
    and names come from someone else's session or capture, and an escape sequence in them
    reaches the terminal of whoever prints or greps the page."""
    return html_escape(printable_lines(text))


def png_data_uri(data: bytes) -> str:
    """Only a real PNG is embedded: the report must open anywhere, and a wrong image is worse than none."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("screenshot is not a PNG (missing PNG signature)")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def bits_of(hex_text: str) -> str:
    """0x-hex as binary digits in groups of 4, the storage width kept (leading zeros matter)."""
    digits = hex_text.removeprefix("0x")
    binary = f"{int(digits, 16):0{4 * len(digits)}b}"
    return " ".join(binary[i : i + 4] for i in range(0, len(binary), 4))


def _table(header: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        css = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{css}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _element_rows(title: str, sample: ElementSample | None) -> list[list[str]]:
    if sample is None:
        return []
    ulp = "undefined (NaN)" if sample.ulp is None else f"{sample.ulp:,}"
    coord = escape(str(tuple(sample.coord)))
    return [
        [escape(title), coord, "native", escape(sample.native_decimal), f"<code>{escape(sample.native_hex)}</code>", f'<span class="bits">{bits_of(sample.native_hex)}</span>', ulp],
        ["", "", "oracle", escape(sample.oracle_decimal), f"<code>{escape(sample.oracle_hex)}</code>", f'<span class="bits">{bits_of(sample.oracle_hex)}</span>', ""],
    ]


def _first_divergence(c: Comparison) -> str:
    if c.first_divergence is None:
        compared = sum(not p.post_eos for p in c.pairs)
        if not compared:
            return "<p>No bit difference: no pair was compared before any shared EOS.</p>"
        return f"<p>No bit difference: all {compared} compared pairs before any shared EOS are bit-exact.</p>"
    pair = c.pairs[c.first_divergence]
    m = pair.metrics
    lines = [
        f"<p>First bit difference: <b><code>{escape(pair.key.text())}</code></b>: native <code>{escape(pair.native_name)}</code> (seq {pair.native_seq}), "
        f"oracle <code>{escape(pair.oracle_name)}</code> (seq {pair.oracle_seq}), {escape(m.dtype)} {escape(str(m.shape))}</p>",
        f"<p>{m.differing:,} of {m.size:,} {m.unit} differ; max {m.max_ulp if m.max_ulp is not None else 'undefined'} ULP; "
        f"NMSE {m.nmse:.3g}; cosine {m.cosine:.12g}; signed-zero-only {m.signed_zero_only}; NaN {m.nan_mismatch + m.nan_payload}</p>",
    ]
    rows = _element_rows("first differing element", m.first_difference) + _element_rows("first element beyond tolerance", m.beyond_elsewhere)
    rows += _element_rows("worst ULP element", m.worst_ulp_at)
    lines.append(_table(["element", "coordinate", "side", "value", "hex", "bits", "ULP"], rows))
    return "".join(lines)


def growth_svg(c: Comparison, width: int = FIGURE_WIDTH, height: int = FIGURE_HEIGHT) -> str:
    """log2(1 + max ULP) across execution order as an SVG polyline, the first finding marked."""
    points = c.error_growth
    if not points:
        return '<p class="muted">No aligned ops to plot.</p>'
    flat = "" if any(p.differing for p in points) else '<p class="muted">Flat: every compared op is bit-exact.</p>'
    left, right, top, bottom = 56, 12, 26, 34
    values = np.log2(1.0 + np.array([float(p.max_ulp or 0) for p in points]))
    peak = max(float(values.max()), 1.0)
    span = max(len(points) - 1, 1)

    def x(i: int) -> float:
        return left + (width - left - right) * i / span

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - v / peak)

    pixels = width - left - right
    # Each pixel column's lowest and highest error: a line through each of a real model's
    # 220,000 ops drew 220,000 points into 832 pixels (a 2.6 MB page).
    starts, lows, highs = bin_envelope(values, pixels)
    poly = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, low, high in zip(starts.tolist(), lows.tolist(), highs.tolist()) for v in dict.fromkeys((low, high)))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="error growth: log2(1 + max ULP) per op in execution order">',
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="#fafbfc" stroke="#d5dae1"/>',
    ]
    for tick in range(0, int(peak) + 1, max(1, int(peak) // 4 or 1)):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e6e9ee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end" fill="#5f6773">{2 ** tick - 1:,}</text>')
    first = c.verdict.first
    first_index = next((i for i, p in enumerate(points) if first is not None and p.key == first.key), None)
    if first is not None and first_index is not None:
        fx = x(first_index)
        parts.append(f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{top}" y2="{height - bottom}" stroke="#d64541" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{fx:.1f}" y="{top - 8}" font-size="11" fill="#b3261e">first {escape(first.kind)}: {escape(first.key.text())}</text>')
    parts.append(f'<polyline points="{poly}" fill="none" stroke="#2f74c0" stroke-width="1.6"/>')
    for i in worst_per_bin(np.arange(len(points)), values, len(points), pixels).tolist():
        point, v = points[i], float(values[i])
        if point.differing:
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.4" fill="#d64541"><title>{escape(point.key.text())}: {point.differing:,} differ, {"no ULP (bytes)" if point.max_ulp is None else f"max {point.max_ulp:,} ULP"}, NMSE {point.nmse:.3g}</title></circle>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" font-size="12" text-anchor="middle" fill="#3c4450">aligned ops in execution order ({len(points):,})</text>')
    parts.append(f'<text x="14" y="{(top + height - bottom) / 2:.0f}" font-size="12" text-anchor="middle" fill="#3c4450" transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})">max ULP</text>')
    parts.append("</svg>")
    return "".join(parts) + flat


def _dispatch(c: Comparison) -> str:
    note = f"<p>Dispatch {escape(c.dispatch_not_compared)}.</p>" if c.dispatch_not_compared else ""
    if not c.dispatch_differences:
        return note or f"<p>Dispatch: {escape(no_dispatch_difference(c))}.</p>"
    rows = [[f"<code>{escape(d.key.text())}</code>", escape(", ".join(d.fields)), escape(d.native_summary), escape(d.oracle_summary)] for d in c.dispatch_differences]
    return _table(["op", "differs in", "native", "oracle"], rows, ["mismatch"] * len(rows)) + note


def _worst(c: Comparison) -> str:
    worst = worst_ops(c, TOP_OPS)
    if not worst:
        return f"<p>None: {'no op before any shared EOS differs' if c.pairs else 'no op was compared'}.</p>"
    rows = [
        [f"<code>{escape(p.key.text())}</code>", escape(p.verdict), f"{p.metrics.nmse:.3e}", "none (bytes or NaN)" if p.metrics.p99_ulp_error is None else ulp_error_figure(p.metrics.p99_ulp_error), f"{p.metrics.differing:,} / {p.metrics.size:,}"]
        for p in worst
    ]
    return _table(["op", "kind", "NMSE", "ULP error p99", "differing"], rows)


def _tokens(c: Comparison) -> str:
    t = c.tokens
    eos = "no shared EOS" if t.shared_eos_step is None else f"shared EOS at step {t.shared_eos_step}; later steps are post-EOS (not compared)"
    rows, classes = [], []
    for s in t.steps[:MAX_TOKEN_ROWS]:
        top_n = ", ".join(f"{e.token_id}: {e.decimal}" for e in s.logits.native_top) if s.logits else ""
        top_o = ", ".join(f"{e.token_id}: {e.decimal}" for e in s.logits.oracle_top) if s.logits else ""
        word = step_word(s)
        logits = s.logits.summary() if s.logits else "not compared (post-EOS)" if s.status == POST_EOS else "not captured"
        rows.append([str(s.step), escape(token_words(s.native_token, s.native_stop)), escape(token_words(s.oracle_token, s.oracle_stop)),
                     escape(word), escape(logits), escape(top_n), escape(top_o)])
        classes.append("post-eos" if s.status == POST_EOS else ("differ" if word != "match" else ""))
    table = _table(["step", "native", "oracle", "verdict", "logits", "native top-k", "oracle top-k"], rows, classes) if rows else ""
    return f"<p>{t.compared_steps} step(s) compared; {t.outcome()}; {eos}.</p>{table}"


def _bookmark(bookmark: Bookmark, screenshot: bytes | None) -> str:
    note = f'<div class="note">{escape(bookmark.note)}</div>' if bookmark.note else '<p class="muted">(no note)</p>'
    view = ""
    if bookmark.view is not None:
        view = f'<p class="muted">colour scale {escape(bookmark.view.colour_scale.mode)}; slices {escape(bookmark.view.slice_text())}</p>'
    image = f'<img class="shot" alt="{escape(bookmark.op.label())}" src="{png_data_uri(screenshot)}">' if screenshot else '<p class="muted">No screenshot (exported without the viewer).</p>'
    return f"<h3>{escape(bookmark.op.label())}</h3><p class='muted'>marked {escape(bookmark.created_utc)}</p>{note}{view}{image}"


def _op_label(op: OpKey | None) -> str:
    return "none" if op is None else op.label()


def render_html(
    c: Comparison, session: Investigation | None = None, screenshots: dict[str, bytes] | None = None, judged: tuple[str, bool] | None = None
) -> str:
    """The report; `screenshots` maps bookmark id to PNG bytes of the bookmarked view; `judged`:
    (a gate's judgment of this comparison, whether it passed), said above its verdict."""
    session = session or Investigation()
    screenshots = screenshots or {}
    title = session.title or "Parity investigation"
    verdict_class = "verdict-parity" if c.verdict.passed else "verdict-divergence"
    out = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='muted'>Parity X-ray report, generated {escape(_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds'))}</p>",
        f"<p class='{verdict_class}'>{escape(c.verdict.headline)}</p>",
    ]
    if judged is not None:
        out.insert(3, f"<p class='{'verdict-parity' if judged[1] else 'verdict-divergence'}'>{escape(printable(judged[0]))}</p>")
    if c.verdict.reasons:
        out.append("<ul>" + "".join(f"<li>{escape(r)}</li>" for r in c.verdict.reasons) + "</ul>")
    out.append(f"<p>Ops: {escape(counts_line(c))}</p>")
    out.append(f"<p>Alignment: {escape(c.alignment.words())}</p>")
    out.append(f"<p>Tolerance: {escape(tolerance_text(c))}</p>")
    if session.summary:
        out.append(f"<h2>Summary</h2><div class='note'>{escape(session.summary)}</div>")
    # Escaped as the text report escapes them: a zero-width space hid which of two hashes differs.
    out.append(f"<h2>Provenance</h2><p>{escape(printable(c.provenance.summary))}</p>")
    out += [f"<p class='verdict-divergence'>WARNING: {escape(printable(w))}</p>" for w in c.provenance.warnings]
    out.append(f"<p>native <code>{escape(c.native_path)}</code> (profile {escape(c.native_profile)}); oracle <code>{escape(c.oracle_path)}</code> (profile {escape(c.oracle_profile)})</p>")
    out.append(_table(["field", "native", "oracle"], [[escape(f.field), escape(printable(excerpt(f.native, SHOWN_VALUE_CHARACTERS))), escape(printable(excerpt(f.oracle, SHOWN_VALUE_CHARACTERS)))] for f in c.provenance.fields],
                      ["" if f.same else "mismatch" for f in c.provenance.fields]))
    if session.captures:
        rows = [[escape(r.role), f"<code>{escape(str(r.path))}</code>", f"<code>{escape(r.identity.sha256[:16])}</code>", f"{r.identity.size:,}"] for r in session.all_capture_refs()]
        out.append("<h3>Captures in the session</h3>" + _table(["role", "path", "identity (sha256)", "bytes"], rows))
    out.append(f"<h2>Execution contracts</h2><p>{c.contracts.checked} pairs checked, {c.contracts.unrecorded} without contract ids.</p>")
    findings = c.contracts.findings
    out.append(_table(["kind", "op", "detail"], [[escape(KIND_WORDS[f.kind]), f"<code>{escape(f.key.text())}</code>", escape(f.detail)] for f in findings], ["mismatch"] * len(findings))
               if findings else "<p>No contract mismatches.</p>")
    out.append(f"<h2>Dispatch</h2>{_dispatch(c)}")
    first = c.verdict.first
    out.append("<h2>First finding</h2>")
    out.append("<p>None.</p>" if first is None else f"<p><b>{escape(first.kind)}</b> at <code>{escape(first.key.text())}</code>: {escape(first.detail)}</p>")
    out.append(_first_divergence(c))
    out.append(f"<h2>Error growth</h2>{growth_svg(c)}")
    out.append(f"<h2>Worst ops ({escape(WORST_ORDER)})</h2>{_worst(c)}")
    out.append(f"<h2>Token parity</h2>{_tokens(c)}")
    out.append(f"<h2>Unaligned records ({len(c.unaligned):,}, plus {len(c.post_eos_unaligned):,} post-EOS: invalid, not failures)</h2>{_unaligned(c)}")
    out.append(f"<h2>Bookmarks ({len(session.bookmarks)})</h2>")
    out += [_bookmark(b, screenshots.get(b.id)) for b in session.bookmarks] or ["<p class='muted'>No bookmarks.</p>"]
    if session.overrides:
        rows = [[escape(o.action), escape(f"{o.left.capture_id}:{o.left.key}"), escape(f"{o.right.capture_id}:{o.right.key}"), escape(o.reason)] for o in session.overrides]
        out.append("<h2>Alignment overrides</h2>" + _table(["action", "left", "right", "reason"], rows))
    out.append(f"<p class='muted'>Selected op when exported: {escape(_op_label(session.selected_op))}; "
               f"{escape(unaligned_count(c.unaligned))} record(s), plus {len(c.post_eos_unaligned)} without a partner after the shared EOS (invalid, not failures).</p>")
    out.append("</body></html>")
    return "\n".join(out)


UNALIGNED_ROWS = 500
"""Records without a partner the page lists; the JSON holds them all (a real run's can number 100,000s)."""


def _unaligned(c: Comparison) -> str:
    """Each record without a partner and why, as the text report lists them: the page named the
    first and a count, where a runs-cut-differently DIVERGENCE was made of 164 of them."""
    if not c.unaligned:
        return "<p>None.</p>"
    rows = [
        [f"<code>{escape(unaligned_key(u).text())}</code>", escape(u.side), f"<code>{escape(u.name)}</code>", f"{u.seq}", escape(u.why())]
        for u in c.unaligned[:UNALIGNED_ROWS]
    ]
    more = len(c.unaligned) - UNALIGNED_ROWS
    tail = f"<p class='muted'>… {more:,} more, all in the JSON report (report --json).</p>" if more > 0 else ""
    return _table(["key", "side", "record", "seq", "why"], rows) + tail


def iter_write_html(path: Path, c: Comparison, session: Investigation | None = None, screenshots: dict[str, bytes] | None = None) -> ProgressGenerator[str | None]:
    """The report written atomically at `path`; returns why it could not be, in words, or None.
    A generator, so the viewer renders it off its UI thread: 0.3-0.45 s for 240,000 pairs."""
    yield Progress(0, 1, "writing the HTML report")
    data = render_html(c, session, screenshots).encode("utf-8")
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        return describe_os_error(exc)
    return None
