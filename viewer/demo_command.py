"""`parity-xray demo`: generate the bundled demo captures, or open the viewer on them.

Generation is headless (backends), so `demo --generate DIR` works in CI; opening the viewer
imports Qt only when asked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sessions.commands.arguments import whole_number
from sessions.ctrl_c import raise_if_pressed
from sessions.file_room import FileUnwritable
from sessions.printable import printable
from sessions.progress import Progress

if TYPE_CHECKING:
    from backends.demo.cut_pairs import CutScenario
    from backends.engines.demo_scenarios import ExpectedVerdict, Scenario


SEED_MAX = 2**63 - 1
"""A capture keeps its seed as a 64-bit signed integer (docs/capture-format.md, root attribute `seed`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--generate",
        metavar="DIR",
        type=Path,
        help="write the demo capture pairs into DIR and exit (default: open the viewer on the default pair)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="only this scenario (repeatable with --generate; the viewer opens one); see --list",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and where each one diverges")
    parser.add_argument("--seed", type=whole_number(0, SEED_MAX), default=0, help="weights and prompt seed (default 0)")


def _generate(out_dir: Path, scenarios: list[str] | None, seed: int) -> dict[str, tuple[Path, Path]]:
    from backends.demo.generate import iter_generate

    work = iter_generate(out_dir, scenarios, seed)
    while True:
        try:
            step: Progress = next(work)
        except StopIteration as stop:
            return stop.value
        print(f"[{step.done}/{step.total}] {step.label}", file=sys.stderr)
        raise_if_pressed()


def _verdict_text(expected: "ExpectedVerdict") -> str:
    return expected.word + ("" if expected.key is None else f", first {expected.kind} at {expected.key}")


def _listing(demo_dir: Path, scenarios: dict[str, Scenario], cut: dict[str, "CutScenario"], llama: dict[str, str]) -> str:
    """Each scenario, the verdict its pair must get, and where its files are (or will be)."""
    from backends.demo.generate import pair_paths

    lines = [f"Demo scenarios; their captures live in {demo_dir} (written on first use).", ""]
    for name, scenario in scenarios.items():
        native, _ = pair_paths(demo_dir, name)
        state = "generated" if native.exists() else "not generated yet"
        lines.append(f"{name:20s} {_verdict_text(scenario.expected)} ({state})")
        lines.append(f"{'':20s} {scenario.description}")
    lines.append("")
    lines.append("One engine run twice, cut or batched differently (real runs; llama ones need the llama extra):")
    for name, cut_scenario in cut.items():
        lines.append(f"{name:24s} {_verdict_text(cut_scenario.expected)}")
        lines.append(f"{'':24s} {cut_scenario.description}")
    lines.append("")
    lines.append("Real llama.cpp vs MLX runs of a tiny model (need the llama extra; `demo --generate DIR --scenario NAME`):")
    lines += [f"{name:20s} GGUF {variant} weights" for name, variant in llama.items()]
    lines += ["", "Open one with `parity-xray demo --scenario NAME`; write the planted ones with `parity-xray demo --generate DIR`, any other with `--scenario NAME`."]
    return "\n".join(lines) + "\n"


def _not_demo_files(out_dir: Path, scenarios: list[str]) -> str | None:
    """Why the demo must not write into `out_dir`: a link or something other than a regular file
    where a demo file goes. Written by rename, the demo replaced a link to the user's capture
    with a file of its own; a regular file of a demo file's name is the last demo's, written over."""
    from backends.demo.generate import pair_paths
    from backends.engines.demo_model import WEIGHTS_FILE

    names = [out_dir / WEIGHTS_FILE, *(path for name in scenarios for path in pair_paths(out_dir, name))]
    for path in names:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            what = "a link" if path.is_symlink() else "not a regular file"
            return f"{printable(str(path))} is {what}; the demo writes its own file there: move it, or give --generate another folder"
    return None


def run(args: argparse.Namespace) -> int:
    from backends.demo.cut_pairs import CUT_SCENARIOS
    from backends.demo.generate import (
        DEFAULT_SCENARIO,
        SCENARIOS,
        default_demo_dir,
        pair_paths,
    )
    from backends.demo.llama_pairs import LLAMA_SCENARIOS

    known = [*SCENARIOS, *CUT_SCENARIOS, *LLAMA_SCENARIOS]
    unknown = sorted(set(args.scenario or ()) - set(known))
    if unknown:
        print(f"parity-xray demo: unknown scenario {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if args.list and args.generate is not None:
        print("parity-xray demo: --list only lists the scenarios, it writes nothing; give --generate DIR without it", file=sys.stderr)
        return 2
    if args.list:
        print(_listing(default_demo_dir(args.seed), SCENARIOS, CUT_SCENARIOS, LLAMA_SCENARIOS), end="")
        return 0
    if args.generate is not None:
        from backends.recorders.llama_nodes import RecorderError

        if args.generate.exists() and not args.generate.is_dir():
            print(f"parity-xray demo: --generate {args.generate} is not a folder", file=sys.stderr)
            return 2
        taken = _not_demo_files(args.generate, args.scenario or list(SCENARIOS))
        if taken:
            print(f"parity-xray demo: {taken}", file=sys.stderr)
            return 2
        try:
            pairs = _generate(args.generate, args.scenario, args.seed)
        except RecorderError as exc:  # a llama scenario whose llama.cpp run failed or crashed (in its own process)
            print(f"parity-xray demo: {exc}", file=sys.stderr)
            return 1
        except FileUnwritable as exc:  # names the file, and why
            print(f"parity-xray demo: {exc}", file=sys.stderr)
            return 2
        except (OSError, RuntimeError) as exc:  # RuntimeError: MLX's own failures
            print(f"parity-xray demo: cannot write the demo captures into {args.generate} ({getattr(exc, 'strerror', None) or exc})", file=sys.stderr)
            return 2
        for name, (native, oracle) in pairs.items():
            print(f"{name:20s} native {native}\n{'':20s} oracle {oracle}")
        return 0
    if len(args.scenario or ()) > 1:
        print("parity-xray demo: the viewer opens one scenario; repeat --scenario only with --generate DIR", file=sys.stderr)
        return 2
    from viewer.window_launch import EXIT_NO_WINDOW, window_refused

    if window_refused():  # said before generating: a minute of MLX, then no window, was the first contact
        return EXIT_NO_WINDOW
    demo_dir = default_demo_dir(args.seed)
    scenario = (args.scenario or [DEFAULT_SCENARIO])[0]
    native, oracle = pair_paths(demo_dir, scenario)
    if not (native.exists() and oracle.exists()):
        print(f"Generating the demo captures into {demo_dir} (once) ...", file=sys.stderr)
        _generate(demo_dir, None if scenario in SCENARIOS else [scenario], args.seed)
    from viewer.app import run_viewer

    return run_viewer([str(native), str(oracle)])
