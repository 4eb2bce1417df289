"""`parity-xray gate MANIFEST`: many capture pairs judged like `report`, one summary line, one exit code.

A parity claim is made over many cases ("the 10-image, 40-image, and per-image EOS gates"),
so the gate judges every case of a manifest (sessions.gate.manifest) on a Dask cluster
(sessions.gate.cluster), prints each case as it finishes, then the table and the summary
line, and exits like `report`: 0 every case passes, 1 any fails, 2 any is unusable or the
manifest is bad. 130 when cancelled with Ctrl-C (nothing is written then: a partial gate is
no claim). Unchanged cases reuse their cached result (sessions.gate.cache).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.commands.arguments import (
    end_unusable,
    non_empty,
    output_problem,
    remove_earlier_outputs,
    write_outputs,
)
from sessions.ctrl_c import exit_code_of, raise_if_pressed, said
from sessions.machine import WORKERS_PER_CORE, too_many_workers
from sessions.printable import printable

if TYPE_CHECKING:
    from sessions.gate.judge import CachedCase, CaseOutcome
    from sessions.gate.manifest import GateCase
    from sessions.gate.result import CaseResult, GateResult

"""The most local Dask workers --workers may ask for, per core this process may use."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", type=non_empty, help="TOML manifest of the cases (docs/gate.md)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N", help=f"local Dask worker processes, one thread each (default: one per core; at most {WORKERS_PER_CORE} per core)")
    where.add_argument("--scheduler", type=non_empty, metavar="tcp://HOST:8786", help="judge on this existing Dask cluster; its workers must see the capture paths")
    parser.add_argument("--json", type=non_empty, metavar="OUT", help="write the results as JSON (docs/gate.md)")
    parser.add_argument("--html", type=non_empty, metavar="OUT", help="write an HTML summary, and each case's own report in STEM-cases/ beside it (gate.html: gate-cases/)")
    parser.add_argument("--no-cache", action="store_true", help="judge every case again, even those whose captures and options did not change")


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: building the CLI's parser must not load Dask.
    from sessions.gate.cluster import ClusterError, DaskGate
    from sessions.gate.manifest import ManifestError, load_manifest

    outputs = {"--json": args.json, "--html": args.html}
    inputs: dict[str, str | Path | None] = {"manifest": args.manifest}

    def fail(message: str) -> int:
        return end_unusable("gate", message, {"--json": args.json, "--html": args.html}, inputs)  # the documents, not the cases' pages

    if args.workers is not None and args.workers < 1:
        return fail(f"--workers must be at least 1, got {args.workers}")
    too_many = too_many_workers(args.workers) if args.workers is not None else None
    if too_many is not None:
        return fail(too_many)
    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as exc:
        return fail(f"bad manifest: {exc}")
    for case in manifest.cases:
        inputs.update(_case_inputs(case))
    # The documents first: the cases' pages are named from --html, which "." or "/" cannot name.
    clash = output_problem(outputs, inputs)
    if clash is not None:
        return fail(clash)
    pages = {f"the report of case {case.name!r}": str(page) for case, page in zip(manifest.cases, case_pages(args.html, manifest.cases))} if args.html else {}
    # The summary's folder must be there, as every output's is; only its cases' folder is made,
    # so it must be one that can be: found after every case was judged, either lost the gate's work.
    clash = output_problem({**outputs, **pages}, inputs, made_folders=set(pages)) or (_cases_folder_problem(args.html, args.json) if args.html else None)
    if clash is not None:
        return fail(clash)
    state = _GateRun(manifest.cases, want_html=args.html is not None, use_cache=not args.no_cache)
    started = time.monotonic()
    try:
        with DaskGate(args.workers, args.scheduler) as dask_gate:
            cluster, dashboard = dask_gate.description, dask_gate.dashboard
            print(f"judging {len(manifest.cases)} case(s) on {cluster}")
            if dashboard is not None:
                print(f"Dask dashboard: {dashboard}")
            for index, outcome in dask_gate.judge(list(manifest.cases), state.previous, state.want_html):
                state.finished(index, outcome)
                raise_if_pressed()
    except ClusterError as exc:
        return fail(str(exc))
    except KeyboardInterrupt as stop:
        # An earlier gate's documents go too: a CI step archiving them after a timed-out gate took that gate's verdict for this one's.
        remove_earlier_outputs({"--json": args.json, "--html": args.html}, inputs)
        print(f"\nparity-xray gate: {said(stop, 'cancelled')}; {state.done} of {len(manifest.cases)} case(s) were judged; nothing written", file=sys.stderr)
        return exit_code_of(stop)
    except BrokenPipeError:
        # Its progress met a closed pipe (`| head -1`): the gate ends unjudged, and makes no claim either.
        remove_earlier_outputs({"--json": args.json, "--html": args.html}, inputs)
        raise
    gate = state.result(str(manifest.path), cluster, dashboard, time.monotonic() - started)
    problem = state.write(gate, args.json, args.html)
    sys.stdout.write(render_text(gate))  # after the documents: see `report`
    if problem is not None:
        return fail(problem)
    return gate.exit_code


