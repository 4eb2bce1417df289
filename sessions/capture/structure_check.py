"""The structural check of a capture, run in a child process the first time a file is opened.

libhdf5 is not safe on crafted input: byte-mutated files segfault it and hang it, and while it
hangs it holds the interpreter lock (docs/capture-format.md, "What a reader refuses"). A thread is no protection, so the first
open of a file walks everything the viewer will later touch (root attributes, the three tables,
every index row's dataset and attributes) in a separate process with a wall-clock timeout and
an address-space limit. A crash or a hang there becomes a `Problem` naming the file, and the
caller carries on. Files that pass are remembered in this process and on disk
(`sessions.capture.check_cache`), so neither re-opening them nor opening them in the next process
spawns another check.

Run as `python -m sessions.capture.structure_check [--memory-budget BYTES] [--shard I/N] PATH`: prints
`datasets D` once it has read the index (D rows name datasets of their own, each checked on
its own), `progress DONE TOTAL` lines while it checks index rows, then one JSON object with the
problems found and what the file holds. The parent turns the progress lines into `Progress`.
With `--spare` alone it imports everything, then reads those arguments from stdin as a JSON
list: a child started before its file is known (`sessions.capture.spare_checker`).

Packed rows cost a vectorised pass over the index plus one check per pack, so a file is split
over several children only when it has many datasets of its own (older writers' files): the
first child says how many, and the parent starts the others only then.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sessions.capture import check_cache, spare_checker
from sessions.capture import format as cf
from sessions.capture.columns import IndexColumns, codes
from sessions.capture.data_check import data_problems
from sessions.capture.file_walk import walk_problems
from sessions.capture.hdf5_safety import (
    CHECK_TIMEOUT_ENV,
    CHECK_TIMEOUT_S,
    DEFAULT_MEMORY_BUDGET,
    Problem,
    describe_error,
)
from sessions.capture.index_rows import listed, text_checks
from sessions.capture.reader import Capture, CaptureError, load_capture
from sessions.capture.record_scan import scan_problems
from sessions.child_env import child_env, module_command
from sessions.child_process import signal_name
from sessions.machine import usable_cores
from sessions.progress import Progress, ProgressGenerator, run_to_end

SHARDING_MIN_BYTES = 16 * 1024**2
MAX_SHARDS = 4
SHARDING_MIN_DATASETS = 16_000
"""Rows naming datasets of their own (about 65 us each to check) worth more children; below, one child checks them all."""
DATASETS_PREFIX = b"datasets "
INTERPRETER_HEADROOM = 1536 * 1024**2
"""Address space the child's interpreter, numpy and libhdf5 need besides the read budget."""
PROGRESS_PREFIX = b"progress "
BEGIN_PREFIX = b"begin "
"""A checking child announces each file of its batch (`begin I`) before checking it."""
POLL_S = 0.1
"""How often the parent yields while children are quiet, so closing its generator is prompt."""


