"""Generate the demo capture pairs: one native and one oracle capture per scenario.

Everything follows from the seed: the weights (saved as safetensors beside the captures for
later reruns), the prompt tokens, and, for post-eos, the EOS id. All compute runs on MLX's CPU
stream, whose kernels are deterministic, so generating twice gives identical tensor bits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import platformdirs
from mlx_lm.models.cache import KVCache

from backends.demo.cut_pairs import CUT_SCENARIOS, iter_generate_cut
from backends.demo.llama_pairs import LLAMA_SCENARIOS, iter_generate_llama
from backends.engines.capture_sink import CaptureSink
from backends.engines.demo_model import (
    MODEL_ID,
    DemoConfig,
    build_oracle_model,
    save_weights,
    seeded_weights,
    weights_hash,
)
from backends.engines.demo_scenarios import (
    DECODE_STEPS,
    DEFAULT_SCENARIO,
    EOS_DECODE_STEP,
    SCENARIOS,
    SEGMENT_ROWS,
    EngineOptions,
    Scenario,
)
from backends.engines.native_engine import NativeEngine
from backends.engines.oracle_engine import OracleEngine
from backends.kernels import metal_routes
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.progress import Progress, ProgressGenerator

__all__ = ["DEFAULT_SCENARIO", "SCENARIOS", "default_demo_dir", "iter_generate", "pair_paths"]

NATIVE_ENGINE_NAME = "parity-xray demo native (llama.cpp-style)"
NATIVE_ENGINE_VERSION = "1"
VISUAL_TOKENS = 128
"""The top of the vocabulary stands in for image tokens: the visual segment draws from it."""
NO_EOS = -1


def default_demo_dir(seed: int = 0) -> Path:
    """Where `demo` keeps the captures of `seed`: a folder per seed, so that `demo --seed 7` never
    opens the seed-0 captures already there (nor a later plain `demo` the seed-7 ones)."""
    base = platformdirs.user_cache_path("parity-xray") / "demo"
    return base if seed == 0 else base / f"seed-{seed}"


def pair_paths(directory: Path, scenario: str) -> tuple[Path, Path]:
    """(native, oracle) capture paths of a scenario."""
    directory = Path(directory)
    return directory / f"{scenario}.native.h5", directory / f"{scenario}.oracle.h5"


@dataclass(frozen=True)
class DemoPrompt:
    segments: tuple[tuple[str, tuple[int, ...]], ...]

    @staticmethod
    def from_seed(config: DemoConfig, seed: int) -> "DemoPrompt":
        rng = np.random.default_rng([seed, 1])
        text_ids = config.vocab_size - VISUAL_TOKENS
        segments = []
        for name, rows in SEGMENT_ROWS.items():
            low, high = (text_ids, config.vocab_size) if name == "visual" else (0, text_ids)
            segments.append((name, tuple(int(t) for t in rng.integers(low, high, rows))))
        return DemoPrompt(tuple(segments))

    def describe(self) -> str:
        return "; ".join(f"{name}: {' '.join(map(str, ids))}" for name, ids in self.segments)


def _greedy(logits: mx.array) -> int:
    return int(mx.argmax(logits[-1]).item())


def _run(engine: OracleEngine | NativeEngine, sink: CaptureSink, prompt: DemoPrompt, options: EngineOptions, eos: int) -> list[int]:
    """Prefill segment by segment, then greedy decode; one token step per forward group."""
    writer, emitted = sink.writer, []
    for step in range(DECODE_STEPS + 1):
        sink.step = step
        segments = prompt.segments if step == 0 else (("decode", (emitted[-1],)),)
        for segment, ids in segments:
            sink.segment = segment
            logits = engine.forward(list(ids))
        token = _greedy(logits)
        emitted.append(token)
        writer.add_token(step=step, segment=sink.segment, token_id=token, is_stop=token == eos)
        writer.end_step()
        if token == eos and options.stop_at_eos:
            break
    return emitted


def _eos_for(model_weights: dict[str, mx.array], config: DemoConfig, prompt: DemoPrompt) -> int:
    """The clean oracle's greedy token at EOS_DECODE_STEP, from an uninstrumented mlx-lm run."""
    model = build_oracle_model(config, model_weights)
    cache = [KVCache() for _ in model.layers]
    for _, ids in prompt.segments:
        logits = model(mx.array(ids)[None], cache=cache)[0]
    token = _greedy(logits)
    for _ in range(EOS_DECODE_STEP):
        token = _greedy(model(mx.array([token])[None], cache=cache)[0])
    return token


