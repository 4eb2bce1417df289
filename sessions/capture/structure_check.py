"""The structural check of a capture, run in a child process the first time a file is opened.

libhdf5 is not safe on crafted input: byte-mutated files segfault it and hang it, and while it
hangs it holds the interpreter lock (GUIDE section 7). A thread is no protection, so the first
open of a file walks everything the viewer will later touch (root attributes, the three tables,
every index row's dataset and attributes) in a separate process with a wall-clock timeout and
an address-space limit. A crash or a hang there becomes a `Problem` naming the file, and the
caller carries on. Files that pass are remembered in this process and on disk
(`sessions.capture.check_cache`), so neither re-opening them nor opening them in the next process
spawns another check.

Run as `python -m sessions.capture.structure_check [--memory-budget BYTES] [--shard I/N] PATH`: prints
`progress DONE TOTAL` lines while it checks index rows, then one JSON object with the problems
found and what the file holds. The parent turns the progress lines into `Progress`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sessions.capture import check_cache
from sessions.capture import format as cf
from sessions.capture.hdf5_safety import CHECK_TIMEOUT_S, DEFAULT_MEMORY_BUDGET, Problem
from sessions.capture.reader import Capture, CaptureError, load_capture
from sessions.capture.record_scan import scan_problems
from sessions.child_env import child_env
from sessions.child_process import signal_name
from sessions.progress import Progress, ProgressGenerator, run_to_end

SHARDING_MIN_BYTES = 16 * 1024**2
MAX_SHARDS = 4
INTERPRETER_HEADROOM = 1536 * 1024**2
"""Address space the child's interpreter, numpy and libhdf5 need besides the read budget."""
PROGRESS_PREFIX = b"progress "
POLL_S = 0.1
"""How often the parent yields while children are quiet, so closing its generator is prompt."""


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


