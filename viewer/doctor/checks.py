"""Each thing a run needs, checked without importing it into this process.

`parity-xray doctor` runs before the window exists (and `make demo` runs it first), so it must
not load Qt itself: a Qt that cannot find its platform plugin aborts the process with a message
naming the wrong package. Qt is examined through its files (`importlib.util.find_spec`, `ldd`)
and then started once in a child process; MLX and llama.cpp are imported in child processes
too, since an llama.cpp build for another CPU dies by SIGILL on import.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from backends.recorders.llama_cpu import (
    FEATURE_FLAGS,
    REBUILD_COMMAND,
    cpu_flags,
    os_grants_amx,
    parse_system_info,
    ungranted,
)
from sessions.capture.check_cache import CACHE_DIR_ENV, cache_root
from sessions.child_process import signal_name
from viewer.doctor.system_libraries import LddUnavailable, install_lines, run_ldd

PROBE_TIMEOUT_S = 60
OK, PROBLEM, OPTIONAL, NOTE = "ok", "PROBLEM", "optional", "note"
QT_MODULES = ("QtCore", "QtGui", "QtWidgets")
"""The PySide6 modules the viewer imports."""
NO_DISPLAY_PLATFORMS = {"offscreen", "minimal", "vnc", "linuxfb", "eglfs", "vkkhrdisplay", "minimalegl"}
_QT_GENERIC = ("xcb-cursor0 or libxcb-cursor0 is needed", "even though it was found")
"""Lines Qt prints after any failure to start xcb, whatever the cause (its xcb-cursor hint misled the issue's user)."""
INSTALL_APP = ".venv/bin/python -m pip install -c constraints.txt -e .   (what `make demo` runs)"
INSTALL_LLAMA = "make llama   (builds llama-cpp-python portably, once per machine; `make test` does too)"


@dataclass(frozen=True)
class Finding:
    """One check's outcome: what was looked at, what was found, and the exact fix when there is one."""

    topic: str
    area: str
    """qt, display, mlx, llama or cache: what `--for` selects."""
    status: str
    detail: str
    fix: tuple[str, ...] = field(default=())


def _probe(code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
        env=dict(os.environ if env is None else env), check=False,
    )  # fmt: skip


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    """How a probe ended: the signal it died by, or its last lines of output."""
    ended = f"died by {signal_name(-done.returncode)}" if done.returncode < 0 else f"exit {done.returncode}"
    lines = [line for line in (done.stderr + done.stdout).strip().splitlines() if line.strip()]
    return f"{ended}: {' / '.join(lines[-3:])[:400]}" if lines else ended


def qt_platform(env: Mapping[str, str]) -> str:
    """The platform plugin Qt will try first: QT_QPA_PLATFORM's first entry, else cocoa on macOS,
    wayland in a Wayland session, xcb otherwise."""
    chosen = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip().lower()
    if chosen:
        return chosen
    if sys.platform == "darwin":
        return "cocoa"
    if env.get("XDG_SESSION_TYPE") == "wayland" and env.get("WAYLAND_DISPLAY"):
        return "wayland"
    return "xcb"


def _pyside_dir() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _missing_libraries(libraries: list[Path]) -> tuple[str, ...]:
    missing: dict[str, None] = {}
    for library in libraries:
        missing.update(dict.fromkeys(run_ldd(library).missing))
    return tuple(missing)


def check_qt(env: Mapping[str, str], rehearse: bool = True) -> Iterator[Finding]:
    """PySide6 present; the system libraries of its modules and of the platform plugin; a display
    when the platform needs one; then, with `rehearse`, Qt started for real in a child process."""
    pyside = _pyside_dir()
    if pyside is None:
        yield Finding("Qt", "qt", PROBLEM, "PySide6 is not installed in this Python", (INSTALL_APP,))
        return
    platform = qt_platform(env)
    plugin = pyside / "Qt" / "plugins" / "platforms" / f"libq{platform}.so"
    healthy = True
    if sys.platform == "linux":
        if not plugin.is_file():
            choices = sorted(p.stem.removeprefix("libq") for p in plugin.parent.glob("libq*.so"))
            yield Finding("Qt platform plugin", "qt", PROBLEM, f"'{platform}': PySide6 has no {plugin.name}",
                          (f"set QT_QPA_PLATFORM to one of {', '.join(choices)}, or unset it",))  # fmt: skip
            return
        try:
            modules = _missing_libraries([pyside / f"{name}.abi3.so" for name in QT_MODULES])
            plugin_only = tuple(name for name in _missing_libraries([plugin]) if name not in modules)
        except LddUnavailable as exc:
            yield Finding("Qt modules", "qt", NOTE, f"not listed ({exc}); the start-up check below still runs")
        else:
            for topic, missing, whose in (("Qt modules", modules, "QtGui and QtWidgets"), ("Qt platform plugin", plugin_only, plugin.name)):
                if missing:
                    healthy = False
                    yield Finding(topic, "qt", PROBLEM, f"{whose} need{'s' if whose == plugin.name else ''} "
                                  f"{len(missing)} system librar{'y' if len(missing) == 1 else 'ies'} this system lacks: "
                                  f"{', '.join(missing)}", tuple(install_lines(missing)))  # fmt: skip
                else:
                    yield Finding(topic, "qt", OK, f"every system library {whose} links is present")
    display = check_display(platform, env)
    yield display
    if rehearse and healthy and display.status != PROBLEM:
        yield check_qt_starts(platform, env)


def window_problems(env: Mapping[str, str]) -> list[Finding]:
    """What stops a window from opening here, found before Qt is loaded into this process: Qt
    aborts a process whose platform plugin cannot load (exit 134) with a message naming the
    wrong package, and `parity-xray NATIVE ORACLE` or `demo` over ssh without a display did
    just that. No rehearsal in a child process (`check_qt_starts`): the window starts Qt next.
    Only what this check can judge blocks the window: a list of platforms Qt tries in turn
    ("wayland;xcb") and a plugin name it does not find as a file of its own ("wayland-egl" is
    served by libqwayland.so) are left to Qt, which may well open the window."""
    chosen = env.get("QT_QPA_PLATFORM", "")
    pyside = _pyside_dir()
    plugin = None if pyside is None else pyside / "Qt" / "plugins" / "platforms" / f"libq{qt_platform(env)}.so"
    if ";" in chosen or (sys.platform == "linux" and plugin is not None and not plugin.is_file()):
        return []
    return [finding for finding in check_qt(env, rehearse=False) if finding.status == PROBLEM]


def check_display(platform: str, env: Mapping[str, str]) -> Finding:
    if platform == "cocoa":
        return Finding("display", "display", OK, "macOS (cocoa)")
    if platform in NO_DISPLAY_PLATFORMS:
        return Finding("display", "display", NOTE, f"QT_QPA_PLATFORM={platform}: Qt draws off screen, no window shows")
    variable = "WAYLAND_DISPLAY" if platform == "wayland" else "DISPLAY"
    if env.get(variable):
        return Finding("display", "display", OK, f"{variable}={env[variable]}")
    return Finding(
        "display", "display", PROBLEM, f"no display: {variable} is not set, so the '{platform}' platform has nowhere to draw",
        ("run it in a desktop session (or `ssh -X` from one)",
         "headless: `parity-xray report NATIVE ORACLE --html OUT.html` needs no display",
         "QT_QPA_PLATFORM=offscreen starts the viewer without a window (tests, screenshots)"),
    )  # fmt: skip


def check_qt_starts(platform: str, env: Mapping[str, str]) -> Finding:
    """The decisive check: a child process starts a QGuiApplication on the platform Qt chooses."""
    code = "import sys\nfrom PySide6.QtGui import QGuiApplication\napp = QGuiApplication(sys.argv[:1])\nprint(app.platformName())"
    try:
        done = _probe(code, env)
    except subprocess.TimeoutExpired:
        return Finding("Qt start-up", "qt", PROBLEM, f"starting Qt's '{platform}' platform did not finish within {PROBE_TIMEOUT_S} s")
    if done.returncode == 0:
        return Finding("Qt start-up", "qt", OK, f"Qt started the '{done.stdout.strip()}' platform in a test process")
    said = [line for line in done.stderr.splitlines() if line.startswith("qt.") and not any(g in line for g in _QT_GENERIC)]
    display = env.get("WAYLAND_DISPLAY" if platform == "wayland" else "DISPLAY", "")
    if any("could not connect to display" in line or "Failed to create wl_display" in line for line in said):
        return Finding("Qt start-up", "qt", PROBLEM, f"Qt could not connect to the display {display!r} ({said[0]})",
                       (f"check that a display server runs there and lets this user in (X11: `xdpyinfo -display {display}`, "
                        "XAUTHORITY; over ssh: `ssh -X`)",))  # fmt: skip
    cause = " / ".join(said[:2]) if said else _failure(done)
    return Finding("Qt start-up", "qt", PROBLEM, f"Qt could not start the '{platform}' platform ({cause})",
                   ("QT_DEBUG_PLUGINS=1 parity-xray   shows every library Qt tried",))  # fmt: skip


def check_mlx() -> Finding:
    """MLX imports and says whether Metal is there (only on Apple silicon: Linux builds compute on the CPU)."""
    if importlib.util.find_spec("mlx") is None:
        return Finding("MLX", "mlx", PROBLEM, "MLX is not installed (the demo engines and `rerun` compute with it)", (INSTALL_APP,))
    done = _probe("import mlx.core as mx\nprint(mx.__version__)\nprint(mx.metal.is_available())")
    if done.returncode != 0:
        return Finding("MLX", "mlx", PROBLEM, f"importing mlx failed ({_failure(done)})", (INSTALL_APP,))
    version, metal = done.stdout.split()[:2]
    if metal == "True":
        return Finding("MLX", "mlx", OK, f"mlx {version}; Metal is present")
    where = "expected off Apple silicon: the demo, rerun and MLX recordings compute on the CPU" if sys.platform != "darwin" else "MLX computes on the CPU only"
    return Finding("MLX", "mlx", OK if sys.platform != "darwin" else NOTE, f"mlx {version}; Metal not present ({where})")


def check_llama() -> Finding:
    """llama-cpp-python imports, and its CPU backend uses nothing this CPU and OS do not grant."""
    if importlib.util.find_spec("llama_cpp") is None:
        return Finding("llama.cpp", "llama", OPTIONAL, "llama-cpp-python is not installed (only `record llama` and the "
                       "llama-vs-mlx demo scenarios need it)", (INSTALL_LLAMA,))  # fmt: skip
    done = _probe("import json, llama_cpp\nprint(json.dumps([llama_cpp.__version__, llama_cpp.llama_print_system_info().decode()]))")
    if done.returncode != 0:
        return Finding("llama.cpp", "llama", PROBLEM, f"importing llama_cpp failed ({_failure(done)})", (REBUILD_COMMAND,))
    version, system_info = json.loads(done.stdout.strip().splitlines()[-1])
    build = parse_system_info(system_info)
    flags, amx = cpu_flags(), os_grants_amx()
    missing = ungranted(build, flags, amx)
    features = ", ".join(f for f in build.cpu_features_on() if f in FEATURE_FLAGS)
    options = ", ".join(f for f in build.cpu_features_on() if f not in FEATURE_FLAGS)
    if missing:
        return Finding("llama.cpp", "llama", PROBLEM, f"llama-cpp-python {version} is built for {features}; this machine "
                       f"does not grant {'; '.join(missing)}: llama.cpp would die by SIGILL", (REBUILD_COMMAND,))  # fmt: skip
    amx_note = ""
    if flags is not None and "amx_tile" in flags:
        amx_note = f"; the CPU has AMX, {'granted' if amx else 'not granted'} by the OS"
    checked = "all granted here" if flags is not None else "not compared: no /proc/cpuinfo here"
    return Finding("llama.cpp", "llama", OK, f"llama-cpp-python {version}, CPU backend built for {features} ({checked}{amx_note}); "
                   f"with {options or 'no build options'}")  # fmt: skip


def _writable(directory: Path) -> str | None:
    """None when a file can be created in `directory` (made if absent), else why not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_caches() -> Iterator[Finding]:
    """The folders runs write to: the cache (PARITY_XRAY_CACHE_DIR when set: structure checks,
    comparison results, gate cases), the user cache (demo captures) and the crash-recovery folder."""
    folders: dict[Path, list[str]] = {}
    for folder, purpose in (
        (cache_root(), "structure checks, comparisons, gate cases"),
        (platformdirs.user_cache_path("parity-xray"), "demo captures"),
        (platformdirs.user_data_path("parity-xray", appauthor=False) / "recovery", "session recovery"),
    ):
        folders.setdefault(folder, []).append(purpose)
    for folder, purposes in folders.items():
        what = f"{folder} ({', '.join(purposes)})"
        problem = _writable(folder)
        if problem is None:
            yield Finding("writable folder", "cache", OK, what)
        elif os.environ.get(CACHE_DIR_ENV) and folder == cache_root():
            yield Finding("writable folder", "cache", PROBLEM, f"{what} is not writable: {problem}",
                          (f"set {CACHE_DIR_ENV} to a writable folder, or unset it",))  # fmt: skip
        else:
            fix = f"make {folder} writable by this user, or point XDG_CACHE_HOME / XDG_DATA_HOME at a writable folder"
            yield Finding("writable folder", "cache", PROBLEM, f"{what} is not writable: {problem}", (fix,))


def run_checks(areas: frozenset[str], env: Mapping[str, str]) -> list[Finding]:
    """Every check of the given areas, in the order a person reads them."""
    findings: list[Finding] = []
    if areas & {"qt", "display"}:
        findings += [f for f in check_qt(env) if f.area in areas]
    if "mlx" in areas:
        findings.append(check_mlx())
    if "llama" in areas:
        findings.append(check_llama())
    if "cache" in areas:
        findings += check_caches()
    return findings
