"""Test-wide set-up: headless Qt, artifacts folder, and the real demo captures as fixtures."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import pytest  # noqa: E402

import sessions  # noqa: E402,F401  (disables HDF5 filter plugins before h5py loads)
from sessions.capture import spare_checker  # noqa: E402

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

    from viewer.window.main_window import MainWindow

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path) -> Iterator[MainWindow]:
    """A shown 1440x900 main window with no pair (`tests.viewer_windows.shown_window`). Qt is
    imported here, not above: the domain's tests import none. A file whose tests start from
    another window defines its own."""
    from tests.viewer_windows import shown_window

    win = shown_window(qtbot, tmp_path)
    yield win
    win.close()


@pytest.fixture(autouse=True)
def no_checking_child_kept_ready() -> Iterator[None]:
    """A command run in this process (`viewer.cli.main`) keeps a checking child ready from then on
    (`sessions.capture.spare_checker`); it is ended after each test, so the next test's checks
    start their own children, as it expects."""
    yield
    spare_checker.stop()


@pytest.fixture(autouse=True)
def no_modal_dialog(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test can wait on a modal dialog: one that met a dialog hung the whole suite until the
    run's timeout, with no word of where. A window's questions are replaceable callables (the
    unsaved-work question, paths, reasons, partners); a call that reaches one of Qt's static
    dialogs fails the test at once, naming it (pytest-qt reports one raised inside a Qt event).
    (A context menu's `exec` cannot be replaced so: Shiboken looks it up on the C++ side.)
    A window still open at teardown answers the unsaved-work question "discard": the test is
    over, and its decisions (a rerun, a pairing, a tolerance) are unsaved work the window asks
    about as it closes. Tests that check the question replace `session_file.ask_close`.
    Only tests that drive widgets (through qtbot) are guarded: the domain's tests import no Qt."""
    if "qtbot" not in request.fixturenames:
        return
    from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

    from viewer.window import session_file

    def refuse(name: str) -> Callable[..., NoReturn]:
        def blocked(*_args: object, **_kwargs: object) -> NoReturn:
            raise AssertionError(f"{name} would wait for a person in a headless test: answer it through the window's replaceable question")

        return blocked

    modal = {
        QMessageBox: ("question", "warning", "critical", "information", "about"),
        QFileDialog: ("getOpenFileName", "getOpenFileNames", "getSaveFileName", "getExistingDirectory"),
        QInputDialog: ("getText", "getItem", "getInt", "getDouble", "getMultiLineText"),
    }
    for dialog, methods in modal.items():
        for method in methods:
            monkeypatch.setattr(dialog, method, refuse(f"{dialog.__name__}.{method}"))
    monkeypatch.setattr(session_file, "ask_close", lambda _parent: "discard")


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handler, for a test that sends SIGINT to a command it starts: a suite
    run in the background of a shell has SIGINT ignored, and a child inherits an ignored signal
    (a command started so is meant to ignore Ctrl-C), but not a handled one."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save screenshots and reports for a person to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def demo_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every demo scenario generated once (seed 0): scenario -> (native path, oracle path)."""
    from backends.demo.generate import iter_generate
    from sessions.progress import run_to_end

    return run_to_end(iter_generate(tmp_path_factory.mktemp("demo"), seed=0))


# Structure-check passes are remembered on disk (sessions.capture.check_cache); each test session gets
# its own empty cache, so no pass from an earlier run or from the user's own files counts here.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_SESSION_CACHE_DIR = tempfile.mkdtemp(prefix="parity-xray-test-cache-")
os.environ["PARITY_XRAY_CACHE_DIR"] = _SESSION_CACHE_DIR
atexit.register(shutil.rmtree, _SESSION_CACHE_DIR, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mutation_corpus: 300 seeded byte-mutated captures through validate --deep and report (about 20 s)"
    )


@pytest.fixture(scope="session")
def llama_tiny_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Real llama.cpp captures (native) against MLX (oracle) on one tiny Qwen3 per GGUF variant:
    variant -> (native path, oracle path), plus "f32-kv16": the f32 weights with llama.cpp's F16
    KV cache. Skipped where llama-cpp-python is not installed."""
    pytest.importorskip("llama_cpp")
    from backends.demo.llama_pairs import demo_weights_f32
    from backends.engines.demo_model import DemoConfig
    from backends.engines.gguf_export import (
        export_gguf,
        gguf_to_hf_names,
        read_gguf_weights,
        write_mlx_model_dir,
    )
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.llama_recorder import LlamaSettings
    from backends.recorders.mlx_recorder import iter_record_mlx
    from backends.recorders.record_schedule import TokenSchedule
    from sessions.progress import run_to_end

    config = DemoConfig(
        hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=96, dead_gate_channels=2,
    )
    directory = tmp_path_factory.mktemp("llama-tiny")
    weights = demo_weights_f32(config, 11)
    schedule = TokenSchedule((5, 17, 3, 88, 41, 9), decode_steps=2)
    pairs = {}
    for variant in ("f32", "f16", "q8_0"):
        gguf = export_gguf(config.as_dict(), weights, directory / f"tiny.{variant}.gguf", variant)
        held = gguf_to_hf_names(read_gguf_weights(gguf), list(weights), config.num_hidden_layers)
        mlx_dir = write_mlx_model_dir(config.as_dict(), held, directory / f"mlx-{variant}")
        native, oracle = directory / f"{variant}.native.h5", directory / f"{variant}.oracle.h5"
        run_to_end(iter_record_llama(gguf, schedule, native))
        run_to_end(iter_record_mlx(mlx_dir, schedule, oracle))
        pairs[variant] = (native, oracle)
        if variant == "f32":
            f16_cache = directory / "f32-kv16.native.h5"
            run_to_end(iter_record_llama(gguf, schedule, f16_cache, LlamaSettings(kv_type="f16")))
            pairs["f32-kv16"] = (f16_cache, oracle)
            flash = directory / "f32-flash.native.h5"
            run_to_end(iter_record_llama(gguf, schedule, flash, LlamaSettings(flash_attn=True)))
            pairs["f32-flash"] = (flash, oracle)
    return pairs
