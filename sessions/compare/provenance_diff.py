"""Who produced each capture, side by side; what must match for a diff to mean anything.

Different weights make every tensor differ for a reason no kernel fix can address, and a
different prompt or seed makes the runs incomparable -- both are warnings at the top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sessions.artifact_hash import WEIGHTS_ID_PREFIX
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


EXPECTED_TO_DIFFER = ("engine_name", "engine_version", "engine_commit", "compiler", "device")
"""Fields that differ by design between a port and its oracle: named in the summary, never flagged."""


SAME_FILE_WARNING = "SAME FILE: the native and the oracle are one file, so every op is bit-exact whatever it holds"
"""A gate fails such a case by its `same file` rule, which says this instead."""


@dataclass
class ProvenanceDiff:
    fields: list[ProvenanceField]
    warnings: list[str]
    summary: str = ""
    """One line first: whether the runs are comparable at all, then what differs by design."""


def diff_provenance(native: CaptureMeta, oracle: CaptureMeta, same_file: bool = False) -> ProvenanceDiff:
    """`same_file`: both sides are one file (a link, another spelling), whose comparison with
    itself is parity whatever it holds."""
    fields = [ProvenanceField(f, str(getattr(native, f)), str(getattr(oracle, f))) for f in FIELDS]
    by_name = {f.field: f for f in fields}
    warnings: list[str] = []
    if same_file:
        warnings.append(SAME_FILE_WARNING)
    weights = by_name["weights_hash"]
    if weights.native and weights.oracle and hashed_apart(weights):
        warnings.append(
            f"weights hashed by two versions of the recorders (native {weights.native}, oracle {weights.oracle}): one capture was recorded "
            "before weights were hashed by their bytes alone, so same weights cannot be confirmed (record's --weights-hash gives both one id)"
        )
    elif weights.native and weights.oracle and not weights.same:
        warnings.append(
            f"WEIGHTS HASH MISMATCH: native {weights.native} vs oracle {weights.oracle}; the runs used different weights, or the "
            "same weights in files of other formats (a GGUF and safetensors hash differently: record's --weights-hash gives both one id)"
        )
    elif not weights.native or not weights.oracle:
        missing = " and ".join(s for s, v in (("native", weights.native), ("oracle", weights.oracle)) if not v)
        warnings.append(f"weights hash not recorded by the {missing} capture; same weights cannot be confirmed")
    prompt = by_name["prompt"]
    if bool(prompt.native) != bool(prompt.oracle):
        warnings.append(f"prompt recorded by the {'native' if prompt.native else 'oracle'} capture only; the same request cannot be confirmed")
    for name in ("prompt", "seed") if prompt.native and prompt.oracle else ("seed",):
        if not by_name[name].same:
            warnings.append(f"{name} differs between the runs: they did not compute the same request")
    if (native.role, oracle.role) == ("oracle", "native"):
        warnings.append(
            "the captures look swapped: the native one was recorded as the oracle and the oracle one as the native "
            "(give the engine under test first); every 'native' and 'oracle' here follows the order given"
        )
    return ProvenanceDiff(fields, warnings, _summary(by_name))


_EARLIER_DIGEST = re.compile(r"[0-9a-f]{64}")
"""A recorder's weights hash before `sessions.artifact_hash.HASH_VERSION` 2: a bare digest."""
_DIGEST_NOW = re.compile(rf"{re.escape(WEIGHTS_ID_PREFIX)}[0-9a-f]{{64}}")


def hashed_apart(weights: ProvenanceField) -> bool:
    """Whether one capture's weights hash is a recorder's of before HASH_VERSION 2 and the other's
    of now: they differ whatever the weights, and "DIFFERENT WEIGHTS" was said of one GGUF."""
    earlier = [bool(_EARLIER_DIGEST.fullmatch(h)) for h in (weights.native, weights.oracle)]
    now = [bool(_DIGEST_NOW.fullmatch(h)) for h in (weights.native, weights.oracle)]
    return (earlier[0] and now[1]) or (now[0] and earlier[1])


def _summary(by_name: dict[str, ProvenanceField]) -> str:
    weights = by_name["weights_hash"]
    if weights.native and weights.oracle and hashed_apart(weights):
        parts = ["weights unconfirmed (hashed by two versions)"]
    elif weights.native and weights.oracle:
        parts = ["same weights" if weights.same else "DIFFERENT WEIGHTS"]
    else:
        parts = ["weights unconfirmed"]
    parts.append(_request(by_name["prompt"], by_name["seed"]))
    differ = [name.replace("_", " ") for name in EXPECTED_TO_DIFFER if not by_name[name].same]
    engine = by_name["engine_name"]
    if not engine.same:
        parts.append(f"engines differ, as expected ({engine.native or 'unnamed'} vs {engine.oracle or 'unnamed'})")
    elif differ:
        parts.append(f"{', '.join(differ)} differ")
    elif not any(by_name[name].native for name in EXPECTED_TO_DIFFER):
        parts.append("engine build and device not recorded")  # two imports: "same engine build and device" of nothing
    else:
        parts.append("same engine build and device")
    return "; ".join(parts)


def _request(prompt: ProvenanceField, seed: ProvenanceField) -> str:
    """Whether the runs computed the same request, as far as the captures say: an import records
    no prompt, and "same prompt and seed" was said of two empty ones, then "same seed" of two imports' 0."""
    if prompt.native and prompt.oracle:
        request = [name for name, field in (("prompt", prompt), ("seed", seed)) if not field.same]
        return f"{' and '.join(request)} differ{'s' if len(request) == 1 else ''}" if request else "same prompt and seed"
    said = "prompt not recorded" if not prompt.native and not prompt.oracle else f"prompt recorded by the {'native' if prompt.native else 'oracle'} capture only"
    # Without both prompts an equal seed confirms nothing (an import writes 0); a different one still says something.
    return said if seed.same else f"{said}, seed differs"
