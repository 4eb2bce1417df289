"""The comparison run in a child process, so the process that shows it never waits on it.

h5py holds the interpreter lock while libhdf5 reads, and numpy holds it for much of the diff
arithmetic, so a comparison on a thread of the viewer's process still stalls its event loop
for 150-250 ms at a time on a multi-GB pair. In a child process the comparison holds only its
own interpreter's lock. A child is also a crash boundary: a crafted file that segfaults
libhdf5 during the diff ends the child, and the caller gets a message naming the files.

The child streams `progress DONE TOTAL LABEL` lines and ends with a `result` line followed by
the comparison as the JSON document of sessions.compare.document (the CLI's `--json` output and
the sidecar cache's content) in lines (`document_lines`: the parent parses it a line at a
time, never holding its interpreter's lock for long), or one `error {...}` line. Run as
`python -m sessions.compare.in_child [--options JSON] [--cache-dir DIR] NATIVE ORACLE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from sessions.capture.opening import open_capture, open_complete_capture
from sessions.capture.reader import CaptureError
from sessions.child_env import module_command
from sessions.child_process import ChildProcess, progress_line, signal_name
from sessions.compare.comparison import Comparison, iter_compare
from sessions.compare.document import ReportFormatError, document_bytes, loads_lines
from sessions.compare.heap_tuning import keep_temporaries_on_heap
from sessions.compare.layout_transform import LayoutError
from sessions.compare.options import CompareOptions
from sessions.compare.parallel_compare import leave_the_window_a_core
from sessions.compare.profiles import ProfileError
from sessions.compare.result_cache import iter_document_cached
from sessions.progress import Progress, ProgressGenerator

RESULT = "result"
ERROR = "error"
POLL_S = 0.05
"""How often the parent yields while the child is quiet, so closing its generator is prompt."""
BEHIND_A_WINDOW_NICENESS = 5
"""A comparison for a window runs this much nicer than the window: on a machine with two cores,
its processes otherwise took the window's painting time (stalls of 0.2-0.4 s while comparing)."""
INPUT_ERRORS: dict[str, type[ValueError]] = {"ProfileError": ProfileError, "LayoutError": LayoutError}
"""Errors that name an input other than the captures (a profile file, a layout spec): raised
again in the parent as themselves, so a caller says what `report` says, not that the captures failed."""
PRINT_INTERVAL_S = 0.02
"""The child reports progress at most this often: each line wakes the parent's interpreter."""


def options_to_json(options: CompareOptions) -> str:
    return json.dumps(dataclasses.asdict(options))


def options_from_json(text: str) -> CompareOptions:
    return CompareOptions.from_dict(json.loads(text))


def _child_command(native: Path, oracle: Path, cache_dir: Path | None, for_window: bool, complete_only: bool) -> list[str]:
    command = module_command("sessions.compare.in_child", "--options", "-")
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    if for_window:
        command += ["--behind-a-window"]
    if complete_only:
        command += ["--complete-only"]
    return command + [str(native), str(oracle)]


def _error_line(child: ChildProcess) -> str | None:
    """The child's closing `error` line, when it ended with one."""
    output = child.stdout
    end = len(output)
    while end and output[end - 1] == ord("\n"):
        end -= 1
    # The last line alone: a copy of a real model's whole document held the interpreter lock for 0.1 s.
    line = bytes(output[output.rfind(b"\n", 0, end) + 1 : end])
    prefix = ERROR.encode() + b" "
    return line[len(prefix) :].decode("utf-8", errors="replace") if line.startswith(prefix) else None


def _document_start(child: ChildProcess) -> int | None:
    """Where the document's lines (`document_lines`) begin in the child's output: after the `result` marker line."""
    marker = RESULT.encode() + b"\n"
    if child.stdout.startswith(marker):
        return len(marker)
    at = child.stdout.find(b"\n" + marker)
    return None if at < 0 else at + 1 + len(marker)


def _outcome(child: ChildProcess, native: Path, oracle: Path, for_window: bool) -> Comparison:
    """The child's comparison, or the CaptureError its ending amounts to."""
    returncode = child.process.wait()
    pair = f"{native.name} against {oracle.name}"
    if returncode < 0:
        raise CaptureError(
            native,
            "comparison",
            f"comparing {pair} crashed the comparing process ({signal_name(-returncode)}); "
            "one of the files is corrupt or crafted; this process and its open files are unaffected",
        )
    error = _error_line(child)
    if error is not None:
        detail = json.loads(error)
        if "path" in detail:
            raise CaptureError(detail["path"], detail["location"], detail["problem"])
        if detail["type"] in INPUT_ERRORS:
            raise INPUT_ERRORS[detail["type"]](detail["message"])
        raise CaptureError(native, "comparison", f"comparing {pair} failed: {detail['type']}: {detail['message']}")
    start = _document_start(child)
    if returncode == 0 and start is not None:
        try:
            return loads_lines(child.stdout, start, keep_made=for_window)
        except ReportFormatError as exc:
            raise CaptureError(native, "comparison", f"the comparing process returned an unreadable result ({exc})") from None
    tail = child.stderr_text().strip().splitlines()[-1:] or ["no output"]
    raise CaptureError(native, "comparison", f"comparing {pair}: the comparing process failed (exit {returncode}: {tail[0][:300]})")


