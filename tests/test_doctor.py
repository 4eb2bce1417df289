"""`parity-xray doctor`: finds what a run lacks on this machine and prints the exact fix.

The system-library part reads real `ldd` output: a snapshot of `ldd libqxcb.so` (PySide6 6.11.3)
taken on the Debian 12 machine where Qt's own message blamed libxcb-cursor0 while
libxcb-icccm4 and libxcb-keysyms1 were what was missing, and the live output on this machine.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backends.recorders.llama_cpu import (
    PORTABLE_CMAKE_ARGS,
    cpu_flags,
    os_grants_amx,
    parse_system_info,
    ungranted,
)
from viewer.doctor.checks import NOTE, OK, PROBLEM, check_display, qt_platform
from viewer.doctor.system_libraries import PACKAGES, install_lines, parse_ldd, run_ldd

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "fixtures" / "doctor" / "ldd-libqxcb-pyside6.11.3-debian12.txt"
SUDO = "" if os.geteuid() == 0 else "sudo "
linux_only = pytest.mark.skipif(sys.platform != "linux" or shutil.which("ldd") is None, reason="reads ldd on Linux")


def _xcb_plugin() -> Path:
    spec = importlib.util.find_spec("PySide6")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "viewer.cli", "doctor", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def _without_display() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "XDG_SESSION_TYPE")}


def test_the_snapshot_names_the_two_libraries_debian_lacked_not_xcb_cursor() -> None:
    report = parse_ldd(SNAPSHOT.read_text())
    assert report.missing == ("libxcb-icccm.so.4", "libxcb-keysyms.so.1")
    assert report.resolved["libxcb-cursor.so.0"] == "/lib/x86_64-linux-gnu/libxcb-cursor.so.0"
    assert report.resolved["libQt6XcbQpa.so.6"].endswith("/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6")
    assert len(report.resolved) == 55


def test_the_fix_is_one_apt_get_and_one_dnf_line() -> None:
    assert install_lines(("libxcb-icccm.so.4", "libxcb-keysyms.so.1")) == [
        f"Debian/Ubuntu: {SUDO}apt-get install -y libxcb-icccm4 libxcb-keysyms1",
        f"Fedora:        {SUDO}dnf install -y xcb-util-wm xcb-util-keysyms",
    ]


def test_libraries_of_one_package_ask_for_it_once_and_an_unknown_one_says_how_to_find_it() -> None:
    assert install_lines(("libxcb-shm.so.0", "libxcb-sync.so.1", "libfoo.so.3")) == [
        f"Debian/Ubuntu: {SUDO}apt-get install -y libxcb-shm0 libxcb-sync1",
        f"Fedora:        {SUDO}dnf install -y libxcb",
        "libfoo.so.3: `apt-file search libfoo.so.3` or `dnf provides '*/libfoo.so.3'` names its package",
    ]


@linux_only
def test_live_ldd_on_the_installed_xcb_plugin_agrees_with_the_file_system() -> None:
    report = run_ldd(_xcb_plugin())
    assert "libxcb.so.1" in report.resolved
    assert all(Path(path).exists() for path in report.resolved.values())
    system_dirs = {Path(path).parent for name, path in report.resolved.items() if name.startswith("libxcb")}
    for name in report.missing:
        assert not any((folder / name).exists() for folder in system_dirs)
        assert name in PACKAGES, f"{name} is missing here and the package table does not know it"


def test_qt_picks_its_platform_from_the_environment() -> None:
    assert qt_platform({"QT_QPA_PLATFORM": "offscreen"}) == "offscreen"
    if sys.platform == "darwin":
        assert qt_platform({}) == "cocoa"
        return
    assert qt_platform({}) == "xcb"
    assert qt_platform({"QT_QPA_PLATFORM": "wayland;xcb"}) == "wayland"
    assert qt_platform({"QT_QPA_PLATFORM": "vnc:size=800x600"}) == "vnc"
    assert qt_platform({"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0"}) == "wayland"


def test_no_display_is_a_problem_that_offers_the_headless_ways() -> None:
    missing = check_display("xcb", {})
    assert (missing.status, missing.detail) == (PROBLEM, "no display: DISPLAY is not set, so the 'xcb' platform has nowhere to draw")
    assert "headless: `parity-xray report NATIVE ORACLE --html OUT.html` needs no display" in missing.fix
    assert check_display("xcb", {"DISPLAY": ":0"}).status == OK
    assert check_display("wayland", {"DISPLAY": ":0"}).status == PROBLEM
    assert check_display("offscreen", {}).status == NOTE


def _unserved_display() -> str:
    """An X display number no server listens on (no socket in /tmp/.X11-unix)."""
    return next(f":{n}" for n in range(4000, 5000) if not Path(f"/tmp/.X11-unix/X{n}").exists())


@linux_only
def test_doctor_on_an_x11_display_names_what_stops_the_window_and_exits_1() -> None:
    missing = run_ldd(_xcb_plugin()).missing
    display = _unserved_display()
    done = _doctor({**_without_display(), "DISPLAY": display}, "--for", "viewer")
    assert done.returncode == 1, done.stdout
    if missing:  # this machine lacks xcb libraries: the exact packages
        debian = " ".join(dict.fromkeys(PACKAGES[name][0] for name in missing))
        assert f"Debian/Ubuntu: {SUDO}apt-get install -y {debian}" in done.stdout
        assert "Qt start-up" not in done.stdout
    else:  # every library is there, and no X server answers on that display
        assert f"Qt could not connect to the display '{display}' (qt.qpa.xcb: could not connect to display {display})" in done.stdout
    assert "problem" in done.stdout.splitlines()[-1]


@linux_only
def test_doctor_without_a_display_says_so_and_exits_1() -> None:
    done = _doctor(_without_display(), "--for", "viewer")
    assert done.returncode == 1
    assert done.stdout.startswith("parity-xray doctor: what the viewer needs on this machine\n")
    assert "no display: DISPLAY is not set, so the 'xcb' platform has nowhere to draw" in done.stdout


def test_doctor_for_llama_names_the_command_it_checks_for_and_only_what_that_needs(tmp_path: Path) -> None:
    """The heading read "what the llama needs on this machine"; and unwritable cache folders, which
    `record llama` records fine without, failed it."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    env = {name: value for name, value in os.environ.items() if name != "PARITY_XRAY_CACHE_DIR"}
    done = _doctor({**env, "XDG_CACHE_HOME": str(blocked), "XDG_DATA_HOME": str(blocked)}, "--for", "llama")
    assert done.stdout.startswith("parity-xray doctor: what `record llama` needs on this machine\n")
    assert "writable folder" not in done.stdout


