"""A Diagnosis as JSON (docs/diagnosis.md), as text for the terminal, and as one HTML page.

All three lead with the same sentence, `Diagnosis.verdict`, and take every figure from the
Diagnosis itself, so they cannot disagree with each other or with the viewer's panel.
"""

from __future__ import annotations

from typing import Any

from backends.diagnosis.budget import Budget, BudgetRow
from backends.diagnosis.candidates import CandidateResult, ErrorFigure
from backends.diagnosis.registry import REGISTRY
from backends.diagnosis.run import Diagnosis, OpDiagnosis
from sessions.compare.json_plain import plain
from sessions.printable import printable_lines
from sessions.report.html_page import STYLE, escape

FORMAT, VERSION = "parity-xray-diagnosis", 1
LOCAL_ROWS_SHOWN = 40
"""Local ops listed in the text and HTML skeleton before the rest is counted (the JSON has every one)."""
UNDETERMINED_ROWS_SHOWN = 5
"""Ops that could not be classified, listed in the text before the rest is counted: what leaves
one so usually leaves the next so too, for the same reason."""


def to_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    """The JSON document: the verdict first, then the skeleton, every classified op, the budget."""
    body = plain(diagnosis, omit=frozenset({"bits", "route_bits"}))
    covered = diagnosis.covered_keys()
    return {
        "format": FORMAT,
        "version": VERSION,
        "verdict": diagnosis.verdict,
        "local_chain": [op.key.text() for op in diagnosis.local_chain],
        "covered": [op.key.text() for op in diagnosis.ops if op.key in covered],
        "contracts": diagnosis.contracts(),
        **{k: v for k, v in body.items() if k != "verdict"},
        "registry": [{"id": c.id, "ops": sorted(c.ops), "description": c.description, "source": c.source} for c in REGISTRY],
    }


def figure(value: ErrorFigure | None) -> str:
    return "—" if value is None else value.text()


def share_text(row: BudgetRow) -> str:
    if row.not_measured is not None:
        return f"not measured: {row.not_measured}"
    reaches = row.final is None or not row.final.bit_exact
    if row.share is None:
        if reaches and row.final is not None:
            # The native's final logits carry no error, so there is nothing to take a share of,
            # but the change alone does reach them: that is worth saying, not a dash.
            return f"none (the native's are exact), yet alone it gives {row.final.short()}"
        return "none (no final error to share out)"
    return f"{100 * row.share:.3g}%" if reaches else "0% (the final logits are the same with and without it)"


def candidate_line(result: CandidateResult) -> str:
    if result.skipped is not None:
        return f"not run: {result.skipped}"
    return f"vs native {figure(result.vs_native)}; vs oracle's route {figure(result.vs_oracle_route)}"


def _op_line(op: OpDiagnosis) -> str:
    found = op.classification
    ran = op.native_ran or (f"closest {op.closest}" if op.closest else "—")
    local = found.local.short() if found.local else "—"
    return f"{found.key.text():<28} {found.locality:<12} {ran:<34} local {local:<34} total {found.total.short()}"


def render_text(diagnosis: Diagnosis, verbose: bool = False) -> str:
    """The terminal form: verdict, skeleton, candidates at the first local op, budget, notes."""
    lines = [diagnosis.verdict, "", f"native {diagnosis.native_path}", f"oracle {diagnosis.oracle_path}"]
    chain = diagnosis.local_chain
    lines.append(diagnosis.counts_text())
    if chain:
        lines += ["", "Local ops (the diagnosis skeleton, execution order):"]
        lines += [f"  {_op_line(op)}" for op in chain[:LOCAL_ROWS_SHOWN]]
        if len(chain) > LOCAL_ROWS_SHOWN:
            lines.append(f"  ... {len(chain) - LOCAL_ROWS_SHOWN} more in the JSON")
        contracts = diagnosis.contracts()
        lines.append("  contracts: " + ", ".join(f"{name or 'no exact candidate'} x{count}" for name, count in contracts.items()))
        for op in chain[: (len(chain) if verbose else 1)]:
            lines += ["", f"Candidates at {op.key} (on the native's own inputs):"]
            lines += [f"  {c.id:<34} {candidate_line(c)}" for c in op.candidates]
    undetermined = [op for op in diagnosis.ops if str(op.classification.locality) == "undetermined"]
    if undetermined:
        lines += ["", "Not classified (execution order; a covered stage is accounted for by the op that computes it):"]
        words = diagnosis.locality()
        lines += [f"  {words[op.key]} {op.key}: {op.classification.why}" for op in undetermined[:UNDETERMINED_ROWS_SHOWN]]
        if len(undetermined) > UNDETERMINED_ROWS_SHOWN:
            lines.append(f"  ... {len(undetermined) - UNDETERMINED_ROWS_SHOWN} more in the JSON")
    for declared in diagnosis.contract_only:
        lines += ["", f"Contract-only mismatch at {declared.key} (identical bits): native declares {declared.native_declared or 'none'}; "
                  f"oracle declares {declared.oracle_declared or 'none'}; candidates on the native's own inputs, against those bits:"]
        lines += [f"  {c.id:<34} {figure(c.vs_native) if c.skipped is None else f'not run: {c.skipped}'}" for c in declared.candidates]
    for note in diagnosis.dispatch:
        lines += ["", f"Dispatch-only {note.key}: native {note.native_summary}; oracle {note.oracle_summary}",
                  f"  reproducing the bits here: {', '.join(note.reproducing) or 'none'}"]
    if diagnosis.budget is not None:
        lines += ["", *budget_lines(diagnosis.budget)]
    lines += ["", *diagnosis.notes, f"device {diagnosis.device} (MLX {diagnosis.mlx_version}), {diagnosis.seconds:.1f} s"]
    # Notes, reasons and skipped candidates quote a capture's weights path and a profile's words.
    return printable_lines("\n".join(lines))