def iter_compare_in_child(
    native_path: Path,
    oracle_path: Path,
    options: CompareOptions = CompareOptions(),
    cache_dir: Path | None = None,
    for_window: bool = False,
    complete_only: bool = False,
) -> ProgressGenerator[Comparison]:
    """`iter_compare` of two capture files in a child process; yields its progress, returns its Comparison.

    `cache_dir` set: the child goes through the sidecar cache there (sessions.compare.result_cache);
    None: it always computes. `for_window`: the caller is a window, which keeps the comparison
    for long, so the collector is kept off it (`garbage_collection_paused(keep_made=True)`), and
    the child runs at a lower priority (BEHIND_A_WINDOW_NICENESS). `complete_only`: a capture
    whose writer did not finish is refused (`open_complete_capture`), as a verdict needs; a window
    shows what such a capture holds. Raises CaptureError
    naming the file when the child reports one, fails, or dies by a signal; ProfileError or
    LayoutError when an input other than the captures is unusable (INPUT_ERRORS). Closing the generator kills and reaps the child (cancel).
    """
    native_path, oracle_path = Path(native_path), Path(oracle_path)
    child = ChildProcess(_child_command(native_path, oracle_path, cache_dir, for_window, complete_only), options_to_json(options))
    try:
        starting = Progress(0, 1, f"starting the comparison of {native_path.name} and {oracle_path.name}")
        yield starting
        while child.reading:
            child.read(POLL_S)
            yield starting if child.latest is None else child.latest
        return _outcome(child, native_path, oracle_path, for_window)
    finally:
        child.close()


def _write_line(kind: str, text: str) -> None:
    sys.stdout.write(f"{kind} {text}\n")
    sys.stdout.flush()


def compare_here(native_path: Path, oracle_path: Path, options: CompareOptions, cache_dir: Path | None, complete_only: bool = False) -> bytes:
    """The child's side: open both files (structurally checked, as any open is), compare, print
    progress; the comparison's document (`document_bytes`), as the cache holds it when there is one."""
    opening = open_complete_capture if complete_only else open_capture
    with opening(native_path) as native, opening(oracle_path) as oracle:
        work: ProgressGenerator[Comparison | bytes] = (
            iter_compare(native, oracle, options) if cache_dir is None else iter_document_cached(native, oracle, options, cache_dir)
        )
        last = 0.0
        while True:
            try:
                step = next(work)
            except StopIteration as done:
                return done.value if isinstance(done.value, bytes) else document_bytes(done.value)
            now = time.monotonic()
            if now - last >= PRINT_INTERVAL_S:
                last = now
                sys.stdout.write(progress_line(step) + "\n")
                sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    keep_temporaries_on_heap()
    parser = argparse.ArgumentParser(prog="python -m sessions.compare.in_child")
    parser.add_argument("--options", default=options_to_json(CompareOptions()), help="CompareOptions as a JSON object; - reads it from stdin")
    parser.add_argument("--cache-dir", type=Path, help="use the sidecar result cache in this folder")
    parser.add_argument("--behind-a-window", action="store_true", help="run at a lower priority than the window waiting for it")
    parser.add_argument("--complete-only", action="store_true", help="refuse a capture whose writer did not finish")
    parser.add_argument("native", type=Path)
    parser.add_argument("oracle", type=Path)
    args = parser.parse_args(argv)
    if args.behind_a_window:
        os.nice(BEHIND_A_WINDOW_NICENESS)
        leave_the_window_a_core()
    try:
        options = options_from_json(sys.stdin.read() if args.options == "-" else args.options)
        document = compare_here(args.native, args.oracle, options, args.cache_dir, args.complete_only)
    except CaptureError as exc:
        _write_line(ERROR, json.dumps({"path": exc.path, "location": exc.location, "problem": exc.problem}))
        return 1
    except Exception as exc:  # noqa: BLE001  (any failure is reported to the parent as a message, not a traceback)
        _write_line(ERROR, json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        return 1
    sys.stdout.write(f"{RESULT}\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(document)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
