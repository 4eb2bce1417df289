"""Which system libraries a Qt library or plugin lacks, and the packages that bring them.

Qt's own message when its xcb plugin cannot load names `libxcb-cursor0` whatever is actually
missing. The dynamic linker knows better: `ldd` on the plugin lists every library it and its
dependencies need, `=> not found` for each one this system lacks. Each missing soname maps to
its Debian/Ubuntu and Fedora package, so the fix is one exact `apt-get install` / `dnf install`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LDD_TIMEOUT_S = 30

PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libXau.so.6": ("libxau6", "libXau"),
    "libXdmcp.so.6": ("libxdmcp6", "libXdmcp"),
    "libSM.so.6": ("libsm6", "libSM"),
    "libICE.so.6": ("libice6", "libICE"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGLdispatch.so.0": ("libglvnd0", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgobject-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
    "libexpat.so.1": ("libexpat1", "expat"),
    "libpng16.so.16": ("libpng16-16", "libpng"),
    "libz.so.1": ("zlib1g", "zlib"),
    "libzstd.so.1": ("libzstd1", "libzstd"),
}
"""soname -> (Debian/Ubuntu package, Fedora package): the libraries PySide6's QtGui, QtWidgets and
platform plugins link that a minimal or container install may lack."""

_MISSING = re.compile(r"^\s*(\S+) => not found\s*$")
_RESOLVED = re.compile(r"^\s*(\S+) => (/\S+) \(0x[0-9a-f]+\)\s*$")


@dataclass(frozen=True)
class LinkReport:
    """What `ldd` said: each needed soname's path, and the sonames it could not find (first-seen order)."""

    resolved: dict[str, str]
    missing: tuple[str, ...]


class LddUnavailable(RuntimeError):
    """No `ldd` here (macOS, a minimal image): the libraries cannot be listed."""


def parse_ldd(text: str) -> LinkReport:
    resolved: dict[str, str] = {}
    missing: list[str] = []
    for line in text.splitlines():
        if (lost := _MISSING.match(line)) is not None:
            if lost.group(1) not in missing:
                missing.append(lost.group(1))
        elif (found := _RESOLVED.match(line)) is not None:
            resolved[found.group(1)] = found.group(2)
    return LinkReport(resolved, tuple(missing))


def run_ldd(library: Path) -> LinkReport:
    """`ldd` on one library (it follows the dependencies' dependencies too)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise LddUnavailable("ldd is not on PATH")
    done = subprocess.run([ldd, str(library)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, check=False)
    return parse_ldd(done.stdout)


def _as_root(command: str) -> str:
    return command if os.geteuid() == 0 else f"sudo {command}"


def install_lines(missing: Iterable[str]) -> list[str]:
    """The exact commands that install what is missing, one per distribution family, then any
    soname this table does not know with how to find its package."""
    wanted = list(missing)
    known = [name for name in wanted if name in PACKAGES]
    debian = list(dict.fromkeys(PACKAGES[name][0] for name in known))
    fedora = list(dict.fromkeys(PACKAGES[name][1] for name in known))
    lines = []
    if known:
        lines.append(f"Debian/Ubuntu: {_as_root('apt-get install -y ' + ' '.join(debian))}")
        lines.append(f"Fedora:        {_as_root('dnf install -y ' + ' '.join(fedora))}")
    for name in wanted:
        if name not in PACKAGES:
            lines.append(f"{name}: `apt-file search {name}` or `dnf provides '*/{name}'` names its package")
    return lines
