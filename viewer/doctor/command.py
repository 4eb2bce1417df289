"""`parity-xray doctor [--for viewer|demo|llama|all]`: check what a run needs, print the exact fix.

    parity-xray doctor               # everything: Qt and its system libraries, display, MLX, llama.cpp, caches
    parity-xray doctor --for viewer  # only what the window needs (`make demo` runs `--for demo` first)

Exit status: 0 when everything the purpose needs is there, 1 otherwise (the lines marked PROBLEM
say what and how to fix it). An optional part that is not installed (llama-cpp-python) is not
a problem unless `--for llama` asks for it. Headless: it never imports Qt into this process.
"""

from __future__ import annotations

import argparse
import os

from viewer.doctor.checks import OPTIONAL, PROBLEM, Finding, run_checks

EXIT_OK = 0
EXIT_PROBLEM = 1
PURPOSES: dict[str, frozenset[str]] = {
    "all": frozenset({"qt", "display", "mlx", "llama", "cache"}),
    "viewer": frozenset({"qt", "display", "cache"}),
    "demo": frozenset({"qt", "display", "mlx", "cache"}),
    "llama": frozenset({"llama"}),  # record llama caches only a weights hash, and a cache it cannot write means hashing again
}
"""What each purpose needs, by check area."""
PURPOSE_WORDS = {"all": "everything", "viewer": "the viewer", "demo": "the demo", "llama": "`record llama`"}
"""Each purpose as the heading names it."""
WIDTH = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--for", dest="purpose", choices=tuple(PURPOSES), default="all",
                        help="check only what this needs (default: all)")  # fmt: skip


def blocking(findings: list[Finding], purpose: str) -> list[Finding]:
    """The findings that stop `purpose`: problems, and a missing optional part the purpose is about."""
    return [f for f in findings if f.status == PROBLEM or (f.status == OPTIONAL and f.area == purpose)]


def render(findings: list[Finding]) -> str:
    lines = []
    for finding in findings:
        lines.append(f"  {finding.status:<9}{finding.topic:<{WIDTH}}{finding.detail}")
        lines += [f"  {'':<9}{'':<{WIDTH}}{'fix: ' if n == 0 else '':<5}{fix}" for n, fix in enumerate(finding.fix)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    findings = run_checks(PURPOSES[args.purpose], os.environ)
    print(f"parity-xray doctor: what {PURPOSE_WORDS[args.purpose]} needs on this machine\n")
    print(render(findings))
    stopping = blocking(findings, args.purpose)
    if not stopping:
        print("\nAll set.")
        return EXIT_OK
    count = len(stopping)
    print(f"\n{count} problem{'s' if count > 1 else ''} to fix first (the `fix:` lines above).")
    return EXIT_PROBLEM
