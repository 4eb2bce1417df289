"""Facts about the machine a command runs on, that decide how much it may hold or run at once."""

from __future__ import annotations

import os
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


WORKERS_PER_CORE = 4
"""The most worker processes a command starts per usable core: past it they only take turns."""


def too_many_workers(workers: int, option: str = "--workers") -> str | None:
    """Why `workers` processes are too many here, or None: 48 Dask workers on 2 cores took 44 s
    for a case 2 judged in 0.4 s, and 40 report workers 17 s for a pair 2 compared in 2.8 s."""
    cores = usable_cores()
    if workers <= WORKERS_PER_CORE * cores:
        return None
    return f"{option} {workers} is more than {WORKERS_PER_CORE} per core here ({cores} cores): the processes would only take turns on them"


def physical_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """Bytes the system could give without swapping, page cache included (Linux's MemAvailable):
    what reading ahead may fill without pushing out what is read next. No more than this
    process's memory cgroup still allows (`cgroup_available`): in a container, MemAvailable is the
    host's, and the page cache a comparison fills is charged to the container and reclaimed
    under its limit as it reads. An 8.1 GB pair in a 4 GiB cgroup of a 23 GiB, 2-core machine
    (`report --workers 2`, cold, three alternating runs): 7.0-8.3 s (4.0-6.0 s of system time)
    told MemAvailable, 5.5-5.9 s (2.1-2.4 s) told the cgroup's room. Where the system does not
    say (macOS), half the machine's memory."""
    system = physical_memory() // 2
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    system = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    allowed = cgroup_available()
    return system if allowed is None else min(system, allowed)


UNLIMITED = 1 << 62
"""A cgroup v1 limit at or past this is no limit (the kernel writes 2^63 rounded to a page)."""


def cgroup_available(root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes this process's memory cgroup, or the tightest of its ancestors, allows beyond what it
    holds, its page cache counted as free (as MemAvailable counts it); None where no limit is
    set or none can be read. cgroup v2 (`memory.max`), else v1's memory controller
    (`hierarchical_memory_limit`). In a container the cgroup's own folder is the mount's root."""
    try:
        lines = [line.split(":", 2) for line in own.read_text().splitlines() if line.count(":") >= 2]
    except OSError:
        return None
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    if v1:  # a hybrid system's memory controller is v1's, whatever its unified hierarchy says
        return _v1_available(root / "memory", v1[0].strip("/"))
    v2 = [path for number, controllers, path in lines if number == "0" and controllers == ""]
    return _v2_available(root, v2[0].strip("/")) if v2 else None


def _v2_available(root: Path, relative: str) -> int | None:
    folder = root / relative if (root / relative / "memory.max").exists() else root
    found: int | None = None
    while True:
        limit = _number(folder / "memory.max")
        if limit is not None:
            cache = _stats(folder / "memory.stat").get("file", 0)
            current = _number(folder / "memory.current") or 0
            left = max(0, limit - current + cache)
            found = left if found is None else min(found, left)
        if folder == root or root not in folder.parents:
            return found
        folder = folder.parent


def _v1_available(root: Path, relative: str) -> int | None:
    folder = root / relative if (root / relative / "memory.stat").exists() else root
    stats = _stats(folder / "memory.stat")
    limit = stats.get("hierarchical_memory_limit")
    if limit is None or limit >= UNLIMITED:
        return None
    cache = stats.get("total_cache", 0)
    usage = _number(folder / "memory.usage_in_bytes") or 0
    return max(0, limit - usage + cache)


def _number(path: Path) -> int | None:
    """A cgroup file's one number; None for "max", a missing file or anything else."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stats(path: Path) -> dict[str, int]:
    """A cgroup's memory.stat, its "key value" lines (one that is not is skipped); empty where it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    stats: dict[str, int] = {}
    for line in lines:
        name, _, value = line.partition(" ")
        try:
            stats[name] = int(value)
        except ValueError:
            continue
    return stats
