"""Longest event-loop stall of the real viewer window while it opens, diffs and shows a large pair.

Builds a native/oracle pair of seed-sized tensors (1008 x 16384 float32, the Qwen3-VL visual
prefix) with real planted bit flips, opens it in the real MainWindow (offscreen unless a
display is given), and drives it: open + full comparison, the first divergence's heatmaps,
a colour-scale switch, another op, a zoom into a region drawn at full resolution, an element
click, and an HTML report of three bookmarks (each pictured as it was marked). A 10 ms QTimer
heartbeat records every gap; the longest gap is the longest time the UI could not respond,
reported overall and per phase. A gap past half a second prints every thread's
stack to stderr while it lasts (faulthandler), naming what the UI thread is stuck in.

    .venv/bin/python benchmarks/bench_ui_stall.py [--layers 8 | --records N [--diverged]] [--dir DIR] [--json OUT]

With `--records N` (240000: a real 8B model's run) it builds instead two captures of N small
records in 36-layer token steps, one bit apart at 60% of the run, and drives the open, the
first paint after it (half a second), the wait while the child compares, the comparison's
arrival (the tree, the verdict, the first finding), the Overview, Ctrl+J, the tree filter,
stepping through findings and another op, an HTML report of three bookmarks, and the pair
opened again over itself. `--diverged`: every record after it differs in most elements, as in a
run whose first error reaches every later op (88,000 differing pairs at 240,000 records).

Target: longest stall <= ~100 ms.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from PySide6.QtCore import QElapsedTimer, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
from sessions.capture.meta import CaptureMeta  # noqa: E402
from sessions.capture.writer import CaptureWriter  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from many_records import build_many_records_pair  # noqa: E402

ROWS, COLS = 1008, 16384
HEARTBEAT_MS = 10
TRACE_AFTER_S = 0.5
"""A gap this long dumps every thread's stack to stderr while it lasts: what the UI thread is stuck in."""


def build_pair(directory: Path, layers: int) -> tuple[Path, Path]:
    """`layers` records per side; layer k's native differs from the oracle by one-ULP flips in row k."""
    native_path, oracle_path = directory / "stall.native.h5", directory / "stall.oracle.h5"
    if native_path.exists() and oracle_path.exists():
        return native_path, oracle_path
    rng = np.random.default_rng(11)
    common = {"model_id": "bench", "weights_hash": "sha256:bench", "prompt": "bench"}
    with CaptureWriter(native_path, CaptureMeta(role="native", engine_name="bench-native", **common)) as native, CaptureWriter(
        oracle_path, CaptureMeta(role="oracle", engine_name="bench-oracle", **common)
    ) as oracle:
        for layer in range(layers):
            values = rng.standard_normal((ROWS, COLS), dtype=np.float32)
            oracle.add_tensor("layer_out", values, step=0, segment="visual", layer=layer)
            values.view(np.uint32)[layer, :: 97 + layer] ^= 1
            native.add_tensor("layer_out", values, step=0, segment="visual", layer=layer)
            native.end_step()
            oracle.end_step()
    return native_path, oracle_path


class Heartbeat:
    """Records the gaps between 10 ms timer ticks on the UI thread."""

    def __init__(self) -> None:
        self.clock = QElapsedTimer()
        self.gaps: list[float] = []
        self.ends: list[float] = []
        """When each gap ended (ms since start), to say which phase a stall fell in."""
        self.timer = QTimer()
        self.timer.setInterval(HEARTBEAT_MS)
        self.timer.timeout.connect(self._tick)
        self._last = 0.0

    def start(self) -> None:
        self.clock.start()
        self._last = self.clock.nsecsElapsed() / 1e6
        self.timer.start()
        faulthandler.dump_traceback_later(TRACE_AFTER_S, repeat=True)

    def _tick(self) -> None:
        faulthandler.dump_traceback_later(TRACE_AFTER_S, repeat=True)
        now = self.clock.nsecsElapsed() / 1e6
        self.gaps.append(now - self._last)
        self.ends.append(now)
        self._last = now

    def now_ms(self) -> float:
        return self.clock.nsecsElapsed() / 1e6

    def stop(self, phase_ends: dict[str, float]) -> dict[str, object]:
        """`phase_ends`: phase name -> when it ended (ms); each phase gets its own longest gap."""
        self.timer.stop()
        faulthandler.cancel_dump_traceback_later()
        gaps = np.asarray(self.gaps)
        stalls = gaps - HEARTBEAT_MS
        ends = np.asarray(self.ends)
        per_phase: dict[str, float] = {}
        start = 0.0
        for name, end in phase_ends.items():
            inside = gaps[(ends > start) & (ends <= end)]
            per_phase[name] = round(float(inside.max()), 1) if inside.size else 0.0
            start = end
        return {
            "longest_gap_by_phase_ms": per_phase,
            "ticks": int(gaps.size),
            "longest_gap_ms": round(float(gaps.max()), 1),
            "longest_stall_ms": round(float(stalls.max()), 1),
            "p99_gap_ms": round(float(np.percentile(gaps, 99)), 1),
            "gaps_over_100ms": int((gaps > 100).sum()),
        }


