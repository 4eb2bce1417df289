"""Finding this test process's own children through /proc, to prove a child was started or reaped."""

from __future__ import annotations

import os
from pathlib import Path


def children_of_this_process(parent: int | None = None) -> dict[int, list[bytes]]:
    """pid -> command line of every live child of this process (or of `parent`)."""
    parent = os.getpid() if parent is None else parent
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found[int(entry.name)] = cmdline
    return found


def child_reading(path: Path) -> int | None:
    """The pid of this process's child whose command line names `path`, if one is alive."""
    return next((pid for pid, cmd in children_of_this_process().items() if str(path).encode() in cmd), None)
