"""Three hundred byte-mutated captures: every verdict is a clean one, and "valid" means readable.

A seeded corpus (tests/mutation_corpus.py) of flips, zeroed runs and truncations of three real
captures (contiguous, gzip, LZF) goes through `validate --deep` in one call, and every file it
accepts through `report` against the unmutated capture, in two processes side by side (one per
core). Each must end with its documented exit status, print no traceback or Python exception
text, and stay within a bounded memory; a file `validate --deep` accepted must compare without
error. Deselect with `-m "not mutation_corpus"`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.child_env import PROJECT_ROOT, child_env
from tests.mutation_corpus import write_corpus

FILES = 300
SEED = 13
WORKERS = 2
PEAK_RSS_MIB = 300
"""Whatever a mutated file declares, no process reading it may grow past this; the corpus peaks
at about 70 MiB. Two earlier runs measured 409 and 946 MiB: `ru_maxrss`, which also counts the
test process the reader was forked from; the reader's own peak is now measured from its exec."""
PYTHON_TEXT = re.compile(r"Traceback|Error:|Warning:|RecursionError|invalid literal for int")


@pytest.mark.mutation_corpus
def test_every_mutated_capture_gets_a_clean_verdict_and_valid_means_readable(tmp_path: Path) -> None:
    files, base = write_corpus(tmp_path, FILES, SEED)
    outcomes = [tmp_path / f"outcome-{i}.json" for i in range(WORKERS)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-W", "error", "-m", "tests.mutation_corpus", str(out), str(base), *map(str, files[i::WORKERS])],
            cwd=PROJECT_ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, out in enumerate(outcomes)
    ]
    finished = [worker.communicate(timeout=300) for worker in workers]
    accepted = 0
    for worker, (stdout, stderr), out in zip(workers, finished, outcomes):
        assert (worker.returncode, stdout, stderr) == (0, "", "")
        outcome = json.loads(out.read_text())
        validated = outcome["validate"]
        assert validated["status"] in (0, 2) and validated["err"] == ""
        lines = validated["out"].splitlines()
        verdicts = [line for line in lines if not line.startswith("  ")]
        assert len(verdicts) == len(files[outcomes.index(out) :: WORKERS])
        assert all(re.fullmatch(r".+: (valid \(.*\)|invalid \(\d+ problems?\))", line) for line in verdicts)
        assert not [line for line in lines if PYTHON_TEXT.search(line)]
        for path, report in outcome["reports"].items():
            assert (report["status"], report["err"]) in ((0, ""), (1, "")), (path, report["err"])
        assert outcome["rss"]["self_mib"] < PEAK_RSS_MIB and outcome["rss"]["children_mib"] < PEAK_RSS_MIB, outcome["rss"]
        accepted += len(outcome["accepted"])
    assert FILES // 10 < accepted < FILES, "the corpus holds both files that stay valid and files that do not"
