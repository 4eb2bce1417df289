"""Who produced each capture, side by side; what must match for a diff to mean anything.

Different weights make every tensor differ for a reason no kernel fix can address, and a
different prompt or seed makes the runs incomparable -- both are warnings at the top.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.capture.meta import CaptureMeta

FIELDS = ("engine_name", "engine_version", "engine_commit", "model_id", "weights_hash", "compiler", "device", "prompt", "seed")


@dataclass
class ProvenanceField:
    field: str
    native: str
    oracle: str

    @property
    def same(self) -> bool:
        return self.native == self.oracle


@dataclass
class ProvenanceDiff:
    fields: list[ProvenanceField]
    warnings: list[str]


def diff_provenance(native: CaptureMeta, oracle: CaptureMeta) -> ProvenanceDiff:
    fields = [ProvenanceField(f, str(getattr(native, f)), str(getattr(oracle, f))) for f in FIELDS]
    by_name = {f.field: f for f in fields}
    warnings: list[str] = []
    weights = by_name["weights_hash"]
    if weights.native and weights.oracle and not weights.same:
        warnings.append(f"WEIGHTS HASH MISMATCH: native {weights.native} vs oracle {weights.oracle}; the runs used different weights")
    elif not weights.native or not weights.oracle:
        missing = " and ".join(s for s, v in (("native", weights.native), ("oracle", weights.oracle)) if not v)
        warnings.append(f"weights hash not recorded by the {missing} capture; same weights cannot be confirmed")
    for name in ("prompt", "seed"):
        if not by_name[name].same:
            warnings.append(f"{name} differs between the runs: they did not compute the same request")
    return ProvenanceDiff(fields, warnings)
