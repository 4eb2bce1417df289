"""Every benchmark still starts: a module moved or renamed breaks no figure the README quotes.

Benchmarks are not run by the suite (their figures are not test results), so nothing else
would notice a broken import until someone needs the figure. `--help` imports everything a
benchmark needs and exits before the work.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sessions.child_env import PROJECT_ROOT, child_env

BENCHMARKS = sorted((PROJECT_ROOT / "benchmarks").glob("*.py"))


def test_the_benchmarks_folder_has_the_benchmarks_the_docs_name() -> None:
    assert {path.name for path in BENCHMARKS} >= {"bench_capture_overhead.py", "bench_open_index.py", "bench_report.py", "stress_killed_writer.py"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_imports_what_it_needs_and_explains_itself(script: Path) -> None:
    done = subprocess.run([sys.executable, "-W", "error", str(script), "--help"], cwd=PROJECT_ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: ")
