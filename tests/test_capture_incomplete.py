"""A writer that dies mid-run leaves a file that opens, shows its finished steps, and says it is unfinished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sessions.capture_meta import CaptureMeta
from sessions.capture_reader import open_capture
from sessions.capture_writer import CaptureWriter

ROWS_PER_STEP = 6
ROOT = Path(__file__).resolve().parent.parent

ENDLESS_WRITER = f"""
import sys
import numpy as np
import sessions
from sessions.capture_meta import CaptureMeta
from sessions.capture_writer import CaptureWriter

writer = CaptureWriter(sys.argv[1], CaptureMeta(role="native", engine_name="killed"), compression=sys.argv[2] or None)
step = 0
while True:
    for i in range({ROWS_PER_STEP}):
        writer.add_tensor(f"l_out-{{i}}", np.full((8, 64), step * 100 + i, np.float32), step=step, segment="decode", layer=i)
    writer.add_token(step=step, segment="decode", token_id=step, is_stop=False)
    writer.end_step()
    print(step, flush=True)
    step += 1
"""


def run_and_kill(path: Path, steps_before_kill: int, extra_delay_s: float, compression: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with subprocess.Popen(
        [sys.executable, "-c", ENDLESS_WRITER, str(path), compression], stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        assert child.stdout is not None
        for _ in range(steps_before_kill):
            assert child.stdout.readline(), "the writer stopped before it was killed"
        time.sleep(extra_delay_s)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("steps_before_kill", "extra_delay_s", "compression"),
    [(3, 0.0, ""), (4, 0.003, ""), (5, 0.011, "gzip"), (3, 0.027, "lzf"), (6, 0.05, "")],
)
def test_killed_writer_leaves_a_readable_clearly_incomplete_prefix(
    tmp_path: Path, steps_before_kill: int, extra_delay_s: float, compression: str
) -> None:
    path = tmp_path / "killed.h5"
    run_and_kill(path, steps_before_kill, extra_delay_s, compression)
    with open_capture(path) as capture:
        assert capture.complete is False
        steps = len(capture.records) // ROWS_PER_STEP
        assert steps >= steps_before_kill
        assert len(capture.records) == steps * ROWS_PER_STEP, "a torn step is shown"
        assert len(capture.tokens) == steps
        for record in capture.records:
            expected = record.step * 100 + int(record.name.split("-")[1])
            assert capture.read_values(record).tolist() == np.full((8, 64), expected, np.float32).tolist()
        assert capture.describe() == (
            f"incomplete: the writer did not finish; it holds {steps * ROWS_PER_STEP} records, "
            f"{steps} token steps, {steps} tokens, 0 dispatch events"
        )


def test_abandoned_writer_file_is_incomplete_and_a_closed_one_complete(tmp_path: Path) -> None:
    for finish, complete in (("abandon", False), ("close", True)):
        path = tmp_path / f"{finish}.h5"
        writer = CaptureWriter(path, CaptureMeta(role="oracle"))
        writer.add_tensor("x", np.zeros(3, np.float32), step=0, segment="decode")
        writer.end_step()
        writer.add_tensor("x", np.zeros(3, np.float32), step=1, segment="decode")
        getattr(writer, finish)()
        with open_capture(path) as capture:
            assert capture.complete is complete
            assert len(capture.records) == 2
            assert capture.describe().startswith("incomplete: the writer did not finish") is not complete
