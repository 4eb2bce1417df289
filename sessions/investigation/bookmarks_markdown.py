"""Bookmarks and notes as Markdown, to paste into an issue or hand to a colleague.

Notes are the user's own Markdown and are kept as written; everything generated around them
(op keys, paths, hashes) goes in code spans so it survives any Markdown renderer verbatim. The
one-line texts (the title, a pairing's reason, a rerun's description) keep to their line: a
session may be someone else's, and a newline in its title wrote a Markdown block of its own.
"""

from __future__ import annotations

import re

from sessions.compare.key import OpKey
from sessions.investigation.model import Investigation, RecordRef
from sessions.printable import printable


def _code(text: str) -> str:
    """An inline code span that holds any text, backticks included (CommonMark's rule)."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _op(op: OpKey) -> str:
    return _code(op.text())


def _record(ref: RecordRef) -> str:
    k = ref.key
    return _code(f"{ref.capture_id}: step {k.step} · {k.segment} · layer {k.layer} · {k.name} #{k.occurrence}")


def bookmarks_markdown(session: Investigation) -> str:
    lines = [f"# {printable(session.title) or 'Parity investigation'}", ""]
    if session.summary.strip():
        lines += [session.summary.strip(), ""]
    if session.captures or session.reruns:
        lines += ["## Captures", ""]
        for ref in session.all_capture_refs():
            lines.append(f"- **{ref.role}** {_code(ref.id)}: {_code(ref.uri)} (sha256 {_code(ref.identity.sha256[:16])})")
        lines.append("")
    lines += ["## Bookmarks", ""]
    if not session.bookmarks:
        lines += ["No bookmarks.", ""]
    for bookmark in session.bookmarks:
        when = f" — {bookmark.created_utc}" if bookmark.created_utc else ""
        lines += [f"### {_op(bookmark.op)}{when}", ""]
        lines += [bookmark.note.strip() or "_(no note)_", ""]
    if session.overrides:
        lines += ["## Alignment decisions", ""]
        for o in session.overrides:
            verb = "paired" if o.action == "pair" else "unpaired"
            lines.append(f"- {verb} {_record(o.left)} with {_record(o.right)}: {printable(o.reason)}")
        lines.append("")
    if session.reruns:
        lines += ["## Reruns", ""]
        for r in session.reruns:
            at = f" at {_op(r.op)}" if r.op else ""
            lines.append(f"- {printable(r.description)}{at}: {_code(str(r.capture.path))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