def wait(app: QApplication, condition: Callable[[], object], timeout_s: float = 900.0) -> float:
    """Run the event loop until `condition()` holds; the seconds it took."""
    start = time.perf_counter()
    while not condition():
        app.processEvents()
        time.sleep(0.001)
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError("the window did not finish in time")
    return time.perf_counter() - start


def shown_window(app: QApplication, settings_dir: Path):  # type: ignore[no-untyped-def]
    """The real main window at 1440x900, shown, with its settings in `settings_dir`."""
    from viewer.settings import ViewerSettings
    from viewer.window.main_window import MainWindow

    window = MainWindow(ViewerSettings(settings_dir / "bench.ini"))
    window.resize(1440, 900)
    window.show()
    wait(app, lambda: window.isVisible())
    return window


def opened(app: QApplication, native: Path, oracle: Path, settings_dir: Path):  # type: ignore[no-untyped-def]
    """The shown window with the heartbeat started and the pair opened: (window, beat, phases, ends)."""
    window = shown_window(app, settings_dir)
    beat = Heartbeat()
    beat.start()
    phases: dict[str, float] = {}
    ends: dict[str, float] = {}
    window.open_pair(native, oracle)
    phases["open_s"] = wait(app, lambda: window.model.native is not None)
    return window, beat, phases, ends


def uncaught_errors(window) -> list[str]:  # type: ignore[no-untyped-def]
    """The errors the window showed as unexpected: a drive that met one measured a broken window."""
    from viewer.window.uncaught_errors import GROUP

    return list(window.banners.texts(GROUP))


def bookmarked(app: QApplication, window, pairs: list) -> None:  # type: ignore[no-untyped-def]
    """Bookmark `pairs`, each on its own colour scale, as a user marks what they found, then
    select the first again. The bookmarks are the bench's own: the window drops them unasked
    when it opens another pair or closes (a question would wait for an answer no one gives)."""
    window.session_file.ask_close = lambda: "discard"
    for pair, scale in zip(pairs, ("ULP", "absolute", "relative")):
        window.model.select(pair)
        window.model.set_scale(scale)
        wait(app, lambda: not window.tasks.busy and window.tensor_view.data is not None and window.tensor_view.data.request.label == pair.key.text())
        window.session_sync.add_bookmark(f"bench bookmark at {pair.key}")
    window.model.select(pairs[0])
    wait(app, lambda: not window.tasks.busy)


def exported_html(app: QApplication, window, path: Path) -> float:  # type: ignore[no-untyped-def]
    """File > Export > HTML report: the seconds until the page is written, each bookmark
    pictured as it was marked while the window stays usable."""
    written: list[object] = []
    window.report_export.exported.connect(written.append)
    if not window.report_export.export_html(path):
        raise RuntimeError("the HTML export did not start")
    return wait(app, lambda: written)