def test_doctor_offscreen_finds_everything_the_demo_needs_without_loading_qt_itself() -> None:
    env = {**_without_display(), "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    code = (
        "import sys\nfrom viewer.cli import main\ncode = main(['doctor', '--for', 'demo'])\n"
        "print('qt modules loaded:', sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph')))\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout
    assert "Qt started the 'offscreen' platform in a test process" in done.stdout
    assert "All set." in done.stdout
    assert "qt modules loaded: []" in done.stdout


def test_the_installed_llama_build_is_portable_and_runs_on_this_cpu() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    build = parse_system_info(llama_cpp.llama_print_system_info().decode())
    assert ungranted(build, cpu_flags(), os_grants_amx()) == []
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert {"AVX2", "FMA", "F16C"} <= set(build.cpu_features_on())
        assert not {"AVX512", "AMX_INT8"} & set(build.cpu_features_on())
        done = _doctor(dict(os.environ), "--for", "llama")
        assert done.returncode == 0
        assert f"llama-cpp-python {llama_cpp.__version__}, CPU backend built for SSE3, SSSE3, AVX, AVX2, F16C, FMA, BMI2" in done.stdout


def test_an_amx_build_where_the_os_does_not_grant_amx_is_named() -> None:
    build = parse_system_info("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | Metal : BF16 = 1 |")
    assert build.sections["Metal"] == {"BF16": "1"}
    sapphire_rapids_vm = frozenset({"pni", "avx2", "avx512f", "amx_tile", "amx_int8", "amx_bf16"})
    assert ungranted(build, sapphire_rapids_vm, amx_granted=False) == ["AMX_INT8 (the CPU has it, the OS does not grant it to processes)"]
    assert ungranted(build, sapphire_rapids_vm, amx_granted=True) == []
    zen3 = frozenset({"pni", "avx2"})
    assert ungranted(build, zen3, amx_granted=False) == [
        "AVX512 (the CPU lists no avx512f)", "AMX_INT8 (the CPU lists no amx_tile, amx_int8)",
    ]  # fmt: skip


def test_the_kernel_grants_amx_only_where_the_cpu_lists_it() -> None:
    flags = cpu_flags()
    if os_grants_amx():
        assert flags is not None and "amx_tile" in flags


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64" or shutil.which("make") is None, reason="x86-64 Makefile flags")
def test_the_makefile_builds_llama_cpp_with_the_flags_the_advice_names() -> None:
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "print-flags: ; @echo $(LLAMA_CMAKE_ARGS)", "print-flags"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.split() == PORTABLE_CMAKE_ARGS.split()


def test_the_install_doctor_names_for_a_missing_llama_build_is_a_make_target_that_runs_no_tests() -> None:
    """It named `make test`, which also runs the whole suite."""
    from viewer.doctor.checks import INSTALL_LLAMA

    command = INSTALL_LLAMA.split("   ")[0].split()
    assert command == ["make", "llama"]
    dry = subprocess.run([*command, "-n", "-C", str(Path(__file__).resolve().parent.parent)], capture_output=True, text=True, timeout=60, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "pytest" not in dry.stdout


def _parity_xray(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "viewer.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@linux_only
@pytest.mark.parametrize("command", [["NATIVE", "ORACLE"], ["demo", "--scenario", "clean"]])
def test_a_window_asked_for_without_a_display_says_what_stops_it_instead_of_qts_abort(
    command: list[str], demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    native, oracle = demo_pairs["clean"]
    argv = [str(native), str(oracle)] if command == ["NATIVE", "ORACLE"] else command
    # An empty user cache: `demo` says so before generating its captures (a minute of MLX).
    done = _parity_xray({**_without_display(), "XDG_CACHE_HOME": str(tmp_path)}, *argv)
    assert done.returncode == 2, done.stderr  # Qt's abort was 134
    lines = done.stderr.splitlines()
    assert lines[0] == "parity-xray: the window cannot open on this machine:"
    assert "no display: DISPLAY is not set, so the 'xcb' platform has nowhere to draw" in done.stderr
    assert lines[-1].startswith("`parity-xray doctor` checks everything a run needs") and "qt.qpa" not in done.stderr
    assert not any(tmp_path.iterdir()), "no demo captures generated for a window that cannot open"


@linux_only
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--version"], "parity-xray: error: unrecognized arguments: --version"),
        (["a.h5", "b.h5", "c.h5"], "parity-xray: give at most two captures: NATIVE ORACLE"),
        (["open", "a.h5"], "parity-xray open: give one session file (FILE.xray)"),
    ],
)
def test_a_mistyped_viewer_command_line_is_answered_as_typed_on_a_machine_without_a_display(argv: list[str], said: str) -> None:
    """Read after the display check, it was answered with ten lines about missing xcb libraries."""
    done = _parity_xray(_without_display(), *argv)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == said and "cannot open" not in done.stderr


def test_a_mistyped_command_is_named_with_the_nearest_one_instead_of_opening_the_window(tmp_path: Path) -> None:
    done = _parity_xray(dict(os.environ), "valdate", str(tmp_path / "run.h5"))
    assert done.returncode == 2
    assert done.stderr.startswith("parity-xray: unknown command 'valdate': did you mean 'validate'? the commands are validate, report, gate,")
    assert _parity_xray(dict(os.environ), "frobnicate").stderr.startswith("parity-xray: unknown command 'frobnicate': the commands are validate,")


@linux_only
def test_a_window_is_left_to_qt_where_it_tries_platforms_in_turn_or_names_one_this_check_cannot_find() -> None:
    from viewer.doctor.checks import window_problems

    # "wayland;xcb" over ssh -X falls back to xcb; libqwayland.so serves "wayland-egl" too.
    assert window_problems({"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":0"}) == []
    assert window_problems({"QT_QPA_PLATFORM": "wayland-egl"}) == []
    assert window_problems({"QT_QPA_PLATFORM": "offscreen"}) == []
    assert "display" in [f.topic for f in window_problems({})], "no display and no platform list: refused, as Qt would abort"
