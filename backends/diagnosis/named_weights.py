"""Whether the weights file named for the reruns (`diagnose --weights`) is the one the runs hashed.

Every rerun reads the named file for both sides, so a wrong file (another fine-tune, another
quantization) turns what the reruns find into a statement about other weights: a falsely local
op, ops left undetermined, and nothing said. A capture's `weights_hash` says which weights its
run used: a recorder's is `sha256:` and the SHA-256 of the file's bytes
(`sessions.artifact_hash`); the demo engines' is a bare digest over the tensors' names, dtypes,
shapes and bits (`backends.engines.demo_model.weights_hash`). A hash of any other form cannot
be checked, and nothing is said of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx

from backends.engines.demo_model import weights_hash
from sessions.artifact_hash import WEIGHTS_ID_PREFIX, artifact_sha256, weights_id
from sessions.capture.reader import Capture
from sessions.printable import printable

_RECORDED = re.compile(rf"{re.escape(WEIGHTS_ID_PREFIX)}[0-9a-f]{{64}}")
_TENSORS = re.compile(r"[0-9a-f]{64}")


def named_weights_mismatch(path: Path, native: Capture, oracle: Capture) -> str | None:
    """A sentence naming the runs whose weights hash the file does not match, or None."""
    hashes = {side: capture.meta.weights_hash for side, capture in (("native", native), ("oracle", oracle))}
    file_id: str | None = None
    tensors_id: str | None = None
    apart: list[str] = []
    for side, recorded in hashes.items():
        if _RECORDED.fullmatch(recorded):
            file_id = file_id or weights_id(artifact_sha256([path]))
            if recorded != file_id:
                apart.append(side)
        elif _TENSORS.fullmatch(recorded) and path.suffix == ".safetensors":
            try:
                tensors_id = tensors_id or weights_hash(mx.load(str(path)))
            except (RuntimeError, ValueError):
                continue  # unreadable here: the reruns that read it say so
            if recorded != tensors_id:
                apart.append(side)
    if not apart:
        return None
    if len(apart) == 2 and hashes["native"] == hashes["oracle"]:
        runs = f"both runs ({hashes['native']})"
    else:
        runs = " and ".join(f"the {side} run ({hashes[side]})" for side in apart)
    return (
        f"The weights file {printable(str(path))} does not match the weights hash of {runs}: every rerun reads it, "
        "so what the reruns find is of other weights than the runs used."
    )
