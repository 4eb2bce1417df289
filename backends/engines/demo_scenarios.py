"""The demo scenarios: what each engine does differently, and where that shows first.

Every difference is a real change of arithmetic or control flow in one engine, so the
divergence a scenario documents is found by reading the captures, never planted in them.
docs/demo-scenarios.md explains each one; tests/test_demo_scenarios.py checks each location.

A record pair diverges, in this order of precedence, when:
- "contract": the effective (shape-selected) contract ids differ. Kernel ids and declared
  contract ids are engine-specific names and are not compared;
- "bits" / "signed-zero-only": the tensor bits differ (only where both values are zeros of
  opposite sign, for the latter);
- "dispatch-only": the bits agree but the attention calls behind the record differ (head
  ranges, call count or predicted Metal primitive);
- "post-eos-only": one side has records after the shared EOS step and the other stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.kernels import attention_contracts as contracts

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
class Divergence:
    step: int
    segment: str
    layer: int
    op: str
    kind: str


NO_DIVERGENCE = Divergence(-1, "", -1, "", "none")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    native: EngineOptions
    oracle: EngineOptions
    first_divergence: Divergence
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
            NO_DIVERGENCE,
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
            Divergence(0, "text-after", 0, "sdpa", "dispatch-only"),
        ),
        Scenario(
            "attention-contract",
            "The oracle's attention switches at Q=64 from the single-range bf16 reduction to a "
            "64x64 tiled FP32 online-softmax reduction; the native uses the single-range one for "
            "every segment. text-before (5 rows) agrees; the visual segment (72 rows) is where "
            "the effective contracts, and the bits, first differ.",
            EngineOptions(),
            EngineOptions(attention_contract=contracts.AUTO_QTILE64),
            Divergence(0, "visual", 0, "sdpa", "contract"),
        ),
        Scenario(
            "swiglu-order",
            "The native evaluates SwiGLU as (gate * up) * sigmoid(gate) instead of "
            "(gate * sigmoid(gate)) * up, under the same declared contract id. bf16 rounds each "
            "product, so the first FFN activation already differs.",
            EngineOptions(swiglu_order=SWIGLU_MUL_THEN_SIGMOID),
            EngineOptions(),
            Divergence(0, "text-before", 0, "ffn_act", "bits"),
        ),
        Scenario(
            "signed-zero",
            "The model's dead gate channels give SwiGLU outputs of exactly zero, negative where "
            "the up projection is. The native takes an extra '+0.0' copy of that tensor, which "
            "turns each -0.0 into +0.0 and changes nothing else; the down projection then "
            "absorbs the sign, so no later record differs.",
            EngineOptions(plus_zero_copy=True),
            EngineOptions(),
            Divergence(0, "text-before", 0, "ffn_act", "signed-zero-only"),
        ),
        Scenario(
            "post-eos",
            f"Both engines emit the shared EOS token at decode step {EOS_DECODE_STEP} (its id is "
            f"the oracle's greedy token there). The oracle stops; the native keeps decoding, so "
            f"its records from step {EOS_DECODE_STEP + 1} on have no partner and are invalid, "
            f"not failures.",
            EngineOptions(stop_at_eos=False),
            EngineOptions(),
            Divergence(EOS_DECODE_STEP + 1, "decode", -1, "embed", "post-eos-only"),
            uses_eos=True,
        ),
    )
}

DEFAULT_SCENARIO = "attention-contract"
