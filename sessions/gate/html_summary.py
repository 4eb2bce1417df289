"""A gate's results as one self-contained HTML page, linking each case's own HTML report.

The page is what a parity claim is attached to ("40/40 images pass 64/64 token steps"), so
it leads with the summary line and the exit code, then has one row per case in manifest
order: the verdict word in the colour every surface gives it, the first finding's key, the
tokens compared against the budget, where the shared EOS was, the worst op, and why a case
failed the gate's rules or could not be judged. Styles are inline; nothing is fetched.
"""

from __future__ import annotations

from urllib.parse import quote

from sessions.gate.result import CaseResult, GateResult
from sessions.report.html_page import STYLE, escape
from sessions.report.word_colours import WORD_COLOURS


def word_class(word: str) -> str:
    """The CSS class a verdict word is painted with ("DISPATCH-ONLY" -> "w-dispatch-only")."""
    return "w-" + word.lower().replace(" ", "-")


GATE_STYLE = (
    ".word { color: #fff; font-weight: bold; white-space: nowrap; }\n"
    + " ".join(f".{word_class(word)} {{ background: {colour}; }}" for word, colour in WORD_COLOURS.items())
    + "\n.fail { color: #b3261e; font-weight: bold; } .pass { color: #1e7d3a; font-weight: bold; }\n"
)
"""Each word in the colour every surface gives it (sessions.report.word_colours)."""


def _tokens(c: CaseResult) -> tuple[str, str]:
    if c.tokens is None:
        return "", ""
    compared = c.tokens.compared_text()
    if c.tokens.first_divergence_step is not None:
        compared += f" (differ from step {c.tokens.first_divergence_step})"
    return compared, c.tokens.eos_text()


def _row(c: CaseResult) -> str:
    name = escape(c.name)
    if c.report is not None:
        name = f'<a href="{escape(quote(c.report))}">{name}</a>'
    first = "" if c.first is None else f"{escape(c.first.kind)} at <code>{escape(c.first.key)}</code>"
    tokens, eos = _tokens(c)
    worst = ""
    if c.worst_op is not None:
        ulp = "NaN" if c.worst_op.max_ulp is None else f"{c.worst_op.max_ulp:,}"
        worst = f"<code>{escape(c.worst_op.key)}</code> ({escape(c.worst_op.kind)}, max {ulp} ULP, NMSE {c.worst_op.nmse:.3g})"
    notes = c.notes()
    gate = '<span class="pass">pass</span>' if c.passed else '<span class="fail">FAIL</span>'
    source = "cached" if c.reused else f"{c.seconds:.1f} s"
    cells = [name, f'<span class="word {escape(word_class(c.word))}">{escape(c.word)}</span>', gate, first, tokens, eos, worst,
             "<br>".join(escape(n) for n in notes), escape(source)]
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def render_gate_html(gate: GateResult) -> str:
    header = ["case", "verdict", "gate", "first finding", "tokens compared", "shared EOS", "worst op", "notes", "time"]
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    verdict_class = "verdict-parity" if gate.passed else "verdict-divergence"
    return "\n".join([
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Parity gate</title><style>{STYLE}{GATE_STYLE}</style></head><body>",
        "<h1>Parity gate</h1>",
        f"<p class='muted'>manifest <code>{escape(gate.manifest)}</code>; judged on {escape(gate.cluster)} in {gate.seconds:.1f} s; finished {escape(gate.created)}</p>",
        f"<p class='{verdict_class}'>{escape(gate.headline)} (exit {gate.exit_code})</p>",
        f"<table><tr>{head}</tr>{''.join(_row(c) for c in gate.cases)}</table>",
        "</body></html>",
    ])
