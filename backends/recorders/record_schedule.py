"""What every recorder shares: the token schedule (one prefill, then greedy decode steps) and artifact hashes.

Both real-engine recorders (llama.cpp and MLX) must cut a run the same way or their captures
cannot be aligned: the prefill is token step 0, split into micro-batches when the engine
computes it in pieces (llama.cpp's `n_ubatch`, MLX's prefill step), each piece one segment;
every later step decodes the greedy token of the step before, segment `decode`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

PREFILL = "prefill"
DECODE = "decode"


def prefill_segments(n_tokens: int, ubatch: int) -> list[tuple[str, int, int]]:
    """(segment, start, end) of each micro-batch of an `n_tokens` prefill.

    One piece is segment `prefill`; several are `prefill.0`, `prefill.1`, ... in order.
    """
    if n_tokens < 1:
        raise ValueError("the prompt needs at least one token")
    if ubatch < 1:
        raise ValueError(f"micro-batch size must be positive, not {ubatch}")
    bounds = [(start, min(start + ubatch, n_tokens)) for start in range(0, n_tokens, ubatch)]
    if len(bounds) == 1:
        return [(PREFILL, 0, n_tokens)]
    return [(f"{PREFILL}.{i}", start, end) for i, (start, end) in enumerate(bounds)]


def parse_token_list(text: str) -> list[int]:
    """`1,2,3` (spaces allowed) as token ids; a clear message for anything else."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError("no token ids given")
    try:
        tokens = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise ValueError(f"token id {bad!r} is not an integer") from None
    negative = [t for t in tokens if t < 0]
    if negative:
        raise ValueError(f"token id {negative[0]} is negative")
    return tokens


@dataclass(frozen=True)
class TokenSchedule:
    prompt: tuple[int, ...]
    decode_steps: int = 0
    ubatch: int = 512
    stop_tokens: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.decode_steps < 0:
            raise ValueError(f"decode steps must be >= 0, not {self.decode_steps}")
        prefill_segments(len(self.prompt), self.ubatch)

    def segments(self) -> list[tuple[str, int, int]]:
        return prefill_segments(len(self.prompt), self.ubatch)

    def describe(self) -> str:
        return " ".join(map(str, self.prompt))

    def as_provenance(self) -> dict[str, object]:
        return {
            "prompt_tokens": list(self.prompt),
            "decode_steps": self.decode_steps,
            "ubatch": self.ubatch,
            "stop_tokens": sorted(self.stop_tokens),
            "segments": [list(s) for s in self.segments()],
        }


def artifact_sha256(paths: list[Path]) -> str:
    """SHA-256 over the files' names and bytes, in the order given: a capture's weights hash."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).name.encode() + b"|")
        with Path(path).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
