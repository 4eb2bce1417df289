"""The real cross-engine demo: llama.cpp (native) against MLX (oracle) on the same weights and tokens.

The demo's seeded Qwen3 weights are exported to a GGUF variant (`backends.engines.gguf_export`);
llama.cpp runs that file through the recorder (`backends.recorders.llama_recorder`), and MLX runs an
mlx-lm model directory holding exactly the values llama.cpp holds (the GGUF read back and
decoded by `gguf`, in float32) through the general MLX recorder. Same weights, same tokens,
two real engines: every difference the report shows is arithmetic, and where it first shows
depends on the variant (docs/demo-scenarios.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import mlx.core as mx
import numpy as np

from backends.engines.demo_model import MODEL_ID, DemoConfig, seeded_weights
from backends.engines.demo_scenarios import DECODE_STEPS
from backends.engines.gguf_export import (
    export_gguf,
    gguf_to_hf_names,
    read_gguf_weights,
    write_mlx_model_dir,
)
from backends.recorders.llama_process import iter_record_llama
from backends.recorders.mlx_recorder import iter_record_mlx
from backends.recorders.record_schedule import TokenSchedule
from sessions.progress import Progress, ProgressGenerator, run_to_end

LLAMA_SCENARIOS: dict[str, str] = {
    "llama-vs-mlx-f32": "f32",
    "llama-vs-mlx-f16": "f16",
    "llama-vs-mlx-q8_0": "q8_0",
}
"""Scenario name -> GGUF variant."""
PROMPT_LENGTH = 12
WORK_DIR = "llama-demo"


def demo_weights_f32(config: DemoConfig, seed: int) -> dict[str, np.ndarray]:
    """The demo's bf16 weights widened to float32 (exact) in mlx-lm naming."""
    with mx.stream(mx.cpu):
        return {name: np.array(array.astype(mx.float32)) for name, array in seeded_weights(config, seed).items()}


def demo_tokens(config: DemoConfig, seed: int) -> tuple[int, ...]:
    rng = np.random.default_rng([seed, 7])
    return tuple(int(t) for t in rng.integers(0, config.vocab_size, PROMPT_LENGTH))


def values_sha256(weights: dict[str, np.ndarray]) -> str:
    """SHA-256 over names, shapes and float32 bits: the same for a GGUF and the MLX directory
    holding its decoded values, so the pair's weights hashes agree exactly when the values do."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        values = np.ascontiguousarray(weights[name], dtype=np.float32)
        digest.update(f"{name}|{values.shape}|".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def prepare_variant(config: DemoConfig, weights: dict[str, np.ndarray], variant: str, directory: Path) -> tuple[Path, Path, str]:
    """(GGUF file, mlx-lm model directory of the same values, their values hash) for one variant."""
    directory.mkdir(parents=True, exist_ok=True)
    fields = dict(config.as_dict(), model_id=MODEL_ID)
    gguf_path = export_gguf(fields, weights, directory / f"demo-qwen3-tiny.{variant}.gguf", variant)
    held = gguf_to_hf_names(read_gguf_weights(gguf_path), list(weights), config.num_hidden_layers)
    return gguf_path, write_mlx_model_dir(fields, held, directory / f"mlx-{variant}"), values_sha256(held)


def iter_generate_llama(out_dir: Path, scenarios: list[str], seed: int = 0) -> ProgressGenerator[dict[str, tuple[Path, Path]]]:
    """Write each llama-vs-mlx scenario's (native, oracle) pair into `out_dir`."""
    unknown = [n for n in scenarios if n not in LLAMA_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown llama scenario(s) {', '.join(unknown)}; known: {', '.join(LLAMA_SCENARIOS)}")
    out_dir = Path(out_dir)
    config = DemoConfig()
    weights = demo_weights_f32(config, seed)
    schedule = TokenSchedule(demo_tokens(config, seed), decode_steps=DECODE_STEPS)
    results: dict[str, tuple[Path, Path]] = {}
    total = 3 * len(scenarios)
    for number, name in enumerate(scenarios):
        variant = LLAMA_SCENARIOS[name]
        gguf_path, mlx_dir, held_hash = prepare_variant(config, weights, variant, out_dir / WORK_DIR)
        yield Progress(3 * number + 1, total, f"{name}: {gguf_path.name}")
        native, oracle = out_dir / f"{name}.native.h5", out_dir / f"{name}.oracle.h5"
        extra = {"scenario": name, "gguf_variant": variant, "seed": seed}
        run_to_end(iter_record_llama(gguf_path, schedule, native, role="native", extra=extra, weights_hash=held_hash))
        yield Progress(3 * number + 2, total, f"{name}: llama.cpp native")
        run_to_end(iter_record_mlx(mlx_dir, schedule, oracle, role="oracle", extra=extra, weights_hash=held_hash))
        yield Progress(3 * number + 3, total, f"{name}: MLX oracle")
        results[name] = (native, oracle)
    return results
