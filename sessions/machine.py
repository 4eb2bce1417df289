"""Facts about the machine a command runs on, that decide how much it may hold or run at once."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def physical_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """Bytes the system could give without swapping, page cache included (Linux's MemAvailable):
    what reading ahead may fill without pushing out what is read next. Where the system does not
    say (macOS), half the machine's memory."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory() // 2
