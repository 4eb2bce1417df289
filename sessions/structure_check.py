"""The structural check of a capture, run in a child process the first time a file is opened.

libhdf5 is not safe on crafted input: byte-mutated files segfault it and hang it, and while it
hangs it holds the interpreter lock (GUIDE section 7). A thread is no protection, so the first
open of a file walks everything the viewer will later touch (root attributes, the three tables,
every index row's dataset and attributes) in a separate process with a wall-clock timeout and
an address-space limit. A crash or a hang there becomes a `Problem` naming the file, and the
caller carries on. Files that pass are remembered by (resolved path, size, mtime) so re-opening
them does not spawn another process.

Run as `python -m sessions.structure_check [--memory-budget BYTES] PATH`: prints one JSON
object with the problems found and what the file holds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sessions import capture_format as cf
from sessions.capture_reader import Capture, CaptureError, load_capture
from sessions.hdf5_safety import CHECK_TIMEOUT_S, DEFAULT_MEMORY_BUDGET, Problem

SHARDING_MIN_BYTES = 16 * 1024**2
MAX_SHARDS = 4
INTERPRETER_HEADROOM = 1536 * 1024**2
"""Address space the child's interpreter, numpy and libhdf5 need besides the read budget."""


@dataclass
class CheckReport:
    """What one structural check found: every problem, and what the file holds."""

    problems: list[Problem] = field(default_factory=list)
    complete: bool = False
    contents: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {"problems": [asdict(p) for p in self.problems], "complete": self.complete, "contents": self.contents}
        )

    @classmethod
    def from_json(cls, text: str) -> "CheckReport":
        data = json.loads(text)
        return cls(
            problems=[Problem(str(p["location"]), str(p["problem"])) for p in data["problems"]],
            complete=bool(data["complete"]),
            contents=str(data["contents"]),
        )


def check_here(path: Path, memory_budget: int = DEFAULT_MEMORY_BUDGET, shard: int = 0, shards: int = 1) -> CheckReport:
    """Check a file in this process, collecting every problem (each child runs this).

    With several shards, shard i checks the i-th contiguous slice of index rows' datasets;
    shard 0 also reports the row-level and cross-table problems, so merging the shards' reports
    in shard order lists problems in file order.
    """
    try:
        capture = load_capture(path, memory_budget=memory_budget)
    except CaptureError as exc:
        return CheckReport([Problem(exc.location, exc.problem)] if shard == 0 else [])
    with capture:
        report = CheckReport(list(capture.row_problems) if shard == 0 else [], capture.complete, capture.describe())
        n = len(capture.records)
        start, stop = n * shard // shards, n * (shard + 1) // shards
        bad_rows = capture.bad_rows.tolist()
        for record in capture.records[start:stop]:
            if not bad_rows[record.seq]:
                report.problems += capture.record_problems(record)
        if shard == 0:
            report.problems += table_problems(capture)
    return report


def table_problems(capture: Capture) -> list[Problem]:
    """Cross-table problems: dispatch rows pointing nowhere, unknown kinds, broken occurrence counts."""
    found: list[Problem] = []
    seen: dict[tuple[int, str, int, str], int] = {}
    for record in capture.records:
        key = (record.step, record.segment, record.layer, record.name)
        expected = seen.get(key, 0)
        if record.occurrence != expected:
            found.append(
                Problem(
                    f"/index row {record.seq} ({record.name})",
                    f"occurrence is {record.occurrence}; {expected} earlier rows have this name in step "
                    f"{record.step}, segment {record.segment!r}, layer {record.layer}, so it should be {expected}",
                )
            )
        seen[key] = expected + 1
        if record.t_end_ns < record.t_start_ns:
            found.append(Problem(f"/index row {record.seq} ({record.name})", "ends before it starts"))
    n_records = len(capture.records)
    for row, event in enumerate(capture.dispatch):
        where = f"/dispatch row {row}"
        if not 0 <= int(event["index_seq"]) < n_records:
            found.append(Problem(where, f"index_seq {int(event['index_seq'])} is not a record (0..{n_records - 1})"))
        mask = cf.decode_field(event["mask_kind"])
        if mask not in cf.MASK_KINDS:
            found.append(Problem(where, f"mask_kind {mask!r} is not one of {cf.MASK_KINDS}"))
        for column, allowed in (("primitive", cf.PRIMITIVES), ("metal_primitive", cf.METAL_PRIMITIVES)):
            value = cf.decode_field(event[column])
            if value not in allowed:
                found.append(Problem(where, f"{column} {value!r} is not one of {allowed}"))
    for row, token in enumerate(capture.tokens):
        if int(token["is_stop"]) not in (0, 1):
            found.append(Problem(f"/tokens row {row}", f"is_stop is {int(token['is_stop'])}; it is 0 or 1"))
    return found


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def shard_count(path: Path) -> int:
    """How many children check a file at once: one for small files, up to four cores' worth for large ones.

    Opening each dataset's header costs libhdf5 about 0.1 ms, so a 50,000-record capture takes
    seconds on one core; small files are not worth the extra interpreter start-ups.
    """
    if path.stat().st_size < SHARDING_MIN_BYTES:
        return 1
    return max(1, min(MAX_SHARDS, os.cpu_count() or 1))


