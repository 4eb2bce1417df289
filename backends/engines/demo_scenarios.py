"""The demo scenarios: what each engine does differently, and where that shows first.

Every difference is a real change of arithmetic or control flow in one engine, so the
divergence a scenario documents is found by reading the captures, never planted in them.
docs/demo-scenarios.md explains each one; tests/test_demo_scenarios.py checks each location.

Each scenario documents the verdict every surface must give for its pair (the word and the
first finding's kind and key), in the terms of the one verdict model, sessions.compare.verdict.
Records after the shared EOS step are invalid, not failures: the post-eos scenario is PARITY.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.kernels import attention_contracts as contracts
from sessions.compare.key import OpKey
from sessions.compare.verdict import (
    CONTRACT_MISMATCH,
    DISPATCH_ONLY,
    DIVERGENCE,
    PARITY,
    SIGNED_ZERO_ONLY,
    Kind,
)

SEGMENT_ROWS = {"text-before": 5, "visual": 72, "text-after": 6}
"""Rows per prefill segment. text-before: 5 x GQA 6 = 30 stays unchunked; visual >= 64 rows
selects the tiled contract; text-after: 6 x 6 = 36 > 32 engages the head-chunk rule (chunks
of 5 + a remainder of 1 head), which moves the call from Metal's fallback to sdpa_vector."""
DECODE_STEPS = 6
EOS_DECODE_STEP = 3
"""post-eos: the EOS id is the token the oracle emits at this decode step."""

SWIGLU_SILU_THEN_MUL = "silu_then_mul"
SWIGLU_MUL_THEN_SIGMOID = "mul_then_sigmoid"
SWIGLU_CONTRACT = "swiglu.bf16.silu_then_mul"


@dataclass(frozen=True)
class EngineOptions:
    """The knobs a scenario turns on one engine."""

    head_chunk: bool = True
    attention_contract: str = contracts.SINGLE_RANGE
    """SINGLE_RANGE everywhere, or AUTO_QTILE64 (switch to the tiled reduction at Q=64)."""
    swiglu_order: str = SWIGLU_SILU_THEN_MUL
    plus_zero_copy: bool = False
    """Take an extra `x + 0.0` copy of the SwiGLU output: numerically a no-op, but it turns
    every -0.0 into +0.0 (the seed's deep-clone trap)."""
    stop_at_eos: bool = True


@dataclass(frozen=True)
class ExpectedVerdict:
    """What every surface must say about the scenario's pair: the verdict word and its first finding."""

    word: str
    kind: Kind | None = None
    key: OpKey | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"word": self.word, "kind": None if self.kind is None else str(self.kind), "key": None if self.key is None else self.key.text()}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    native: EngineOptions
    oracle: EngineOptions
    expected: ExpectedVerdict
    uses_eos: bool = False


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "clean",
            "Both engines run the same arithmetic and the same head-chunk route: every aligned "
            "record matches bit for bit, and so do the dispatch events.",
            EngineOptions(),
            EngineOptions(),
            ExpectedVerdict(PARITY),
        ),
        Scenario(
            "head-chunk",
            "The native engine has no head-chunk route. On this CPU both take MLX's decomposed "
            "fallback, so every tensor still matches; the dispatch events differ: the oracle "
            "splits text-after attention (6 rows x GQA 6 = 36 > 32) into 4 calls per layer "
            "(5 + 1 heads per KV group), each of which Metal would run on sdpa_vector, while "
            "the native's single call would take Metal's fallback.",
            EngineOptions(head_chunk=False),
            EngineOptions(),
            ExpectedVerdict(DISPATCH_ONLY, Kind.DISPATCH_ONLY, OpKey(0, "text-after", 0, "sdpa")),
        ),
        Scenario(
            "attention-contract",
            "The oracle's attention switches at Q=64 from the single-range bf16 reduction to a "
            "64x64 tiled FP32 online-softmax reduction; the native uses the single-range one for "
            "every segment. text-before (5 rows) agrees; the visual segment (72 rows) is where "
            "the effective contracts, and the bits, first differ.",
            EngineOptions(),
            EngineOptions(attention_contract=contracts.AUTO_QTILE64),
            ExpectedVerdict(CONTRACT_MISMATCH, Kind.CONTRACT_MISMATCH, OpKey(0, "visual", 0, "sdpa")),
        ),
        Scenario(
            "swiglu-order",
            "The native evaluates SwiGLU as (gate * up) * sigmoid(gate) instead of "
            "(gate * sigmoid(gate)) * up, under the same declared contract id. bf16 rounds each "
            "product, so the first FFN activation already differs.",
            EngineOptions(swiglu_order=SWIGLU_MUL_THEN_SIGMOID),
            EngineOptions(),
            ExpectedVerdict(DIVERGENCE, Kind.DIVERGED, OpKey(0, "text-before", 0, "ffn_act")),
        ),
        Scenario(
            "signed-zero",
            "The model's dead gate channels give SwiGLU outputs of exactly zero, negative where "
            "the up projection is. The native takes an extra '+0.0' copy of that tensor, which "
            "turns each -0.0 into +0.0 and changes nothing else; the down projection then "
            "absorbs the sign, so no later record differs.",
            EngineOptions(plus_zero_copy=True),
            EngineOptions(),
            ExpectedVerdict(SIGNED_ZERO_ONLY, Kind.SIGNED_ZERO_ONLY, OpKey(0, "text-before", 0, "ffn_act")),
        ),
        Scenario(
            "post-eos",
            f"Both engines emit the shared EOS token at decode step {EOS_DECODE_STEP} (its id is "
            f"the oracle's greedy token there). The oracle stops; the native keeps decoding, so "
            f"its records from step {EOS_DECODE_STEP + 1} on have no partner and are invalid, "
            f"not failures.",
            EngineOptions(stop_at_eos=False),
            EngineOptions(),
            ExpectedVerdict(PARITY),
            uses_eos=True,
        ),
    )
}

DEFAULT_SCENARIO = "attention-contract"
