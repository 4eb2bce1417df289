"""What a comparison is asked to do: tolerances, profiles, alignment mode, budget, parallelism.

Options cross process boundaries as JSON (the viewer's comparison child, parallel workers, gate
cases), so they are plain values with an exact inverse of `dataclasses.asdict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sessions.compare.align import AlignOverride, ManualBreak, ManualPair
from sessions.compare.key import OpKey, RecordKey
from sessions.compare.tensor_diff import Tolerance
from sessions.compare.tolerance_bounds import drop_zero_bounds
from sessions.compare.tolerance_policy import TolerancePolicy


@dataclass(frozen=True)
class CompareOptions:
    atol: float | None = None
    rtol: float | None = None
    max_ulp: int | None = None
    native_profile: str | None = None
    """Built-in profile name or TOML path; None detects it from the record names."""
    oracle_profile: str | None = None
    top_k: int = 5
    chunk_bytes: int = 4 * 1024 * 1024
    """Bytes of one side read per step, into a buffer reused for the whole comparison. It bounds
    memory, and a chunk this small is still in cache when it is compared. CPU seconds to compare
    a 1 GB pair from the page cache: 2 MiB 0.24, 4 MiB 0.22, 8 MiB 0.25, 16 MiB 0.26, 64 MiB
    0.47 (its buffers' page faults)."""
    overrides: tuple[AlignOverride, ...] = ()
    """The user's manual pairings and breaks (sessions.compare.align.ManualPair / ManualBreak), in the order made."""
    policy: TolerancePolicy | None = None
    """Per-op, per-dtype tolerances (sessions.compare.tolerance_policy); its rules win over atol/rtol/max_ulp."""
    max_steps: int | None = None
    """Compare only token steps 0 .. max_steps-1 (a gate's token budget, e.g. the first 64 of a
    384-step run): later steps' records and tokens are left out before alignment and never read,
    as if both captures had ended there. None: every captured step."""
    alignment: str = "auto"
    """One of sessions.compare.align.ALIGN_MODES: pair records by the same forward calls, by token
    position (runs cut differently), or `auto`: by calls when both runs made the same calls."""
    workers: int = 0
    """Processes that may compare pairs at once: 0 picks one per core (behind a window, one below 4
    cores: sessions.compare.parallel_compare.MIN_CORES_BEHIND_A_WINDOW), 1 compares in
    this process (a gate's cases do: its cluster already runs one case per core). Workers start
    only once this process would take over a second for the rest (sessions.compare.parallel_compare)."""

    def __post_init__(self) -> None:
        drop_zero_bounds(self)

    @cached_property
    def tolerance(self) -> Tolerance:
        """Built once: every pair of a run asks for it (`tolerance_for`)."""
        return Tolerance(self.atol, self.rtol, self.max_ulp)

    def tolerance_for(self, key: OpKey, dtype: str) -> Tolerance:
        """A policy rule that fits the pair, else the command-line bounds, else the policy's default."""
        if self.policy is None:
            return self.tolerance
        rule = self.policy.rule_for(key, dtype)
        if rule is not None:
            return rule.tolerance
        return self.tolerance if not self.tolerance.is_bit_exact else self.policy.default.tolerance

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompareOptions:
        """The inverse of `dataclasses.asdict` (options cross a process boundary as JSON): a dict
        override with an `oracle` record is a ManualPair, one without a ManualBreak."""

        def override(o: dict[str, Any]) -> AlignOverride:
            native = RecordKey(**o["native"])
            if "oracle" in o:
                return ManualPair(native, RecordKey(**o["oracle"]), o["reason"])
            return ManualBreak(native, o["reason"])

        policy = data.get("policy")
        return cls(**{
            **data,
            "overrides": tuple(override(o) for o in data.get("overrides", ())),
            "policy": None if policy is None else TolerancePolicy.from_dict(policy),
        })
