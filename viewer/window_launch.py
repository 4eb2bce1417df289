"""Opening the window from a command line: what would stop it is said first, before Qt is loaded.

Qt aborts a process whose platform plugin cannot load (exit 134), with a message that names a
package the system may well have; `parity-xray NATIVE ORACLE` and `parity-xray demo` over ssh
without a display ended so. `make demo` ran `doctor` first, a user typing the command did not.
"""

from __future__ import annotations

import os
import sys

from viewer.doctor.checks import window_problems
from viewer.doctor.command import render

EXIT_NO_WINDOW = 2


def window_refused() -> bool:
    """Whether a window cannot open here; if so, the doctor's findings and fixes are on stderr."""
    problems = window_problems(os.environ)
    if problems:
        print(
            f"parity-xray: the window cannot open on this machine:\n{render(problems)}\n\n"
            "`parity-xray doctor` checks everything a run needs; the headless commands (report, validate, gate, ...) need no display.",
            file=sys.stderr,
        )
    return bool(problems)

