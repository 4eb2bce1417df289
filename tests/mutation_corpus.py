"""A seeded corpus of byte-mutated captures, and the process that runs the CLI over a share of it.

Run as `python -W error -m tests.mutation_corpus OUT.json BASE FILE...`: `validate --deep` over
all FILEs (one call: small files are checked in batches), then `report` of every file it
accepted against BASE; the outcome, both commands' output and this process's peak RSS (and
its children's) go to OUT.json. A crash of this process is itself a finding for the caller.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import resource
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, quantize

from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter

COMPRESSIONS = (None, "gzip", "lzf")
PROFILE = "llama.cpp"
CREATED = "2026-01-01T00:00:00+00:00"


def write_base(path: Path, compression: str | None) -> Path:
    """Two decode steps of a two-layer toy run: bfloat16, float16, float32 and q8_0 records, dispatch rows, tokens.

    Byte for byte the same on every run (a fixed creation time, each record's times its
    sequence number): a file that fails the corpus is the same file on the next run."""
    rng = np.random.default_rng(7)
    meta = CaptureMeta(role="native", engine_name="corpus", prompt="p" * 50, provenance={"seed": 7}, created_utc=CREATED)
    ticks = itertools.count(0, 2)
    with CaptureWriter(path, meta, compression=compression) as writer:
        for step in range(2):
            for layer in range(2):
                x = rng.standard_normal((4, 32)).astype(np.float32)
                writer.add_tensor(f"l_out-{layer}", x.astype(ml_dtypes.bfloat16), step=step, segment="decode", layer=layer, **_times(ticks))
                seq = writer.add_tensor(f"kqv_out-{layer}", x.astype(np.float16), step=step, segment="decode", layer=layer, **_times(ticks))
                writer.add_dispatch(
                    index_seq=seq, call=0, kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1,
                    q_rows=1, kv_len=3 + step, head_dim=8, primitive="fallback", t_start_ns=seq, t_end_ns=seq + 1,
                )  # fmt: skip
            blocks = quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
            writer.add_tensor("ffn_gate-0", blocks, step=step, segment="decode", layer=0, dtype="q8_0", logical_shape=(2, 64), **_times(ticks))
            writer.add_tensor("result_output", rng.standard_normal((1, 50)).astype(np.float32), step=step, segment="decode", **_times(ticks))
            writer.add_token(step=step, segment="decode", token_id=7, is_stop=step == 1)
            writer.end_step()
    return path


def _times(ticks: Iterator[int]) -> dict[str, int]:
    """The next record's start and end, counted instead of read from the clock."""
    start = next(ticks)
    return {"t_start_ns": start, "t_end_ns": start + 1}


def mutate(base: bytes, rng: np.random.Generator) -> bytes:
    """One mutation of a base file: a few bytes changed (7 in 10), 16 bytes zeroed (2 in 10), or a truncation.

    Offsets are drawn from the base's non-zero bytes: most of a small capture is the unused
    tail of the tables' first chunks, where a flip changes nothing a reader looks at.
    """
    data = bytearray(base)
    where = np.flatnonzero(np.frombuffer(base, np.uint8))
    kind = rng.integers(0, 10)
    if kind < 7:
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.choice(where))] = int(rng.integers(0, 256))
    elif kind < 9:
        at = min(int(rng.choice(where)), len(data) - 16)
        data[at : at + 16] = bytes(16)
    else:
        del data[int(rng.choice(where)) :]
    return bytes(data)


def write_corpus(folder: Path, count: int, seed: int) -> tuple[list[Path], Path]:
    """`count` mutated files (bases taken in turn) and the unmutated plain base they are compared with."""
    bases = [write_base(folder / f"base-{c or 'plain'}.h5", c) for c in COMPRESSIONS]
    images = [base.read_bytes() for base in bases]
    rng = np.random.default_rng(seed)
    files = []
    for i in range(count):
        path = folder / f"m{i:04d}.h5"
        path.write_bytes(mutate(images[i % len(images)], rng))
        files.append(path)
    return files, bases[0]


def _run(argv: list[str]) -> dict[str, object]:
    """One CLI call in this process, with its exit status and output; an exception is recorded, not raised."""
    from viewer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status: object = main(argv)
        except BaseException:  # noqa: BLE001  (the caller asserts there is none; it needs the traceback to say why)
            status = "exception"
            err.write(traceback.format_exc())
    return {"status": status, "out": out.getvalue(), "err": err.getvalue()}


def _own_peak_mib() -> int:
    """This process's peak RSS since its exec: Linux's VmHWM. `ru_maxrss` would also count the
    process it was forked from, a test worker of 800 MiB late in the suite. Elsewhere, ru_maxrss
    (bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) // 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024**2


def main(argv: list[str]) -> int:
    out, base, *files = argv
    validated = _run(["validate", "--deep", *files])
    accepted = re.findall(r"^(.+): valid \(", str(validated["out"]), re.M)
    reports = {
        path: _run(["report", "--no-cache", "--native-profile", PROFILE, "--oracle-profile", PROFILE, path, base])
        for path in accepted
    }
    usage = {"self_mib": _own_peak_mib(), "children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}
    Path(out).write_text(json.dumps({"validate": validated, "accepted": accepted, "reports": reports, "rss": usage}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
