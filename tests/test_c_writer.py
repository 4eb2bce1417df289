"""docs/examples/write_capture.c, compiled against the libhdf5 on this machine, writes a capture that
`validate --deep` accepts and `report` finds bit-identical to the same run written by CaptureWriter.

The format is normative for engines that link libhdf5 alone; this keeps the C example (and the
recipes docs/capture-format.md gives for it) honest. Skipped where no libhdf5 headers are installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.child_env import PROJECT_ROOT
from viewer.cli import main

SOURCE = PROJECT_ROOT / "docs" / "examples" / "write_capture.c"
STEPS, ROWS, COLS, VOCAB = 3, 4, 64, 50
"""As the C program's #defines."""


def compile_command(out: Path) -> list[str] | None:
    """h5cc where HDF5 ships its wrapper, else cc with pkg-config's flags; None without libhdf5 headers."""
    if shutil.which("h5cc"):
        return ["h5cc", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE)]
    if shutil.which("cc") and shutil.which("pkg-config"):
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "hdf5"], capture_output=True, text=True)
        if flags.returncode == 0:
            return ["cc", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE), *flags.stdout.split()]
    return None


def python_twin(path: Path) -> None:
    """The C program's run, value for value, through the reference writer."""
    meta = CaptureMeta(role="oracle", engine_name="python-twin", prompt="the quick brown fox " * 5000)
    with CaptureWriter(path, meta) as writer:
        for step in range(STEPS):
            segment = "prefill" if step == 0 else "decode"
            i = np.arange(ROWS * COLS)
            bf16 = (0x3F80 + 7 * i + step).astype(np.uint16).reshape(ROWS, COLS)
            half = (0x3C00 + 3 * i + step).astype(np.uint16).view(np.float16).reshape(ROWS, COLS)
            logits = ((np.arange(VOCAB) - step) / np.float32(8)).astype(np.float32).reshape(1, VOCAB)
            writer.add_tensor("l_out-0", bf16, step=step, segment=segment, layer=0, dtype="bfloat16")
            sdpa = writer.add_tensor("kqv_out-0", half, step=step, segment=segment, layer=0)
            writer.add_tensor("result_output", logits, step=step, segment=segment)
            writer.add_dispatch(
                index_seq=sdpa, call=0, kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1,
                q_rows=1, kv_len=3 + step, head_dim=16, dtype="float16", primitive="fallback",
            )  # fmt: skip
            writer.add_token(step=step, segment=segment, token_id=100 + step, is_stop=step == STEPS - 1)
            writer.end_step()


def test_the_c_example_writes_a_valid_capture_bit_identical_to_its_python_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "write_capture"
    command = compile_command(binary)
    if command is None:
        pytest.skip("no libhdf5 headers (h5cc, or cc with pkg-config hdf5): install libhdf5-dev to compile the C example")
    built = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)  # h5cc leaves its .o in the working folder
    assert built.returncode == 0, built.stderr
    written = tmp_path / "from-c.h5"
    ran = subprocess.run([str(binary), str(written)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "from-c.h5.partial").exists()
    twin = tmp_path / "from-python.h5"
    python_twin(twin)
    assert main(["validate", "--deep", str(written)]) == 0
    assert capsys.readouterr().out == f"{written}: valid (9 records, 3 token steps, 3 tokens, 3 dispatch events)\n"
    assert main(["report", str(written), str(twin)]) == 0
    out = capsys.readouterr().out
    assert "\nPARITY: " in out and "First finding: none" in out and "ops        9 aligned (9 bit-exact)" in out