class _GateRun:
    """The cases' cache keys, what the cache holds for them, and each outcome as it comes."""

    def __init__(self, cases: tuple[GateCase, ...], want_html: bool, use_cache: bool) -> None:
        from sessions.gate.cache import case_key, gate_cache_dir, load_entry, load_html

        self.cases = cases
        self.want_html = want_html
        self.cache_dir = gate_cache_dir()
        self.keys = [case_key(c) for c in cases]
        self.pages: dict[int, str] = {}
        self.results: dict[int, CaseResult] = {}
        self.previous: list[CachedCase | None] = []
        for index, key in enumerate(self.keys):
            entry = load_entry(self.cache_dir, key) if use_cache else None
            page = load_html(self.cache_dir, key) if entry is not None and want_html else None
            if want_html and page is None:
                entry = None  # its report is needed and gone: judge it again
            if page is not None:
                self.pages[index] = page
            self.previous.append(entry)

    @property
    def done(self) -> int:
        return len(self.results)

    def finished(self, index: int, outcome: CaseOutcome) -> None:
        from sessions.gate.cache import store_entry

        store_entry(self.cache_dir, self.keys[index], outcome)
        if outcome.html is not None:
            self.pages[index] = outcome.html
        elif not outcome.result.reused:
            # Judged again with no report (its capture now unusable, its worker lost): the cached
            # page describes the captures as they were, and an UNUSABLE row linked to "PARITY, pass".
            self.pages.pop(index, None)
        self.results[index] = outcome.result
        print(f"[{self.done}/{len(self.cases)}] {progress_line(outcome.result)}", flush=True)

    def result(self, manifest: str, cluster: str, dashboard: str | None, seconds: float) -> GateResult:
        from sessions.gate.result import GateResult

        cases = [self.results[i] for i in range(len(self.cases))]
        created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return GateResult(manifest, cluster, dashboard, created, round(seconds, 3), cases)

    def write(self, gate: GateResult, json_out: str | None, html_out: str | None) -> str | None:
        """Each case's report into OUT-cases/ beside the HTML summary, then the summary and the
        JSON; why one could not be written, or None."""
        from sessions.gate.html_summary import render_gate_html
        from sessions.gate.result import dumps

        outputs: list[tuple[str | None, Callable[[], str]]] = []
        made: Path | None = None
        if html_out is not None:
            html_path, folder = Path(html_out), _cases_folder(html_out)
            pages = case_pages(html_out, gate.cases)
            made = None if folder.exists() else folder
            try:
                folder.mkdir(exist_ok=True)
            except OSError as exc:
                return f"cannot make {folder}: {exc.strerror or exc}"
            for index, (case, page) in enumerate(zip(gate.cases, pages)):
                if index in self.pages:
                    outputs.append((str(page), partial(str, self.pages[index])))
                    case.report = page.relative_to(html_path.parent).as_posix()
            outputs.append((html_out, partial(render_gate_html, gate)))
        outputs.append((json_out, partial(dumps, gate)))
        problem = write_outputs(outputs)
        if problem is not None and made is not None:
            with contextlib.suppress(OSError):  # the folder this run made, empty since nothing was written
                made.rmdir()
        return problem


