"""Facts about the machine a command runs on, that decide how much it may hold or run at once."""

from __future__ import annotations

import os


def physical_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