def budget_lines(budget: Budget) -> list[str]:
    if budget.final_logits is None:
        return ["Budget:", *budget.notes]
    lines = [f"Budget of the final logits {budget.final_logits} (native vs oracle {figure(budget.total)}):"]
    ranked = sorted(budget.rows, key=lambda r: -(r.share or 0.0))
    for row in ranked[:LOCAL_ROWS_SHOWN]:
        lines.append(f"  {row.key.text():<28} {share_text(row):<48}  local {figure(row.local)}; injected {row.injected or '—'}")
    if len(ranked) > LOCAL_ROWS_SHOWN:
        lines.append(f"  ... {len(ranked) - LOCAL_ROWS_SHOWN} more in the JSON")
    return lines + [f"  {note}" for note in budget.notes]


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(diagnosis: Diagnosis) -> str:
    """One self-contained page: the verdict, the skeleton, each local op's candidates, the budget."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Parity X-ray diagnosis</title><style>{STYLE}</style></head><body>",
        "<h1>Parity X-ray diagnosis</h1>",
        f"<p class='note'>{escape(diagnosis.verdict)}</p>",
        f"<p class='muted'>native <code>{escape(diagnosis.native_path)}</code><br>oracle <code>{escape(diagnosis.oracle_path)}</code><br>"
        f"{escape(diagnosis.device)} (MLX {escape(diagnosis.mlx_version)}), {diagnosis.seconds:.1f} s, mode {escape(diagnosis.mode)}</p>",
    ]
    if diagnosis.ops:
        words = diagnosis.locality()
        parts.append("<h2>Classified ops</h2>")
        parts.append(_table(
            ["op", "kind", "locality", "native ran", "local error", "total error", "why"],
            [[op.key.text(), op.classification.kind, words[op.key], op.native_ran or (f"closest: {op.closest}" if op.closest else "—"),
              figure(op.classification.local), op.classification.total.text(), op.classification.why] for op in diagnosis.ops[: LOCAL_ROWS_SHOWN * 4]],
        ))
        if len(diagnosis.ops) > LOCAL_ROWS_SHOWN * 4:
            parts.append(f"<p class='muted'>... {len(diagnosis.ops) - LOCAL_ROWS_SHOWN * 4} more in the JSON</p>")
    for op in diagnosis.local_chain[:LOCAL_ROWS_SHOWN]:
        parts.append(f"<h2>Candidates at {escape(op.key.text())}</h2>")
        parts.append(f"<p>Oracle's route: {escape('; '.join(op.classification.oracle_route))}. "
                     f"Closer to exact (float64): {escape(op.classification.closer_to_exact)}.</p>")
        parts.append(_table(
            ["candidate", "vs native", "vs oracle's route", "what it computes", "source"],
            [[c.id, figure(c.vs_native) if c.skipped is None else f"not run: {c.skipped}", figure(c.vs_oracle_route), c.description, c.source] for c in op.candidates],
        ))
    for declared in diagnosis.contract_only:
        parts.append(f"<h2>Contract-only mismatch at {escape(declared.key.text())}</h2><p>Identical bits; the native declares "
                     f"{escape(declared.native_declared or 'none')}, the oracle {escape(declared.oracle_declared or 'none')}.</p>")
        parts.append(_table(
            ["candidate", "vs the bits both sides hold", "what it computes", "source"],
            [[c.id, figure(c.vs_native) if c.skipped is None else f"not run: {c.skipped}", c.description, c.source] for c in declared.candidates],
        ))
    for note in diagnosis.dispatch:
        parts.append(f"<h2>Dispatch-only {escape(note.key.text())}</h2><p>native: {escape(note.native_summary)}<br>oracle: {escape(note.oracle_summary)}<br>"
                     f"reproducing the bits here: {escape(', '.join(note.reproducing) or 'none')}</p>")
    if diagnosis.budget is not None and diagnosis.budget.final_logits is not None:
        budget = diagnosis.budget
        parts.append(f"<h2>Budget of the final logits {escape(budget.final_logits.text())}</h2><p>native vs oracle: {escape(figure(budget.total))}</p>")
        parts.append(_table(
            ["local op", "share of the final error", "local error", "final logits after the replay", "token changes", "injected"],
            [[r.key.text(), share_text(r), figure(r.local), figure(r.final), "—" if r.token_changes is None else ("yes" if r.token_changes else "no"), r.injected]
             for r in sorted(budget.rows, key=lambda r: -(r.share or 0.0))],
        ))
        parts += [f"<p class='muted'>{escape(n)}</p>" for n in budget.notes]
    parts += [f"<p class='muted'>{escape(n)}</p>" for n in diagnosis.notes]
    parts.append("</body></html>")
    return "\n".join(parts)
