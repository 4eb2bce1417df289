"""`parity-xray report NATIVE ORACLE`: the headless comparison CI pipelines run.

Exit codes: 0 parity, 1 divergence, 2 unusable input (missing file, not a capture, hostile
or incomplete capture, unusable profile) with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.capture.read_ahead import ReadAhead
from sessions.commands.arguments import (
    add_align_argument,
    end_unusable,
    non_empty,
    output_problem,
    tolerance_bound,
    ulp_bound,
    whole_number,
    write_outputs,
)
from sessions.compare.verdict import EXIT_UNUSABLE
from sessions.machine import too_many_workers
from sessions.printable import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sessions.capture.reader import Capture
    from sessions.investigation.model import Investigation

HEAD_START_BYTES = 128 * 1024 * 1024
"""How much of each capture the kernel is asked to start reading before anything else runs:
about what the disk fetches while imports and checks run. Medians of 6 runs on a 1 GB pair,
captures cold and libraries warm: no head start 0.91 s, 128 MiB 0.76 s, 256 MiB 0.89 s (a
larger one delays the imports' own reads)."""
HEAD_START_STEP = 16 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("native", nargs="?", type=non_empty, help="capture of the engine under test")
    parser.add_argument("oracle", nargs="?", type=non_empty, help="capture of the reference engine")
    parser.add_argument("--json", type=non_empty, metavar="OUT", help="also write the report as JSON (docs/report-json.md)")
    parser.add_argument("--html", type=non_empty, metavar="OUT", help="also write a self-contained HTML report (with --session: its bookmarks and notes)")
    parser.add_argument("--session", type=non_empty, metavar="FILE.xray", help="compare the pair a saved session names, with its profiles and tolerance")
    parser.add_argument("--atol", type=tolerance_bound, help="absolute tolerance: |native - oracle| <= atol + rtol * |oracle| (0: no bound; every bound given must hold; none: bit-exact)")
    parser.add_argument("--rtol", type=tolerance_bound, help="relative tolerance, in the same bound as --atol (0: no bound; every bound given must hold; none: bit-exact)")
    parser.add_argument("--max-ulp", type=ulp_bound, help="ULP tolerance: at most this many representable steps apart (0: no bound; every bound given must hold; none: bit-exact)")
    parser.add_argument("--tolerance-policy", type=non_empty, metavar="POLICY.toml", help="per-op, per-dtype tolerances (docs/tolerance-policy.md); its rules win over --atol/--rtol/--max-ulp")
    parser.add_argument("--native-profile", type=non_empty, help="built-in profile name or TOML path (default: detected)")
    parser.add_argument("--oracle-profile", type=non_empty, help="built-in profile name or TOML path (default: detected)")
    add_align_argument(parser)
    parser.add_argument(
        "--workers", type=whole_number(0), default=0, metavar="N",
        help="processes comparing at most at once (0, the default: one per core, up to 16; at most 4 per core); "
        "extra worker processes start only when the remaining work would take this process over a second. Also how many threads "
        "check stored bytes (default: one per core); 1 checks them in this process's own thread",
    )
    parser.add_argument("--top", type=whole_number(1), default=10, metavar="N", help="how many worst ops to list (default 10)")
    parser.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    parser.add_argument("--full", action="store_true", help="also list provenance field by field, every contract finding, the error growth and every token step")


def _head_start(paths: tuple[str, str]) -> ReadAhead:
    """Start the disk on the first HEAD_START_BYTES of both files, interleaved as the comparison
    reads them, before anything else runs.

    Imports, structure checks and alignment take a few hundred milliseconds before the first
    tensor byte is compared; captures are written in execution order, the order they are
    compared in, so their heads are read first. The advice stops when the report is done
    (on a sidecar-cache hit, almost at once).
    """
    spans = [
        (path, offset, HEAD_START_STEP)
        for offset in range(0, HEAD_START_BYTES, HEAD_START_STEP)
        for path in paths
    ]
    return ReadAhead(spans, window=2 * HEAD_START_BYTES)


def _check_both(paths: tuple[str, str]) -> None:
    """Run the two files' structure checks (child processes) side by side instead of one after
    the other; `open_capture` then finds them passed. A failure is reported by `open_capture`."""
    from concurrent.futures import ThreadPoolExecutor

    from sessions.capture.structure_check import ensure_checked

    existing = [Path(p) for p in paths if Path(p).is_file()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(ensure_checked, existing))


def _unusable(args: argparse.Namespace, message: str) -> int:
    """Exit 2 with one line on stderr, leaving no report behind: a JSON or HTML file an earlier run
    wrote at the paths asked for is removed, so a CI step reading it never takes the last
    pair's PARITY for this one's."""
    return end_unusable("report", message, _outputs(args), _inputs(args))


def _outputs(args: argparse.Namespace) -> dict[str, str | None]:
    return {"--json": getattr(args, "json", None), "--html": getattr(args, "html", None)}


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """Every file the report reads, by what it is: none of them is ever written or removed."""
    return {
        "native capture": args.native,
        "oracle capture": args.oracle,
        "session": getattr(args, "session", None),
        "tolerance policy": getattr(args, "tolerance_policy", None),
        "native profile": args.native_profile,
        "oracle profile": args.oracle_profile,
    }


def run(args: argparse.Namespace) -> int:
    clash = output_problem(_outputs(args), _inputs(args)) or (too_many_workers(args.workers) if args.workers else None)
    if clash is not None:
        return _unusable(args, clash)
    session = None
    if getattr(args, "session", None):
        from sessions.investigation.session_report import (
            SessionReportError,
            apply_session,
        )

        try:
            session, note = apply_session(args)
        except SessionReportError as exc:
            return _unusable(args, f"unusable input: {exc}")
        if note is not None:
            print(f"parity-xray report: note: {printable(note)}", file=sys.stderr)
        clash = output_problem(_outputs(args), _inputs(args))  # the session's captures and policy are inputs too
        if clash is not None:
            return _unusable(args, clash)
    elif args.native is None or args.oracle is None:
        return _unusable(args, "give NATIVE ORACLE, or --session FILE.xray")
    from sessions.gc_pause import garbage_collection_paused

    # The process ends with the report: a collection would only walk the comparison's objects
    # again, and a diverged run's are millions (a cache hit of 96,000 differing pairs spent
    # more than half its time in the collector).
    with _head_start((args.native, args.oracle)), garbage_collection_paused():
        return _report(args, session)


def _report(args: argparse.Namespace, session: Investigation | None = None) -> int:
    # Imported after the head start, so the disk works while numpy and h5py load.
    from sessions.capture.opening import open_complete_capture
    from sessions.capture.reader import CaptureError
    from sessions.compare.comparison import iter_compare
    from sessions.compare.document import json_pieces
    from sessions.compare.layout_transform import LayoutError
    from sessions.compare.options import CompareOptions
    from sessions.compare.profiles import ProfileError
    from sessions.compare.result_cache import iter_compare_cached
    from sessions.compare.tolerance_policy import (
        PolicyError,
        load_policy,
        with_op_rules,
    )
    from sessions.progress import run_to_end
    from sessions.report.text import render

    try:
        policy = load_policy(args.tolerance_policy) if getattr(args, "tolerance_policy", None) else None
    except PolicyError as exc:
        return _unusable(args, f"unusable input: {exc}")
    policy = with_op_rules(policy, getattr(args, "op_tolerances", {}), f"session {args.session}")
    options = CompareOptions(
        policy=policy,
        atol=args.atol,
        rtol=args.rtol,
        max_ulp=args.max_ulp,
        native_profile=args.native_profile,
        oracle_profile=args.oracle_profile,
        alignment=getattr(args, "align", "auto"),
        workers=getattr(args, "workers", 0),
        overrides=getattr(args, "overrides", ()),
    )
    captures: list[Capture] = []
    try:
        _check_both((args.native, args.oracle))
        captures.append(open_complete_capture(args.native))
        captures.append(open_complete_capture(args.oracle))
        work = (
            iter_compare(captures[0], captures[1], options)
            if args.no_cache
            else iter_compare_cached(captures[0], captures[1], options)
        )
        comparison = run_to_end(work)
    except (CaptureError, ProfileError, LayoutError) as exc:
        return _unusable(args, f"unusable input: {exc}")
    finally:
        for capture in captures:
            capture.close()
    outputs: list[tuple[str, Callable[[], str | Iterable[str]]]] = []
    if args.json:
        outputs.append((args.json, lambda: json_pieces(comparison)))
    if getattr(args, "html", None):
        from sessions.report.html_page import render_html

        outputs.append((args.html, lambda: render_html(comparison, session)))
    # The documents first: printed first, a closed pipe (`| head`) left the last run's JSON in
    # their place, which CI then read as this run's.
    problem = write_outputs(outputs)
    sys.stdout.write(render(comparison, args.top, full=args.full))
    if problem is not None:
        print(f"parity-xray report: {problem}", file=sys.stderr)
        return EXIT_UNUSABLE
    return comparison.verdict.exit_code