def _child_command(path: Path, memory_budget: int, shard: int, shards: int) -> list[str]:
    return [
        sys.executable, "-m", "sessions.structure_check",
        "--memory-budget", str(memory_budget), "--shard", f"{shard}/{shards}", str(path),
    ]  # fmt: skip


def _verdict(returncode: int, stdout: str, stderr: str) -> CheckReport:
    where = "structure check"
    if returncode < 0:
        return CheckReport(
            [
                Problem(
                    where,
                    f"reading the file's structure crashed the checking process ({_signal_name(-returncode)}); "
                    "the file is corrupt or crafted",
                )
            ]
        )
    try:
        return CheckReport.from_json(stdout.strip().splitlines()[-1])
    except (ValueError, KeyError, IndexError, TypeError):
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        return CheckReport([Problem(where, f"the checking process failed (exit {returncode}: {tail[0][:300]})")])


def check_in_child(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> CheckReport:
    """Run the check in child processes; a crash or hang of any of them is itself the finding."""
    env = dict(os.environ, HDF5_PLUGIN_PRELOAD="::", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    shards = shard_count(path)
    children = [
        subprocess.Popen(
            _child_command(path, memory_budget, shard, shards),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for shard in range(shards)
    ]
    deadline = time.monotonic() + timeout_s
    merged = CheckReport()
    try:
        for shard, child in enumerate(children):
            try:
                stdout, stderr = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return CheckReport(
                    [
                        Problem(
                            "structure check",
                            f"reading the file's structure did not finish within {timeout_s:g} s (libhdf5 hangs on it)",
                        )
                    ]
                )
            report = _verdict(child.returncode, stdout, stderr)
            if shard == 0:
                merged.complete, merged.contents = report.complete, report.contents
            merged.problems += report.problems
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.communicate()
    return merged


_passed: set[tuple[str, int, int, int]] = set()
_passed_lock = threading.Lock()


def _identity(path: Path, memory_budget: int) -> tuple[str, int, int, int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, memory_budget)


def already_checked(path: Path, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> bool:
    """Whether this file, as it is now on disk, passed a check in this process."""
    with _passed_lock:
        return _identity(path, memory_budget) in _passed


def ensure_checked(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> Problem | None:
    """The first problem of a file (with a count of the rest), or None once it passed; passes are cached."""
    identity = _identity(path, memory_budget)
    with _passed_lock:
        if identity in _passed:
            return None
    report = check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s)
    if not report.problems:
        with _passed_lock:
            _passed.add(identity)
        return None
    first = report.problems[0]
    more = len(report.problems) - 1
    if more:
        return Problem(first.location, f"{first.problem} (and {more} more; `parity-xray validate` lists them)")
    return first


def _limit_address_space(memory_budget: int) -> None:
    limit = memory_budget + INTERPRETER_HEADROOM
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessions.structure_check")
    parser.add_argument("--memory-budget", type=int, default=DEFAULT_MEMORY_BUDGET)
    parser.add_argument("--shard", default="0/1", help="I/N: check the I-th of N slices of the index")
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    shard, shards = (int(part) for part in args.shard.split("/"))
    _limit_address_space(args.memory_budget)
    try:
        report = check_here(args.path, args.memory_budget, shard, shards)
    except MemoryError:
        report = CheckReport([Problem("structure check", "reading the file's structure ran out of its memory limit")])
    except Exception as exc:  # noqa: BLE001  (any libhdf5 failure on a bad file is a finding, not a crash)
        report = CheckReport([Problem("file", f"unreadable structure ({type(exc).__name__}: {exc})")])
    print(report.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
