"""`parity-xray diagnose NATIVE ORACLE [--op KEY | --first N | --all]`: say why the runs part.

Classifies the differing ops as local (computes differently by itself) or inherited (only
passes on different inputs), names the arithmetic contract each local op ran by reproducing
its bits with the candidate registry, and with --all measures how much of the final logits'
error each local op explains (docs/diagnosis.md).

Exit codes: 0 every local op found is reproduced exactly by a candidate (or there is nothing
to diagnose); 1 a local op has no exact reproduction, or an op could not be classified (a stage an op that
was classified computes, such as llama.cpp's attention scores inside sdpa, does not count);
2 it could not run (a missing file, a bad key), with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from backends.diagnosis.document import render_html, render_text, to_dict
from backends.diagnosis.run import DiagnoseOptions, Diagnosis, iter_diagnose
from backends.rerun.inputs import (
    RerunInputError,
    files_named,
    files_read,
)
from backends.rerun.weights import named_weights_problem
from sessions.capture.opening import open_complete_capture
from sessions.capture.reader import CaptureError
from sessions.commands.arguments import (
    add_align_argument,
    end_unusable,
    non_empty,
    output_problem,
    whole_number,
    write_outputs,
)
from sessions.compare.key import OpKey
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import ProfileError
from sessions.compare.result_cache import iter_compare_cached
from sessions.ctrl_c import raise_if_pressed
from sessions.progress import Progress, ProgressGenerator, run_to_end

EXIT_EXPLAINED, EXIT_UNEXPLAINED, EXIT_UNUSABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("native", type=non_empty, help="capture of the engine under test")
    parser.add_argument("oracle", type=non_empty, help="capture of the reference engine")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--op", metavar="KEY", help="diagnose one op, e.g. 0:visual:0:sdpa")
    scope.add_argument("--first", type=whole_number(1), metavar="N", help="walk the ops whose bits differ until N local ones are found (default 1)")
    scope.add_argument("--all", action="store_true", help="classify every op whose bits differ and measure each local op's share of the final logits error")
    parser.add_argument("--no-budget", action="store_true", help="with --all: skip the replays that share out the final logits error")
    parser.add_argument("--json", type=non_empty, metavar="OUT", help="also write the diagnosis as JSON (docs/diagnosis.md)")
    parser.add_argument("--html", type=non_empty, metavar="OUT", help="also write a self-contained HTML page")
    parser.add_argument("--weights", type=non_empty, metavar="FILE", help="safetensors or GGUF weights for the reruns (default: the file each capture references)")
    parser.add_argument("--verbose", action="store_true", help="list the candidates at every local op, not only the first")
    parser.add_argument("--native-profile", type=non_empty, help="built-in profile name or TOML path (default: detected)")
    parser.add_argument("--oracle-profile", type=non_empty, help="built-in profile name or TOML path (default: detected)")
    add_align_argument(parser)


def options_from(args: argparse.Namespace) -> DiagnoseOptions:
    weights = args.weights
    if args.op is not None:
        return DiagnoseOptions(mode="op", key=OpKey.parse(args.op), weights_path=weights)
    if args.all:
        return DiagnoseOptions(mode="all", budget=not args.no_budget, weights_path=weights)
    return DiagnoseOptions(mode="first", first=1 if args.first is None else args.first, weights_path=weights)


def exit_code(diagnosis: Diagnosis) -> int:
    """1 also for a failing comparison whose first finding no rerun explains (records without a
    partner, tokens alone, `Diagnosis.unexplained`): a CI step read exit 0 as explained."""
    unexplained = any(op.native_ran is None for op in diagnosis.local_chain) or bool(diagnosis.unexplained)
    return EXIT_UNEXPLAINED if unexplained or diagnosis.open_ops else EXIT_EXPLAINED


def _with_progress(work: ProgressGenerator[Diagnosis]) -> Diagnosis:
    """Drive the diagnosis, telling a person on a terminal what it is doing (stderr, one line)."""
    live = sys.stderr.isatty()
    while True:
        try:
            step = next(work)
        except StopIteration as done:
            if live:
                print(" " * 79, end="\r", file=sys.stderr)
            return done.value  # type: ignore[no-any-return]
        if live and isinstance(step, Progress):
            print(f"[{step.done}/{step.total}] {step.label}"[:79].ljust(79), end="\r", file=sys.stderr)
        raise_if_pressed()


def run(args: argparse.Namespace) -> int:
    outputs = {"--json": args.json, "--html": args.html}
    inputs = files_named(args.native, args.oracle, args.weights, (args.native_profile, args.oracle_profile))

    def unusable(message: str) -> int:
        return end_unusable("diagnose", message, outputs, inputs)  # `inputs` as known when it ends

    if args.no_budget and not args.all:
        return unusable("--no-budget goes with --all (only --all shares out the final error)")
    named = named_weights_problem(args.weights)
    if named is not None:
        return unusable(named)
    try:
        options = options_from(args)
        compare = CompareOptions(native_profile=args.native_profile, oracle_profile=args.oracle_profile, alignment=args.align)
        with open_complete_capture(args.native) as native, open_complete_capture(args.oracle) as oracle:
            inputs = files_read(native, oracle, args.weights, (args.native_profile, args.oracle_profile))
            clash = output_problem(outputs, inputs)
            if clash is not None:
                raise ValueError(clash)
            comparison = run_to_end(iter_compare_cached(native, oracle, compare))
            diagnosis = _with_progress(iter_diagnose(native, oracle, comparison, options))
    except (RerunInputError, CaptureError, ProfileError, ValueError, OSError) as exc:
        return unusable(str(exc))
    problem = write_outputs(  # before the text: see `report`
        [(args.json, lambda: json.dumps(to_dict(diagnosis), indent=1, allow_nan=False)), (args.html, lambda: render_html(diagnosis))]
    )
    print(render_text(diagnosis, verbose=args.verbose))
    if problem is not None:
        return unusable(problem)
    return exit_code(diagnosis)
