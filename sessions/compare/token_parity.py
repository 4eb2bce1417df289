"""Greedy-token parity, step by step, stopping at the first shared EOS/stop token.

After both engines emit the same stop token the request is over: whatever either computes
afterwards is post-EOS and invalid, so differences there are reported as such and never
count as parity failures (the Qwen3-VL record's first confirmed defect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sessions.bits.dtypes import as_bit_pattern, as_values
from sessions.bits.element_info import describe
from sessions.capture import format as cf

MATCH = "match"
DIFFER = "differ"
POST_EOS = "post_eos"
MISSING = "missing"


@dataclass
class TopEntry:
    token_id: int
    decimal: str
    hex: str


@dataclass
class StepLogits:
    """How the two sides' last logits row of a step agree, beyond which token wins.

    llama.cpp's `--kl-divergence` reports the same family of figures (KLD, the chosen token's
    change, "same top"): equal greedy tokens with different logits are a near miss, not a match."""

    native_top: list[TopEntry] = field(default_factory=list)
    oracle_top: list[TopEntry] = field(default_factory=list)
    identical: bool = True
    """The two rows are bit-identical."""
    delta_logit: float = 0.0
    """native - oracle logit of the oracle's greedy token."""
    kl_divergence: float = 0.0
    """KL(P_oracle || P_native) of the softmax over the whole row, in nats, float64."""
    top_overlap: float = 1.0
    """Share of the oracle's top-k token ids that are in the native's top-k."""


    def kl_text(self, short: bool = False) -> str:
        """The KL divergence as every surface writes it (`short`: in a table cell); a row holding a
        NaN or an infinity has none ("KL nan nats")."""
        if not math.isfinite(self.kl_divergence):
            return "undefined" if short else "undefined (a NaN or an infinity in the logits)"
        return f"{self.kl_divergence:.2e}" if short else f"{self.kl_divergence:.3g} nats"

    def summary(self) -> str:
        if self.identical:
            return "logits bit-identical"
        return f"logits differ: Δlogit {self.delta_logit:+.4g} at the oracle's token, KL {self.kl_text()}, top-{len(self.oracle_top)} overlap {self.top_overlap:.0%}"


def step_word(step: TokenStep) -> str:
    """A step's status for people: equal tokens over different logits is a near miss, never just "match"."""
    if step.status == MATCH and step.logits is not None and not step.logits.identical:
        return "match, logits differ"
    return {MATCH: "match", DIFFER: "differ", MISSING: "missing", POST_EOS: "post-EOS"}[step.status]


def token_words(token: int | None, stop: bool) -> str:
    """A step's token with its stop flag, for a sentence or a table cell: the same token may
    differ only in being a stop, and a run that ended has none."""
    return f"{'none' if token is None else token}{' (stop)' if stop else ''}"


def logit_agreement(native_bits: np.ndarray, oracle_bits: np.ndarray, logical: str, k: int) -> StepLogits:
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN or Inf logit is a value like any other here
        native, oracle = as_values(native_bits, logical).astype(np.float64), as_values(oracle_bits, logical).astype(np.float64)
    n_top, o_top = top_k(native, native_bits, logical, k), top_k(oracle, oracle_bits, logical, k)
    identical = bool(np.array_equal(as_bit_pattern(native_bits, logical), as_bit_pattern(oracle_bits, logical)))
    if identical:
        return StepLogits(n_top, o_top)
    chosen = o_top[0].token_id if o_top else 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_p = oracle - np.logaddexp.reduce(oracle)
        log_q = native - np.logaddexp.reduce(native)
        kl = float(np.sum(np.exp(log_p) * (log_p - log_q)))
    overlap = len({e.token_id for e in n_top} & {e.token_id for e in o_top}) / max(len(o_top), 1)
    return StepLogits(n_top, o_top, False, float(native[chosen] - oracle[chosen]), kl, overlap)


@dataclass
class TokenStep:
    step: int
    native_token: int | None
    oracle_token: int | None
    native_stop: bool
    oracle_stop: bool
    status: str
    """match, differ, missing (one side has no token), or post_eos (after the shared stop)."""
    logits: StepLogits | None = None
    """The step's logits agreement, when its logits were captured on both sides."""
    differs: bool = False
    """Whether the tokens or stop flags differ -- kept for post-EOS steps too, for information."""
    segment: str = ""
    """The segment whose last row emitted the token (native's, else oracle's): where its logits are."""


@dataclass
class TokenParity:
    steps: list[TokenStep]
    shared_eos_step: int | None
    first_divergence_step: int | None
    compared_steps: int

    def outcome(self) -> str:
        """What the greedy tokens did, as every surface says it: with no step compared (one run
        recorded no token table) the token header said "tokens agree" of nothing."""
        if self.first_divergence_step is not None:
            return f"tokens first differ at step {self.first_divergence_step}"
        return "greedy tokens agree" if self.compared_steps else "no token step compared"


def tokens_by_step(table: np.ndarray) -> dict[int, tuple[int, bool]]:
    """The emitted token of each step (the last row of a step wins: its last segment)."""
    out: dict[int, tuple[int, bool]] = {}
    for row in table:
        out[int(row["step"])] = (int(row["token_id"]), bool(row["is_stop"]))
    return out


def segments_by_step(table: np.ndarray) -> dict[int, str]:
    """The segment that emitted each step's token (the last row of a step wins, as in tokens_by_step)."""
    return {int(row["step"]): cf.decode_field(row["segment"]) for row in table}


def shared_eos_step(native: dict[int, tuple[int, bool]], oracle: dict[int, tuple[int, bool]]) -> int | None:
    """The first step at which both sides emit the same token and both mark it as a stop."""
    for step in sorted(set(native) & set(oracle)):
        if native[step] == oracle[step] and native[step][1]:
            return step
    return None


def top_k(values: np.ndarray, bits: np.ndarray, logical: str, k: int) -> list[TopEntry]:
    """The k largest logits (ties by lower token id, NaNs last) with their stored bits."""
    as_float = np.asarray(values, dtype=np.float64)
    order = np.lexsort((np.arange(as_float.size), np.where(np.isnan(as_float), np.inf, -as_float)))[:k]
    entries = []
    for token in order:
        info = describe(bits[token], logical)
        entries.append(TopEntry(int(token), info.decimal, info.hex))
    return entries


def compare_tokens(
    native_table: np.ndarray,
    oracle_table: np.ndarray,
    logits: dict[int, StepLogits],
) -> TokenParity:
    """Per-step comparison; `logits` holds each step's logits agreement when captured."""
    native, oracle = tokens_by_step(native_table), tokens_by_step(oracle_table)
    segments = {**segments_by_step(oracle_table), **segments_by_step(native_table)}
    eos = shared_eos_step(native, oracle)
    steps: list[TokenStep] = []
    first_divergence = None
    for step in sorted(set(native) | set(oracle)):
        n, o = native.get(step), oracle.get(step)
        differs = n != o
        if eos is not None and step > eos:
            status = POST_EOS
        elif n is None or o is None:
            status = MISSING
        else:
            status = DIFFER if differs else MATCH
        if status in (DIFFER, MISSING) and first_divergence is None:
            first_divergence = step
        steps.append(
            TokenStep(
                step,
                None if n is None else n[0],
                None if o is None else o[0],
                bool(n and n[1]),
                bool(o and o[1]),
                status,
                logits.get(step),
                differs,
                segments.get(step, ""),
            )
        )
    compared = sum(1 for s in steps if s.status != POST_EOS)
    return TokenParity(steps, eos, first_divergence, compared)