def run(app: QApplication, native: Path, oracle: Path, settings_dir: Path) -> dict[str, object]:
    window, beat, phases, ends = opened(app, native, oracle, settings_dir)
    ends["open_and_first_paint"] = beat.now_ms()
    phases["compare_s"] = wait(app, lambda: window.model.comparison is not None)
    ends["compare"] = beat.now_ms()
    phases["first_divergence_heatmaps_s"] = wait(app, lambda: window.tensor_view.data is not None and not window.tasks.busy)
    for scale in ("absolute", "relative", "ULP"):
        window.model.set_scale(scale)
        app.processEvents()
    ends["heatmaps_and_scales"] = beat.now_ms()
    pairs = window.model.comparison.comparison.pairs
    window.model.select(pairs[-1])
    phases["another_op_s"] = wait(app, lambda: window.tensor_view.data is not None and window.tensor_view.data.request.label == pairs[-1].key.text() and not window.tasks.busy)
    ends["another_op"] = beat.now_ms()
    window.tensor_view.plots["native"].setRange(xRange=(COLS // 2, COLS // 2 + 400), yRange=(0, 200), padding=0)
    phases["zoom_detail_s"] = wait(app, lambda: window.tensor_view.detail is not None and not window.tasks.busy)
    ends["zoom_detail"] = beat.now_ms()
    window.tensor_view.select_element((5, 5), pinned=True)
    for index in range(4):
        window.show_panel(index)
        app.processEvents()
    ends["inspect_and_panels"] = beat.now_ms()
    bookmarked(app, window, [pairs[0], pairs[-1], pairs[len(pairs) // 2]])
    ends["bookmarking"] = beat.now_ms()
    phases["html_export_s"] = exported_html(app, window, settings_dir / "report.html")
    ends["html_export"] = beat.now_ms()
    result = beat.stop(ends)
    result["uncaught_errors"] = uncaught_errors(window)
    window.close()
    return {**result, **{k: round(v, 2) for k, v in phases.items()}}


def run_many_records(app: QApplication, native: Path, oracle: Path, settings_dir: Path) -> dict[str, object]:
    """The window on a real model's record count: open and compare, the tree, the Overview,
    Ctrl+J, the tree filter, stepping through findings and another op, then the same pair
    opened again over it (the old comparison goes as the new one is made)."""

    def settle(seconds: float = 0.3) -> None:
        wait(app, lambda: not window.tasks.busy)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.001)

    window, beat, phases, ends = opened(app, native, oracle, settings_dir)
    ends["open"] = beat.now_ms()
    painted = time.perf_counter() + 0.5
    wait(app, lambda: time.perf_counter() > painted or window.model.comparison is not None)
    ends["first_paint_after_opening"] = beat.now_ms()
    phases["compare_s"] = wait(app, lambda: window.model.comparison is not None)
    ends["while_comparing"] = beat.now_ms()
    settle()
    ends["arrival_tree_and_first_finding"] = beat.now_ms()
    window.show_panel(1)
    settle()
    ends["overview"] = beat.now_ms()
    window.show_panel(0)
    window.jump_to_first_finding()
    settle()
    ends["ctrl_j"] = beat.now_ms()
    first_finding = str(window.model.selected.key) if window.model.selected is not None else ""
    window.tree.filter.setText("ffn_down")
    settle()
    window.tree.filter.setText("")
    settle()
    ends["tree_filter"] = beat.now_ms()
    for direction in (1, -1):
        window.step_divergence(direction)
        settle(0.1)
    pairs = window.model.comparison.comparison.pairs
    pair_count = len(pairs)
    window.model.select(pairs[pair_count // 3])
    del pairs  # nothing here holds the comparison (not even weakly): the window frees it in steps as the new one is made
    settle()
    ends["step_and_another_op"] = beat.now_ms()
    pairs = window.model.comparison.comparison.pairs
    bookmarked(app, window, [pairs[0], pairs[pair_count * 3 // 5], pairs[-1]])
    del pairs
    settle()
    ends["bookmarking"] = beat.now_ms()
    phases["html_export_s"] = exported_html(app, window, settings_dir / "report.html")
    settle()
    ends["html_export"] = beat.now_ms()
    arrived: list[bool] = []
    window.model.comparison_changed.connect(lambda: arrived.append(window.model.comparison is not None))
    window.open_pair(native, oracle)
    phases["reopen_compare_s"] = wait(app, lambda: any(arrived))
    ends["reopen_while_comparing"] = beat.now_ms()
    settle()
    ends["reopen_arrival"] = beat.now_ms()
    result = beat.stop(ends)
    result["pairs"] = pair_count
    result["first_finding_after_ctrl_j"] = first_finding
    result["uncaught_errors"] = uncaught_errors(window)
    window.close()
    return {**result, **{k: round(v, 2) for k, v in phases.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="1008 x 16384 float32 records per side (66 MB each)")
    parser.add_argument("--dir", type=Path, help="where to build (and reuse) the pair; default a temporary folder")
    parser.add_argument("--records", type=int, help="instead: this many small records per side (240000: a real 8B model's run)")
    parser.add_argument("--diverged", action="store_true", help="with --records: every record after the first differing one differs in most elements")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.dir or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if args.records:
            native, oracle = build_many_records_pair(directory, args.records, diverged=args.diverged)
        else:
            native, oracle = build_pair(directory, args.layers)
        build_s = time.perf_counter() - t0
        size_mb = (native.stat().st_size + oracle.stat().st_size) / 1e6
        drive = run_many_records if args.records else run
        figures = {"pair_mb": round(size_mb, 1), "build_s": round(build_s, 1), **drive(app, native, oracle, Path(scratch))}
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if figures["uncaught_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
