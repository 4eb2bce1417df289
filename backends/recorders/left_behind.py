"""What a recording that stopped early left at its output, in the words every message uses.

A recording's writer renames its capture to the output at its first committed step
(sessions.capture.writer), so comparing the output's disk stamp before and after the run tells
a run that wrote nothing, or left (`--force`) the capture that was there, from one whose
committed steps are there to read.
"""

from __future__ import annotations

from pathlib import Path

from sessions.printable import printable
from sessions.side_file import DiskStamp, disk_stamp


def left_at(out: Path, before: DiskStamp | None) -> str:
    """What the run left at `out`, whose stamp was `before` when it started (None: no file)."""
    shown = printable(str(out))
    now = disk_stamp(out)
    if now is None:
        return f"nothing was written to {shown} (the run stopped before its first step)"
    if now == before:
        return f"{shown} is as it was (the run stopped before its first step)"
    return f"{shown} holds the steps written so far and reads as incomplete (parity-xray validate names them)"
