"""Demo pairs of one engine run twice, cut or batched differently: real runs, nothing planted.

Each pair records the same tiny model on the same prompt with the real MLX or llama.cpp
recorder, changing only how the prompt is fed: one combined prefill against three segments,
llama.cpp micro-batches, the prompt's tail fed token by token, the request alone against row
3 of a batch of 8, or the same run twice. Whatever the comparison finds is what the engine
does on this machine; docs/demo-scenarios.md says what that was, and
tests/test_cut_scenarios.py checks it still is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.demo.llama_pairs import demo_weights_f32, prepare_variant
from backends.engines.demo_model import MODEL_ID, DemoConfig
from backends.engines.demo_scenarios import SEGMENT_ROWS, ExpectedVerdict
from backends.engines.gguf_export import write_mlx_model_dir
from backends.recorders.record_schedule import TokenSchedule
from sessions.compare.key import OpKey
from sessions.compare.verdict import DIVERGENCE, PARITY, Kind
from sessions.progress import Progress, ProgressGenerator, run_to_end

DECODE_STEPS = 3
WORK_DIR = "cut-demo"


@dataclass(frozen=True)
class Feed:
    """How one run feeds the prompt: its cut into calls, micro-batch size, fed tail and batch."""

    cut: tuple[tuple[str, int], ...] = ()
    ubatch: int = 512
    feed_last: int = 0
    batch: int = 1
    batch_row: int = 0


@dataclass(frozen=True)
class CutScenario:
    engine: str
    """"mlx" or "llama" (the llama extra)."""
    native: Feed
    oracle: Feed
    description: str
    expected: ExpectedVerdict = field(default_factory=lambda: ExpectedVerdict(PARITY))
    """What the comparison found on the machines this was measured on (parity is a finding too)."""


SEGMENTED = tuple(SEGMENT_ROWS.items())
PROMPT_LENGTH = sum(SEGMENT_ROWS.values())

CUT_SCENARIOS: dict[str, CutScenario] = {
    "segmented-vs-combined": CutScenario(
        "mlx", Feed(), Feed(cut=SEGMENTED),
        "MLX: one combined prefill of 83 tokens vs text-before 5, visual 72, text-after 6 (the seed's Q=5/1008/14 cut)",
    ),
    "prefill-vs-decode": CutScenario(
        "mlx", Feed(), Feed(feed_last=4),
        "MLX: the prompt's last 4 tokens inside the prefill vs fed one call each, as decode feeds them",
    ),
    "batch-row": CutScenario(
        "mlx", Feed(), Feed(batch=8, batch_row=3),
        "MLX: the request alone vs row 3 of a batch of 8 requests (batch invariance)",
    ),
    "repeat": CutScenario("mlx", Feed(), Feed(), "MLX: the same run twice (run-to-run determinism)"),
    "ubatch": CutScenario(
        "llama", Feed(), Feed(ubatch=16),
        "llama.cpp: the 83-token prompt in one micro-batch vs n_ubatch 16 (six micro-batches)",
    ),
    "prefill-vs-decode-llama": CutScenario(
        "llama", Feed(), Feed(feed_last=4),
        "llama.cpp: the prompt's last 4 tokens inside the prefill vs fed one llama_decode each",
        ExpectedVerdict(DIVERGENCE, Kind.DIVERGED, OpKey(0, "prefill", 0, "q_proj", 0, (79, 80))),
    ),
    "batch-row-llama": CutScenario(
        "llama", Feed(), Feed(batch=8, batch_row=3),
        "llama.cpp: the request alone vs sequence 3 of a batch of 8 (one KV cache stream per sequence)",
        ExpectedVerdict(DIVERGENCE, Kind.DIVERGED, OpKey(1, "decode", 0, "q_proj", 0)),
    ),
    "repeat-llama": CutScenario("llama", Feed(), Feed(), "llama.cpp: the same run twice (run-to-run determinism)"),
}


def cut_prompt(config: DemoConfig, seed: int) -> tuple[int, ...]:
    rng = np.random.default_rng([seed, 11])
    return tuple(int(t) for t in rng.integers(0, config.vocab_size, PROMPT_LENGTH))


def _schedule(prompt: tuple[int, ...], feed: Feed) -> TokenSchedule:
    return TokenSchedule(prompt, DECODE_STEPS, feed.ubatch, cut=feed.cut, feed_last=feed.feed_last)


def _record(scenario: CutScenario, feed: Feed, model: Path, prompt: tuple[int, ...], out: Path, role: str, extra: dict[str, object], held: str) -> None:
    schedule = _schedule(prompt, feed)
    if scenario.engine == "llama":
        from backends.recorders.llama_process import iter_record_llama

        run_to_end(iter_record_llama(model, schedule, out, role=role, extra=extra, weights_hash=held, batch=feed.batch, batch_row=feed.batch_row))
        return
    from backends.recorders.mlx_recorder import iter_record_mlx

    run_to_end(iter_record_mlx(model, schedule, out, role=role, extra=extra, weights_hash=held, batch=feed.batch, batch_row=feed.batch_row))


def iter_generate_cut(out_dir: Path, scenarios: list[str], seed: int = 0) -> ProgressGenerator[dict[str, tuple[Path, Path]]]:
    """Write each named cut scenario's (native, oracle) pair into `out_dir`."""
    unknown = [n for n in scenarios if n not in CUT_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(CUT_SCENARIOS)}")
    out_dir = Path(out_dir)
    config = DemoConfig()
    weights = demo_weights_f32(config, seed)
    prompt = cut_prompt(config, seed)
    work = out_dir / WORK_DIR
    fields = dict(config.as_dict(), model_id=MODEL_ID)
    models: dict[str, tuple[Path, str]] = {}
    results: dict[str, tuple[Path, Path]] = {}
    for number, name in enumerate(scenarios):
        scenario = CUT_SCENARIOS[name]
        if scenario.engine not in models:
            if scenario.engine == "llama":
                gguf, _, held = prepare_variant(config, weights, "f32", work)
                models["llama"] = (gguf, held)
            else:
                models["mlx"] = (write_mlx_model_dir(fields, weights, work / "mlx-f32"), "")
        model, held = models[scenario.engine]
        native, oracle = out_dir / f"{name}.native.h5", out_dir / f"{name}.oracle.h5"
        extra: dict[str, object] = {"scenario": name, "seed": seed}
        _record(scenario, scenario.native, model, prompt, native, "native", extra, held)
        _record(scenario, scenario.oracle, model, prompt, oracle, "oracle", extra, held)
        yield Progress(number + 1, len(scenarios), f"{name}: {scenario.engine} runs")
        results[name] = (native, oracle)
    return results