@dataclass
class CheckReport:
    """What one structural check found: every problem, and what the file holds."""

    problems: list[Problem] = field(default_factory=list)
    complete: bool = False
    contents: str = ""
    finished: bool = True
    """False when the check ran out of time: its one problem says so, and blames nothing in the file."""

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
    deep: bool = False,
    announce: Callable[[int], None] | None = None,
) -> CheckReport:
    """Check a file in this process, collecting every problem (each child runs this).

    With several shards, shard i checks the i-th contiguous slice of index rows' datasets;
    shard 0 also reports the row-level, cross-table and whole-tree problems, so merging the
    shards' reports in shard order lists problems in file order. A file with fewer than
    SHARDING_MIN_DATASETS rows naming datasets of their own is checked by shard 0 alone, and
    `announce(rows)` says how many there are, so the parent knows whether to start the other
    shards. `deep` then reads the data of the shard's records, when its structure had no
    problem. `progress(done, total)` counts this shard's rows (twice when deep).
    """
    try:
        capture = load_capture(path, memory_budget=memory_budget)
    except CaptureError as exc:
        if announce is not None:
            announce(0)
        return CheckReport([Problem(exc.location, exc.problem)] if shard == 0 else [])
    with capture:
        datasets = dataset_rows(capture)
        if announce is not None:
            announce(datasets)
        if datasets < SHARDING_MIN_DATASETS:
            shards = 1
        report = CheckReport(list(capture.row_problems) if shard == 0 else [], capture.complete, capture.describe())
        n = len(capture.index)
        start, stop = (n * shard // shards, n * (shard + 1) // shards) if shard < shards else (n, n)
        total = (stop - start) * (2 if deep else 1)
        counted = None if progress is None else (lambda done, _: progress(done, total))
        report.problems += scan_problems(capture, start, stop, counted)
        if shard == 0:
            report.problems += table_problems(capture)
            report.problems += walk_problems(capture)
    if deep and not report.problems:
        # Opened afresh: libhdf5 can fail on a damaged structure the first time and not once it has
        # cached part of it, so the data is read from the state a `report` starts in.
        read = None if progress is None else (lambda done: progress(stop - start + done, total))
        try:
            with load_capture(path, memory_budget=memory_budget) as fresh:
                report.problems += data_problems(fresh, start, stop, read)
        except CaptureError as exc:
            report.problems.append(Problem(exc.location, exc.problem))
    return report


def dataset_rows(capture: Capture) -> int:
    """Index rows whose tensor is a dataset of its own: the rows a check visits one by one."""
    return len(capture.index) - int(np.count_nonzero(capture.columns.packed))


def occurrence_counts(columns: IndexColumns) -> np.ndarray:
    """For each index row, how many earlier rows have its (step, segment, layer, name): what its
    `occurrence` must be. Computed over the columns at once (a row-by-row pass takes seconds
    for a million rows): rows sorted stably by that key, each counted from its key's first."""
    _, segments = columns.codes("segment")
    _, names = columns.codes("name")
    where = columns["step"].astype(np.int64) << 32 | (columns["layer"].astype(np.int64) & 0xFFFFFFFF)
    what = names * (int(segments.max(initial=0)) + 1) + segments
    order = np.lexsort((what, where))
    sorted_where, sorted_what = where[order], what[order]
    starts = np.flatnonzero(np.concatenate(([True], (sorted_where[1:] != sorted_where[:-1]) | (sorted_what[1:] != sorted_what[:-1]))))
    counts = np.empty(len(columns), dtype=np.int64)
    counts[order] = np.arange(len(columns)) - np.repeat(starts, np.diff(np.append(starts, len(columns))))
    return counts


def earlier_row(*keys: np.ndarray) -> np.ndarray:
    """For each row of a table, the first earlier row with the same key (every column of `keys`
    equal), or -1: rows that repeat a key, found by one stable sort of the columns."""
    n = len(keys[0])
    order = np.lexsort(keys[::-1])
    same = np.logical_and.reduce([key[order][1:] == key[order][:-1] for key in keys])
    starts = np.flatnonzero(np.concatenate(([True], ~same))) if n else np.zeros(0, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    first[order] = order[np.repeat(starts, np.diff(np.append(starts, n)))]
    return np.where(first == np.arange(n), -1, first)


def table_problems(capture: Capture) -> list[Problem]:
    """Cross-table problems: broken occurrence counts, and dispatch and token rows that the format refuses.

    Works on whole columns, not on `Record` objects or rows one by one: a capture of a real
    model has hundreds of thousands of rows.
    """
    index = capture.index
    expected = occurrence_counts(capture.columns)

    def where(row: int) -> str:
        return f"/index row {row} ({cf.decode_field(index['name'][row])})"

    def occurrence(row: int) -> Problem:
        segment = cf.decode_field(index["segment"][row])
        step, layer, have, want = (int(v) for v in (index["step"][row], index["layer"][row], index["occurrence"][row], expected[row]))
        return Problem(
            where(row),
            f"occurrence is {have}; {want} earlier rows have this name in step {step}, segment {segment!r}, "
            f"layer {layer}, so it should be {want}",
        )

    columns = capture.columns
    found = listed(columns["occurrence"] != expected, occurrence, "occurrence breaks the occurrence rule")
    found += listed(columns["t_end_ns"] < columns["t_start_ns"], lambda row: Problem(where(row), "ends before it starts"), "rows end before they start")
    return found + dispatch_problems(capture.dispatch, len(index)) + token_problems(capture.tokens)


DISPATCH_SIZES = ("batch", "head_count", "q_heads", "kv_heads", "q_rows", "kv_len", "head_dim", "v_head_dim")
"""Dispatch fields that count requests, heads, rows or elements of a head: a call has at least one of each."""

RowCheck = tuple[np.ndarray, Callable[[int], str], str]
"""(rows that break a rule, what is wrong with one of them, what is wrong with the rest)."""


def _listed_rows(table: str, checks: list[RowCheck]) -> list[Problem]:
    """The problems of a table's row checks, each row located by its table and number."""
    found: list[Problem] = []
    for bad, what, summary in checks:
        found += listed(bad, lambda row, what=what: Problem(f"{table} row {row}", what(row)), summary, table)
    return found


def _text_checks(column: np.ndarray, field: str) -> list[RowCheck]:
    """A free text column of a table held to the index's rule (`index_rows.text_checks`): the
    token's segment and the call's dtype reach the report, its JSON and its verdict as text."""
    return [
        (rows, lambda row, what=what, detail=detail: f"{what}{detail(row)}", what)
        for rows, what, detail in text_checks(*codes(column), field)
    ]


def dispatch_problems(dispatch: np.ndarray, n_records: int) -> list[Problem]:
    """Dispatch rows pointing nowhere, of unknown kinds, of no heads, or repeating another row's call."""
    seqs, calls = np.ascontiguousarray(dispatch["index_seq"]), np.ascontiguousarray(dispatch["call"])
    twin = earlier_row(seqs, calls)
    checks: list[RowCheck] = [
        ((seqs < 0) | (seqs >= n_records), lambda row: f"index_seq {int(seqs[row])} is not a record (0..{n_records - 1})", "index_seq is not a record"),
        *_text_checks(dispatch["dtype"], "dtype"),
    ]
    for column, allowed in (("mask_kind", cf.MASK_KINDS), ("primitive", cf.PRIMITIVES), ("metal_primitive", cf.METAL_PRIMITIVES)):
        values = dispatch[column]

        def unknown(row: int, column: str = column, allowed: tuple[str, ...] = allowed, values: np.ndarray = values) -> str:
            return f"{column} {cf.decode_field(values[row])!r} is not one of {allowed}"

        checks.append((~np.isin(values, np.array([kind.encode() for kind in allowed])), unknown, f"{column} is not one it may be"))
    for column in DISPATCH_SIZES:
        sizes = dispatch[column]

        def empty(row: int, column: str = column, sizes: np.ndarray = sizes) -> str:
            return f"{column} is {int(sizes[row])}; it is at least 1"

        checks.append((sizes < 1, empty, f"{column} is below 1"))
    start, count, q_heads, group, kv_heads = (dispatch[name] for name in ("head_start", "head_count", "q_heads", "kv_group", "kv_heads"))
    checks += [
        (
            (q_heads >= 1) & (count >= 1) & ((start < 0) | (start.astype(np.int64) + count > q_heads)),  # else its size is the problem
            lambda row: f"heads {int(start[row])}..{int(start[row]) + int(count[row]) - 1} are not heads of the layer's {int(q_heads[row])}",
            "the call's heads are not the layer's",
        ),
        (
            (kv_heads >= 1) & ((group < -1) | (group >= kv_heads)),
            lambda row: f"kv_group is {int(group[row])}; it is -1 (every group) or a group of the layer's {int(kv_heads[row])}",
            "kv_group is not a group of the layer",
        ),
        (calls < 0, lambda row: f"call is {int(calls[row])}; calls count from 0", "call is negative"),
        (
            twin >= 0,
            lambda row: f"index_seq {int(seqs[row])} call {int(calls[row])} is also /dispatch row {int(twin[row])}; each call of a record has one row",
            "a record's call has another row",
        ),
    ]
    return _listed_rows(cf.DISPATCH_PATH, checks)


def token_problems(tokens: np.ndarray) -> list[Problem]:
    """Token rows of a negative step or token id, a stop flag other than 0 and 1, or a second token
    for one forward call (a step and segment): which of two tokens a comparison takes would be a guess."""
    steps, ids, stops = (np.ascontiguousarray(tokens[name]) for name in ("step", "token_id", "is_stop"))
    twin = earlier_row(steps, codes(tokens["segment"])[1])

    def repeated(row: int) -> str:
        segment = cf.decode_field(tokens["segment"][row])
        return f"step {int(steps[row])} segment {segment!r} already has a token (/tokens row {int(twin[row])}); a forward call emits one"

    return _listed_rows(
        cf.TOKENS_PATH,
        [
            (steps < 0, lambda row: f"step is {int(steps[row])}; steps count from 0", "step is negative"),
            (ids < 0, lambda row: f"token_id is {int(ids[row])}; token ids are at least 0", "token_id is negative"),
            ((stops != 0) & (stops != 1), lambda row: f"is_stop is {int(stops[row])}; it is 0 or 1", "is_stop is neither 0 nor 1"),
            (twin >= 0, repeated, "a step and segment has another token"),
            *_text_checks(tokens["segment"], "segment"),
        ],
    )


def shard_count(path: Path) -> int:
    """How many children may check a file at once: one for small files, up to four cores' worth for large ones.

    Checking an index row whose tensor is a dataset of its own costs about 65 us (opening its
    header, type, dataspace and one attribute in libhdf5), so a 50,000-record capture in that
    layout takes over 3 s on one core; small files are not worth the extra interpreter
    start-ups (0.2 s each), nor are packed files, whose rows are checked at once (the first
    child says which: `iter_check_in_child`).
    """
    if path.stat().st_size < SHARDING_MIN_BYTES:
        return 1
    return min(MAX_SHARDS, usable_cores())


def _child_arguments(paths: list[Path], memory_budget: int, deep: bool, shard: int = 0, shards: int = 1) -> list[str]:
    """The checker's command line after `python -m sessions.capture.structure_check`."""
    return [
        "--memory-budget", str(memory_budget), "--shard", f"{shard}/{shards}", *(["--deep"] if deep else []),
        "--", *(os.path.abspath(path) for path in paths),
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
    """Checking children (the shards of one file, or one child checking a batch of files) and what each has printed so far."""

    def __init__(self, commands: list[list[str]]) -> None:
        """`commands`: each child's `_child_arguments`."""
        self._env = child_env()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.selector = selectors.DefaultSelector()
        self.stdout: list[bytearray] = []
        self.stderr: list[bytearray] = []
        self.done: list[int] = []
        self.totals: list[int | None] = []
        self.begun: list[int] = []
        """The file a batch child announced last (`begin I`)."""
        self.reports: list[list[str]] = []
        """The report lines a batch child printed, one per file, in order."""
        self.datasets: list[int | None] = []
        """The rows naming datasets of their own a shard found (`datasets D`), once it said."""
        self._parsed: list[int] = []
        self._commands: list[list[str]] = []
        self._were_ready: list[bool] = []
        """Whether each child was one kept ready (`spare_checker`), not started for its command."""
        self.start(commands)

    def start(self, commands: list[list[str]]) -> None:
        """Start more children (the later shards of a file), numbered after those already running."""
        try:
            for command in commands:
                ready = spare_checker.take(command)
                self._add(ready or self._fresh(command), command, ready is not None)
        except BaseException:
            self.close()
            raise

    def _fresh(self, command: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            module_command(spare_checker.CHECKER_MODULE, *command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
        )

    def _add(self, child: subprocess.Popen[bytes], command: list[str], was_ready: bool, shard: int | None = None) -> None:
        """Watch `child` as shard `shard` (a new one by default, or in place of one that was lost)."""
        if shard is None:
            shard = len(self.processes)
            self.processes.append(child)
            self._commands.append(command)
            self._were_ready.append(was_ready)
            for values in (self.stdout, self.stderr, self.done, self.totals, self.begun, self.reports, self.datasets, self._parsed):
                values.append(None)  # type: ignore[attr-defined]
        self.processes[shard], self._were_ready[shard] = child, was_ready
        self.stdout[shard], self.stderr[shard], self.done[shard], self.totals[shard] = bytearray(), bytearray(), 0, None
        self.begun[shard], self.reports[shard], self.datasets[shard], self._parsed[shard] = -1, [], None, 0
        assert child.stdout is not None and child.stderr is not None
        self.selector.register(child.stdout, selectors.EVENT_READ, (shard, self.stdout))
        self.selector.register(child.stderr, selectors.EVENT_READ, (shard, self.stderr))

    def keep_reading(self) -> bool:
        """Whether a child may still print; a child kept ready that ended before it began its
        first file (killed while it waited) is replaced here by a fresh one: its end says
        nothing about the file."""
        if self.selector.get_map():
            return True
        lost = [shard for shard in range(len(self.processes)) if self._were_ready[shard] and self.begun[shard] < 0]
        for shard in lost:
            _reap(self.processes[shard])
            self._add(self._fresh(self._commands[shard]), self._commands[shard], False, shard)
        return bool(lost)

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
            if line.startswith(BEGIN_PREFIX) and line[len(BEGIN_PREFIX) :].isdigit():
                self.begun[shard] = int(line[len(BEGIN_PREFIX) :])
                self.done[shard], self.totals[shard] = 0, None
            elif line.startswith(b"{"):
                self.reports[shard].append(line.decode("utf-8", errors="replace"))
            elif line.startswith(DATASETS_PREFIX) and line[len(DATASETS_PREFIX) :].isdigit():
                self.datasets[shard] = int(line[len(DATASETS_PREFIX) :])
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
            _reap(child)
        self.selector.close()


def _reap(child: subprocess.Popen[bytes]) -> None:
    child.wait()
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def _timeout_report(timeout_s: float, progress: Progress) -> CheckReport:
    """A check that ran out of time says so, without blaming the file: most often it is large for this machine."""
    done = f"{progress.done} of {progress.total} index rows" if progress.total else f"{progress.done} index rows"
    return CheckReport(
        [
            Problem(
                "structure check",
                f"did not finish within the {timeout_s:g} s allowed ({done} checked); nothing wrong with the file "
                f"was found, but checking it takes longer on this machine: allow more time with "
                f"{CHECK_TIMEOUT_ENV}=SECONDS (validate: --timeout SECONDS)",
            )
        ],
        finished=False,
    )


def iter_check_in_child(
    path: Path,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
    deep: bool = False,
) -> ProgressGenerator[CheckReport]:
    """Run the check in child processes, yielding rows checked; a crash or hang of any child is itself the finding.

    `deep` also reads every record's data there (`validate --deep`). The first shard starts
    alone; the others start once it says the file has enough datasets of their own to share
    out (`SHARDING_MIN_DATASETS`). Closing the generator kills the children (cancel): none is
    left running.
    """
    deadline = time.monotonic() + timeout_s
    label = f"{'reading' if deep else 'checking'} {path.name}"
    shards = shard_count(path)
    children = _Children([_child_arguments([path], memory_budget, deep, 0, shards)])
    try:
        yield children.progress(label)
        while children.keep_reading():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _timeout_report(timeout_s, children.progress(label))
            children.read(min(POLL_S, remaining))
            announced = children.datasets[0]
            if len(children.processes) < shards and announced is not None and announced >= SHARDING_MIN_DATASETS:
                children.start([_child_arguments([path], memory_budget, deep, shard, shards) for shard in range(1, shards)])
            yield children.progress(label)
        merged = CheckReport()
        for shard, child in enumerate(children.processes):
            try:
                returncode = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return _timeout_report(timeout_s, children.progress(label))
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
    deep: bool = False,
) -> CheckReport:
    """`iter_check_in_child` without progress."""
    return run_to_end(iter_check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s, deep=deep))


_passed: set[check_cache.FileIdentity] = set()
_failed: dict[tuple[check_cache.FileIdentity, float], Problem] = {}
"""Failures of this process's run, by file version and time limit: a file that failed (or ran out
of time) is not checked again while it is unchanged, e.g. by `report` opening a file that its
side-by-side check just refused. Never stored on disk: a fixed checker must see the file again."""
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


def _remember_pass(path: Path, identity: check_cache.FileIdentity) -> None:
    """Remember a pass, here and on disk, unless the file changed while it was checked (a writer
    still appending makes the verdict about a version that is gone)."""
    if _unchanged(path, identity):
        with _passed_lock:
            _passed.add(identity)
        check_cache.remember_pass(identity)


def _batch_reports(
    paths: list[Path], memory_budget: int, timeout_s: float, deep: bool
) -> Iterator[CheckReport]:
    """Reports of `paths` in order, from one child that checks them one after another.

    Stops after the file that crashed the child or ran out of time (its report says so); the
    caller starts a new batch with the rest.
    """
    children = _Children([_child_arguments(paths, memory_budget, deep)])
    given = 0
    deadline = time.monotonic() + timeout_s
    try:
        while children.keep_reading():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield _timeout_report(timeout_s, children.progress(""))
                return
            started = children.begun[0]
            children.read(min(POLL_S, remaining))
            for line in children.reports[0][given:]:
                yield _verdict(0, line, "")
            given = len(children.reports[0])
            if children.begun[0] != started:
                deadline = time.monotonic() + timeout_s
        if given < len(paths):
            returncode = children.processes[0].wait()
            yield _verdict(returncode, "", children.stderr[0].decode("utf-8", errors="replace"))
    finally:
        children.close()


def iter_check_files(
    paths: list[Path],
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    timeout_s: float = CHECK_TIMEOUT_S,
    deep: bool = False,
) -> Iterator[tuple[Path, CheckReport]]:
    """Each file's report, in order, for `validate` of many files; passes are remembered as by `ensure_checked`.

    A checking child costs about 0.3 s to start (numpy and h5py), more than checking a small
    capture, so small files are checked in batches by one child each; a file that crashes or
    hangs it gets that finding, and a new child takes the rest. A file large enough to shard
    is checked on its own (`iter_check_in_child`). `timeout_s` applies to each file.
    """
    at = 0
    while at < len(paths):
        identities = {}
        if shard_count(paths[at]) > 1:
            batch = paths[at : at + 1]
            identities[batch[0]] = check_cache.identity_of(batch[0], memory_budget)
            reports: Iterator[CheckReport] = iter(
                [check_in_child(batch[0], memory_budget=memory_budget, timeout_s=timeout_s, deep=deep)]
            )
        else:
            batch = list(itertools.takewhile(lambda p: shard_count(p) == 1, paths[at:]))
            identities = {path: check_cache.identity_of(path, memory_budget) for path in batch}
            reports = _batch_reports(batch, memory_budget, timeout_s, deep)
        for path, report in zip(batch, reports):
            if not report.problems:
                _remember_pass(path, identities[path])
            yield path, report
            at += 1


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
    with _passed_lock:
        failed = _failed.get((identity, timeout_s))
    if failed is not None:
        return failed
    report = yield from iter_check_in_child(path, memory_budget=memory_budget, timeout_s=timeout_s)
    if not report.problems:
        _remember_pass(path, identity)
        return None
    check_cache.forget(identity)
    first = report.problems[0]
    more = len(report.problems) - 1
    if more:
        first = Problem(first.location, f"{first.problem} (and {more} more; `parity-xray validate` lists them)")
    if _unchanged(path, identity):
        with _passed_lock:
            _failed[(identity, timeout_s)] = first
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


def _arguments_from_stdin() -> list[str] | None:
    """A ready child's real command line (`spare_checker`), once its parent sends it; None when
    the parent ends without one."""
    line = sys.stdin.readline()
    arguments = json.loads(line) if line.strip() else None
    if not isinstance(arguments, list) or not all(isinstance(a, str) for a in arguments):
        return None
    return arguments


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == [spare_checker.SPARE_FLAG]:
        given = _arguments_from_stdin()
        if given is None:
            return 0
        argv = given
    parser = argparse.ArgumentParser(prog="python -m sessions.capture.structure_check")
    parser.add_argument("--memory-budget", type=int, default=DEFAULT_MEMORY_BUDGET)
    parser.add_argument("--shard", default="0/1", help="I/N: check the I-th of N slices of the index")
    parser.add_argument("--deep", action="store_true", help="also read every record's data")
    parser.add_argument("paths", type=Path, nargs="+", help="files, checked one after another (a batch)")
    args = parser.parse_args(argv)
    shard, shards = (int(part) for part in args.shard.split("/"))
    _limit_address_space(args.memory_budget)

    def progress(done: int, total: int) -> None:
        sys.stdout.write(f"{PROGRESS_PREFIX.decode()}{done} {total}\n")
        sys.stdout.flush()

    def announce(datasets: int) -> None:
        sys.stdout.write(f"{DATASETS_PREFIX.decode()}{datasets}\n")
        sys.stdout.flush()

    for number, path in enumerate(args.paths):
        sys.stdout.write(f"{BEGIN_PREFIX.decode()}{number}\n")
        sys.stdout.flush()
        try:
            report = check_here(path, args.memory_budget, shard, shards, progress, args.deep, announce)
        except MemoryError:
            report = CheckReport([Problem("structure check", "reading the file's structure ran out of its memory limit")])
        except Exception as exc:  # noqa: BLE001  (any libhdf5 failure on a bad file is a finding, not a crash)
            report = CheckReport([Problem("file", f"unreadable structure ({describe_error(exc)})")])
        print(report.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def iter_deep_check(paths: list[Path], *, timeout_s: float = CHECK_TIMEOUT_S) -> ProgressGenerator[list[tuple[Path, CheckReport]]]:
    """`validate --deep` for the viewer: every tensor of each file read in the limited child, one
    Progress per file. Offered when a read fails, so the user learns what else in the file is damaged."""
    found: list[tuple[Path, CheckReport]] = []
    yield Progress(0, len(paths), f"reading every tensor of {paths[0].name}" if paths else "nothing to check")
    for path, report in iter_check_files(paths, timeout_s=timeout_s, deep=True):
        found.append((path, report))
        yield Progress(len(found), len(paths), f"read every tensor of {path.name}")
    return found