def _meta(role: str, scenario: Scenario, options: EngineOptions, common: dict, prompt: DemoPrompt, seed: int) -> CaptureMeta:
    oracle = role == "oracle"
    provenance = dict(common, scenario=scenario.name, options=asdict(options))
    return CaptureMeta(
        role=role,
        engine_name="mlx-lm qwen3" if oracle else NATIVE_ENGINE_NAME,
        engine_version=mlx_lm.__version__ if oracle else NATIVE_ENGINE_VERSION,
        model_id=MODEL_ID,
        weights_hash=common["weights_sha256"],
        device="cpu",
        compiler=f"mlx {mx.__version__}",
        prompt=prompt.describe(),
        seed=seed,
        provenance=provenance,
    )


def iter_generate(
    out_dir: Path, scenarios: list[str] | None = None, seed: int = 0
) -> ProgressGenerator[dict[str, tuple[Path, Path]]]:
    """Write every requested scenario's pair into `out_dir`; yields Progress, returns the paths."""
    names = list(SCENARIOS) if scenarios is None else list(scenarios)
    llama_names = [n for n in names if n in LLAMA_SCENARIOS]
    cut_names = [n for n in names if n in CUT_SCENARIOS]
    names = [n for n in names if n not in LLAMA_SCENARIOS and n not in CUT_SCENARIOS]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        known = [*SCENARIOS, *CUT_SCENARIOS, *LLAMA_SCENARIOS]
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = 2 * len(names) + 1
    with mx.stream(mx.cpu):
        config = DemoConfig()
        weights = seeded_weights(config, seed)
        weights_path = save_weights(weights, out_dir)
        prompt = DemoPrompt.from_seed(config, seed)
        common = {
            "seed": seed,
            "config": config.as_dict(),
            "mlx_version": mx.__version__,
            "mlx_lm_version": mlx_lm.__version__,
            "weights_file": weights_path.name,
            "weights_sha256": weights_hash(weights),
            "segments": {name: list(ids) for name, ids in prompt.segments},
            "decode_steps": DECODE_STEPS,
            "metal_route_rules": metal_routes.RULES_SOURCE,
            "metal_route_version": metal_routes.RULES_VERSIONS[-1],
        }
        yield Progress(1, total, f"weights {weights_path.name}")
        results: dict[str, tuple[Path, Path]] = {}
        for number, name in enumerate(names):
            scenario = SCENARIOS[name]
            eos = _eos_for(weights, config, prompt) if scenario.uses_eos else NO_EOS
            scenario_common = dict(common, eos_token_id=eos, expected_verdict=scenario.expected.as_dict())
            native_path, oracle_path = pair_paths(out_dir, name)
            with CaptureWriter(oracle_path, _meta("oracle", scenario, scenario.oracle, scenario_common, prompt, seed), complete_only=True) as writer:
                sink = CaptureSink(writer)
                model = build_oracle_model(config, weights)
                _run(OracleEngine(model, scenario.oracle, sink), sink, prompt, scenario.oracle, eos)
            yield Progress(2 + 2 * number, total, f"{name}: oracle")
            with CaptureWriter(native_path, _meta("native", scenario, scenario.native, scenario_common, prompt, seed), complete_only=True) as writer:
                sink = CaptureSink(writer)
                _run(NativeEngine(config, weights, scenario.native, sink), sink, prompt, scenario.native, eos)
            yield Progress(3 + 2 * number, total, f"{name}: native")
            results[name] = (native_path, oracle_path)
    if cut_names:
        results.update((yield from iter_generate_cut(out_dir, cut_names, seed)))
    if llama_names:
        results.update((yield from iter_generate_llama(out_dir, llama_names, seed)))
    return results