def _cases_folder(html_out: str) -> Path:
    return Path(html_out).with_name(f"{Path(html_out).stem}-cases")


def _case_inputs(case: GateCase) -> dict[str, str | None]:
    """Every file a case reads, by what it is: its policy and profiles too, which --json or
    --html given their path replaced."""
    options = case.options
    named = {
        "native capture": case.native,
        "oracle capture": case.oracle,
        "tolerance policy": options.policy.source if options.policy is not None else None,
        "native profile": options.native_profile,
        "oracle profile": options.oracle_profile,
    }
    return {f"{what} of case {case.name!r}": path for what, path in named.items()}


def _cases_folder_problem(html_out: str, json_out: str | None) -> str | None:
    folder = _cases_folder(html_out)
    if os.path.lexists(folder) and not folder.is_dir():  # a dangling link too: making the folder failed after judging
        return f"--html {printable(html_out)}: its cases' reports go in {printable(str(folder))}, where something other than a folder is"
    if json_out is not None and Path(json_out).resolve() == folder.resolve():
        return f"--json {printable(json_out)} is where --html {printable(html_out)} puts its cases' reports: each output needs a place of its own"
    return None


def case_pages(html_out: str, cases: Sequence[GateCase | CaseResult]) -> list[Path]:
    """Where each case's own report goes: STEM-cases/NNN-NAME.html beside the summary STEM.html.
    Known before any case is judged, so that none of them can name an input."""
    folder = _cases_folder(html_out)
    return [folder / f"{index + 1:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', case.name)[:PAGE_NAME_CHARS]}.html" for index, case in enumerate(cases)]


PAGE_NAME_CHARS = 120
"""Characters of a case's name in its page's file name (its number keeps pages apart): a name of
thousands of characters, or a default name made of a long native path, was "File name too long",
and `--html` refused the whole gate."""


REASON_SHOWN = 60
"""Characters of an unusable case's reason in the gate's table."""


def _first_finding(c: CaseResult) -> str:
    """The first finding's key, else why the case fails or is unusable: a case failing a gate
    rule alone showed an empty cell beside its FAIL."""
    if c.first is not None:
        return c.first.key
    notes = c.notes()
    if not notes or c.passed:
        return ""
    reason = printable(notes[0])
    return reason if len(reason) <= REASON_SHOWN else reason[: REASON_SHOWN - 1] + "…"


def progress_line(c: CaseResult) -> str:
    """One finished case: name, word, where it first fails or why it fails the gate, and where it ran
    (a case's name is the manifest's text: its control characters are escaped)."""
    where = "cached" if c.reused else f"{c.seconds:.1f} s on {c.worker}" if c.worker else "no worker returned it"
    notes = [f"first {c.first.kind} at {c.first.key}"] if c.first is not None else []
    notes += c.notes()
    return printable("  ".join([c.name, c.word, *(["; ".join(notes)] if notes else []), f"({where})"]))


def render_text(gate: GateResult) -> str:
    """The table of every case in manifest order, then the summary line. A case failing without a
    finding (unusable, or a gate rule alone) shows why in its "first finding", cut to REASON_SHOWN
    characters (its progress line has it whole); below the table, what `report` would warn of."""
    rows = [("case", "verdict", "gate", "first finding (else why it fails)", "tokens", "EOS")]
    for c in gate.cases:
        tokens, eos = ("", "") if c.tokens is None else (c.tokens.compared_text(), c.tokens.eos_text())
        rows.append((printable(c.name), c.word, "pass" if c.passed else "FAIL", _first_finding(c), tokens, eos))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    warned = [printable(f"WARNING: {c.name}: {w}") for c in gate.cases for w in c.warnings]
    return "\n" + "\n".join(lines + ([""] + warned if warned else [])) + f"\n\n{gate.headline}\n"
