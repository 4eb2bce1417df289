"""Provenance of one run: who produced a capture, from what, where."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CaptureMeta:
    role: str
    engine_name: str = ""
    engine_version: str = ""
    engine_commit: str = ""
    model_id: str = ""
    weights_hash: str = ""
    device: str = ""
    compiler: str = ""
    created_utc: str = ""
    prompt: str = ""
    seed: int = 0
    batch_size: int = 1
    batch_row: int = 0
    """With batch_size > 1, every record holds the batch's requests along stored axis 0; the
    request under comparison is this row."""
    batch_stacked: bool = False
    """True when stored axis 0 was added to hold the batch (a request alone has no such axis, as
    in llama.cpp, whose token rows carry no batch axis), so the request's record is `record[batch_row]`;
    False when axis 0 is the engine's own batch axis (size 1 alone, as in MLX): `record[batch_row:batch_row + 1]`."""
    provenance: dict[str, Any] = field(default_factory=dict)

    def mlx_version(self) -> str:
        """The MLX release the run computed on (provenance `mlx_version`, else "mlx X.Y.Z" in
        `compiler`); empty for a run that did not use MLX."""
        version = self.provenance.get("mlx_version") if isinstance(self.provenance, dict) else None
        if isinstance(version, str) and version:
            return version
        found = re.search(r"mlx\s+(\d+\.\d+\.\d+)", self.compiler)
        return found.group(1) if found else ""

    def provenance_bytes(self) -> bytes:
        return json.dumps(self.provenance, sort_keys=True).encode("utf-8")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
