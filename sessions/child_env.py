"""The command line and environment of every child process: capture readers, the comparison,
the early byte checks, llama.cpp recordings.

Children re-import this project by module name, so they must find the same source tree as the
parent whatever the working directory (`-P`: a `sessions` folder where the user stands must
not stand in for ours); they load no HDF5 filter plugin (docs/capture-format.md, "What a reader refuses"); and a
child is one of several, so its BLAS stays on one thread instead of fighting its siblings.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def module_command(module: str, *arguments: str) -> list[str]:
    """This interpreter running one of the project's modules, never one found in the working directory."""
    return [sys.executable, "-P", "-m", module, *arguments]


def child_env() -> dict[str, str]:
    env = dict(os.environ, HDF5_PLUGIN_PRELOAD="::", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env