def check_here(
    path: Path,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    shard: int = 0,
    shards: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check a file in this process, collecting every problem (each child runs this).

    With several shards, shard i checks the i-th contiguous slice of index rows' datasets;
    shard 0 also reports the row-level and cross-table problems, so merging the shards' reports
    in shard order lists problems in file order. `progress(done, total)` counts this shard's rows.
    """
    try:
        capture = load_capture(path, memory_budget=memory_budget)
    except CaptureError as exc:
        return CheckReport([Problem(exc.location, exc.problem)] if shard == 0 else [])
    with capture:
        report = CheckReport(list(capture.row_problems) if shard == 0 else [], capture.complete, capture.describe())
        n = len(capture.index)
        report.problems += scan_problems(capture, n * shard // shards, n * (shard + 1) // shards, progress)
        if shard == 0:
            report.problems += table_problems(capture)
    return report


def table_problems(capture: Capture) -> list[Problem]:
    """Cross-table problems: dispatch rows pointing nowhere, unknown kinds, broken occurrence counts.

    Works on the index columns, not on `Record` objects: building 50,000 of them costs half a second.
    """
    found: list[Problem] = []
    index = capture.index
    seen: dict[tuple[int, str, int, str], int] = {}
    rows = zip(
        index["step"].tolist(),
        [cf.decode_field(raw) for raw in index["segment"].tolist()],
        index["layer"].tolist(),
        [cf.decode_field(raw) for raw in index["name"].tolist()],
        index["occurrence"].tolist(),
        index["t_start_ns"].tolist(),
        index["t_end_ns"].tolist(),
    )
    for seq, (step, segment, layer, name, occurrence, t_start, t_end) in enumerate(rows):
        key = (step, segment, layer, name)
        expected = seen.get(key, 0)
        if occurrence != expected:
            found.append(
                Problem(
                    f"/index row {seq} ({name})",
                    f"occurrence is {occurrence}; {expected} earlier rows have this name in step "
                    f"{step}, segment {segment!r}, layer {layer}, so it should be {expected}",
                )
            )
        seen[key] = expected + 1
        if t_end < t_start:
            found.append(Problem(f"/index row {seq} ({name})", "ends before it starts"))
    n_records = len(index)
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


def shard_count(path: Path) -> int:
    """How many children check a file at once: one for small files, up to four cores' worth for large ones.

    Checking one index row's dataset costs about 65 us (opening its header, type, dataspace and
    one attribute in libhdf5), so a 50,000-record capture takes over 3 s on one core; small files
    are not worth the extra interpreter start-ups (0.2 s each).
    """
    if path.stat().st_size < SHARDING_MIN_BYTES:
        return 1
    return max(1, min(MAX_SHARDS, os.cpu_count() or 1))


def _child_command(path: Path, memory_budget: int, shard: int, shards: int) -> list[str]:
    return [
        sys.executable, "-m", "sessions.capture.structure_check",
        "--memory-budget", str(memory_budget), "--shard", f"{shard}/{shards}", str(path),
    ]  # fmt: skip


def _verdict(returncode: int, stdout: str, stderr: str) -> CheckReport:
    where = "structure check"
    if returncode < 0:
        return CheckReport(
            [
                Problem(
                    where,
                    f"reading the file's structure crashed the checking process ({signal_name(-returncode)}); "
                    "the file is corrupt or crafted",
                )
            ]
        )
    try:
        return CheckReport.from_json(stdout.strip().splitlines()[-1])
    except (ValueError, KeyError, IndexError, TypeError):
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        return CheckReport([Problem(where, f"the checking process failed (exit {returncode}: {tail[0][:300]})")])


class _Children:
    """The checking children of one file and what each has printed so far."""

    def __init__(self, path: Path, memory_budget: int) -> None:
        env = child_env()
        shards = shard_count(path)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.selector = selectors.DefaultSelector()
        self.stdout = [bytearray() for _ in range(shards)]
        self.stderr = [bytearray() for _ in range(shards)]
        self.done = [0] * shards
        self.totals: list[int | None] = [None] * shards
        self._parsed = [0] * shards
        try:
            for shard in range(shards):
                child = subprocess.Popen(
                    _child_command(path, memory_budget, shard, shards),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                )
                self.processes.append(child)
                assert child.stdout is not None and child.stderr is not None
                self.selector.register(child.stdout, selectors.EVENT_READ, (shard, self.stdout))
                self.selector.register(child.stderr, selectors.EVENT_READ, (shard, self.stderr))
        except BaseException:
            self.close()
            raise

    @property
    def reading(self) -> bool:
        return bool(self.selector.get_map())

    def read(self, timeout_s: float) -> None:
        """Take what the children printed within `timeout_s`."""
        for key, _ in self.selector.select(timeout_s):
            shard, sink = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.selector.unregister(key.fileobj)
                continue
            sink[shard] += chunk
            if sink is self.stdout:
                self._parse_progress(shard)

    def _parse_progress(self, shard: int) -> None:
        out = self.stdout[shard]
        end = out.rfind(b"\n") + 1
        for line in bytes(out[self._parsed[shard] : end]).splitlines():
            numbers = line[len(PROGRESS_PREFIX) :].split() if line.startswith(PROGRESS_PREFIX) else []
            if len(numbers) == 2 and all(n.isdigit() for n in numbers):
                self.done[shard], self.totals[shard] = int(numbers[0]), int(numbers[1])
        self._parsed[shard] = end

    def progress(self, label: str) -> Progress:
        """Rows checked over all shards; the total stays 0 (unknown) until every shard has counted its rows."""
        if any(total is None for total in self.totals):
            return Progress(sum(self.done), 0, label)
        return Progress(sum(self.done), sum(t or 0 for t in self.totals), label)

    def close(self) -> None:
        """Kill whichever child still runs and reap every one, so none outlives the check."""
        for child in self.processes:
            if child.poll() is None:
                child.kill()
        for child in self.processes:
            child.wait()
            for pipe in (child.stdout, child.stderr):
                if pipe is not None:
                    pipe.close()
        self.selector.close()


def _timeout_report(timeout_s: float) -> CheckReport:
    return CheckReport(
        [Problem("structure check", f"reading the file's structure did not finish within {timeout_s:g} s (libhdf5 hangs on it)")]
    )


def iter_check_in_child(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> ProgressGenerator[CheckReport]:
    """Run the check in child processes, yielding rows checked; a crash or hang of any child is itself the finding.

    Closing the generator kills the children (cancel): none is left running.
    """
    deadline = time.monotonic() + timeout_s
    label = f"checking {path.name}"
    children = _Children(path, memory_budget)
    try:
        yield children.progress(label)
        while children.reading:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _timeout_report(timeout_s)
            children.read(min(POLL_S, remaining))
            yield children.progress(label)
        merged = CheckReport()
        for shard, child in enumerate(children.processes):
            try:
                returncode = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return _timeout_report(timeout_s)
            report = _verdict(
                returncode,
                children.stdout[shard].decode("utf-8", errors="replace"),
                children.stderr[shard].decode("utf-8", errors="replace"),
            )
            if shard == 0:
                merged.complete, merged.contents = report.complete, report.contents
            merged.problems += report.problems
        return merged
    finally:
        children.close()


def check_in_child(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> CheckReport:
    """`iter_check_in_child` without progress."""
    return run_to_end(iter_check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s))


_passed: set[check_cache.FileIdentity] = set()
_passed_lock = threading.Lock()


def _passed_anywhere(identity: check_cache.FileIdentity) -> bool:
    with _passed_lock:
        if identity in _passed:
            return True
    if check_cache.passed_before(identity):
        with _passed_lock:
            _passed.add(identity)
        return True
    return False


def already_checked(path: Path, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> bool:
    """Whether this file, as it is now on disk, passed a check in this or an earlier process."""
    return _passed_anywhere(check_cache.identity_of(path, memory_budget))


def _unchanged(path: Path, identity: check_cache.FileIdentity) -> bool:
    try:
        return check_cache.identity_of(path, identity.memory_budget) == identity
    except OSError:
        return False


def iter_ensure_checked(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> ProgressGenerator[Problem | None]:
    """The first problem of a file (with a count of the rest), or None once it passed; yields nothing for a known pass.

    A pass is remembered (here and on disk) only when the file did not change while it was
    checked: a writer still appending makes the verdict about a version that is gone.
    """
    identity = check_cache.identity_of(path, memory_budget)
    if _passed_anywhere(identity):
        return None
    report = yield from iter_check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s)
    if not report.problems:
        if _unchanged(path, identity):
            with _passed_lock:
                _passed.add(identity)
            check_cache.remember_pass(identity)
        return None
    check_cache.forget(identity)
    first = report.problems[0]
    more = len(report.problems) - 1
    if more:
        return Problem(first.location, f"{first.problem} (and {more} more; `parity-xray validate` lists them)")
    return first


def ensure_checked(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> Problem | None:
    """`iter_ensure_checked` without progress."""
    return run_to_end(iter_ensure_checked(path, memory_budget=memory_budget, timeout_s=timeout_s))


def _limit_address_space(memory_budget: int) -> None:
    limit = memory_budget + INTERPRETER_HEADROOM
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessions.capture.structure_check")
    parser.add_argument("--memory-budget", type=int, default=DEFAULT_MEMORY_BUDGET)
    parser.add_argument("--shard", default="0/1", help="I/N: check the I-th of N slices of the index")
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    shard, shards = (int(part) for part in args.shard.split("/"))
    _limit_address_space(args.memory_budget)

    def progress(done: int, total: int) -> None:
        sys.stdout.write(f"{PROGRESS_PREFIX.decode()}{done} {total}\n")
        sys.stdout.flush()

    try:
        report = check_here(args.path, args.memory_budget, shard, shards, progress)
    except MemoryError:
        report = CheckReport([Problem("structure check", "reading the file's structure ran out of its memory limit")])
    except Exception as exc:  # noqa: BLE001  (any libhdf5 failure on a bad file is a finding, not a crash)
        report = CheckReport([Problem("file", f"unreadable structure ({type(exc).__name__}: {exc})")])
    print(report.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
