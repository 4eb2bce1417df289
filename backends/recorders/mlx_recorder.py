"""`parity-xray record mlx MODEL_DIR`: record any mlx-lm model from a local directory.

This is the demo oracle's instrumentation (`backends.engines.oracle_engine.OracleEngine`) taken off
Qwen3: instead of a fixed list of Qwen3 classes it wraps the classes of the model's own leaf
modules (Linear, RMSNorm, RoPE, Embedding, quantized layers, ...) and of its decoder layers,
found by walking `named_modules()`. Module outputs, the derived attention-residual and
activation stages, and every SDPA call with its dispatch events are recorded exactly as the
demo oracle records them, with mlx-lm's own SDPA route (no head chunking); so are the cells
each call wrote into a plain KV cache (`kv_cache.keys`, `kv_cache.values`: the cache bits a
llama.cpp recording's written cells compare with). A model whose logits come from a tied
embedding (no `lm_head` module) gets its logits recorded as `lm_head`.

Models load with `mlx_lm.utils.load_model` from the directory; nothing is ever downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.models.cache import KVCache, make_prompt_cache

from backends.engines.capture_sink import CaptureSink
from backends.engines.demo_scenarios import EngineOptions
from backends.engines.mlx_device import device_of
from backends.engines.oracle_engine import OracleEngine, layer_of
from backends.recorders.model_config import (
    MAX_CONFIG_BYTES,
    MLX_WEIGHT_FILES,
    hf_config,
)
from backends.recorders.record_schedule import (
    DECODE,
    TokenSchedule,
    batch_prompts,
    check_batch,
    check_run_size,
)
from sessions.artifact_hash import artifact_sha256, weights_id
from sessions.capture.meta import CaptureMeta
from sessions.capture.writer import CaptureWriter
from sessions.machine import physical_memory
from sessions.progress import Progress, ProgressGenerator
from sessions.side_file import parse_problem, read_side_file, regular_file_problem

MLX_RECORDING = EngineOptions(head_chunk=False)
"""mlx-lm as it ships: one SDPA call per attention, MLX's own route."""
LOGITS_NAME = "lm_head"
CACHE_KEYS = "model.layers.{layer}.kv_cache.keys"
CACHE_VALUES = "model.layers.{layer}.kv_cache.values"
"""The cells each call wrote into a layer's KV cache, [batch, kv_heads, rows, dim] as mlx-lm stores them."""
CacheUpdate = Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]
"""`KVCache.update_and_fetch`: this call's keys and values in, every cached key and value out."""


class ModelDirError(ValueError):
    """A model directory that cannot be recorded, with the path and what is wrong."""


def load_local_model(directory: Path) -> tuple[nn.Module, dict[str, Any]]:
    """The mlx-lm model of a local directory (config.json + model*.safetensors); never downloads."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirError(f"{directory}: not a directory (record mlx takes a local mlx-lm model directory)")
    problem = regular_file_problem(directory / "config.json")
    if problem is not None:  # a FIFO or a folder there read as "no config.json"
        raise ModelDirError(f"{directory / 'config.json'}: {problem} (an mlx-lm model directory holds its config.json)")
    if not list(directory.glob(MLX_WEIGHT_FILES)):
        raise ModelDirError(f"{directory}: no {MLX_WEIGHT_FILES} weights (the files mlx-lm loads)")
    try:
        config = json.loads(read_side_file(directory / "config.json", MAX_CONFIG_BYTES).decode("utf-8"))
    except OSError as exc:
        raise ModelDirError(f"{directory / 'config.json'}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise ModelDirError(f"{directory / 'config.json'}: not JSON ({parse_problem(exc)})") from None
    if not isinstance(config, dict):
        raise ModelDirError(f"{directory / 'config.json'}: not a JSON object")
    _check_sizes(config, directory)
    from mlx_lm.utils import load_model

    try:
        return load_model(directory)
    except (ValueError, KeyError, TypeError, AttributeError, FileNotFoundError, ArithmeticError, RuntimeError) as exc:
        # TypeError, AttributeError: a config field of the wrong type ("num_hidden_layers": "2");
        # RuntimeError: MLX's own words for weights it cannot read, which name no file
        raise ModelDirError(f"{directory}: mlx-lm cannot load it ({type(exc).__name__}: {exc})") from None


SIZE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size", "vocab_size", "head_dim")
"""config.json sizes mlx-lm builds the model from before it reads a weight."""


def _check_sizes(config: dict[str, Any], directory: Path) -> None:
    """Refuse sizes mlx-lm would build a model from before any weight says otherwise: it divided by
    `num_attention_heads: 0`, and built ten million layers (3.5 GB in 20 s, growing) for a
    `num_hidden_layers` the two-layer weights never had."""
    where = directory / "config.json"
    for name in SIZE_FIELDS:
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelDirError(f"{where}: {name} must be a whole number of at least 1, not {json.dumps(value)[:40]}")
    layers = config.get("num_hidden_layers")
    held = _weight_layers(directory)
    if isinstance(layers, int) and held is not None and layers > held:
        raise ModelDirError(f"{where}: num_hidden_layers is {layers}, but the weights hold {held} layer(s) (model.layers.0 .. {held - 1})")


def _weight_layers(directory: Path) -> int | None:
    """How many decoder layers the safetensors files hold weights of (`model.layers.N.`), read from
    their headers; None when they name none that way or cannot be read (mlx-lm then says why)."""
    from safetensors import SafetensorError, safe_open

    found = -1
    for path in sorted(directory.glob(MLX_WEIGHT_FILES)):
        try:
            with safe_open(str(path), framework="numpy") as handle:
                names = list(handle.keys())
        except (SafetensorError, OSError, ValueError):
            return None
        for name in names:
            parts = name.split(".")
            for at in range(len(parts) - 2):
                if parts[at] == "layers" and parts[at + 1].isdigit():
                    found = max(found, int(parts[at + 1]))
                    break
    return found + 1 if found >= 0 else None


def weights_sha256(directory: Path) -> str:
    """The artifact hash of the safetensors files mlx-lm loads (an adapter beside them is not the model's weights)."""
    return artifact_sha256(sorted(Path(directory).glob(MLX_WEIGHT_FILES)))


def _classes(model: nn.Module) -> tuple[tuple[type[nn.Module], ...], tuple[type[nn.Module], ...]]:
    """(leaf module classes, decoder layer classes) of the model's module tree."""
    layers = tuple(dict.fromkeys(type(m) for m in getattr(model, "layers", [])))
    leaves = tuple(
        dict.fromkeys(type(m) for name, m in model.named_modules() if name and not m.children() and type(m) not in layers)
    )
    return leaves, layers


class MlxRecorder(OracleEngine):
    """An `OracleEngine` over any mlx-lm model: the wrapped classes come from the model."""

    def __init__(self, model: nn.Module, sink: CaptureSink) -> None:
        super().__init__(model, MLX_RECORDING, sink)  # type: ignore[arg-type]
        self.cache = make_prompt_cache(model)
        self._leaves, self._layers = _classes(model)

    def forward_rows(self, rows: list[list[int]]) -> mx.array:
        """One call over a batch of equally long requests; logits [batch, rows, vocab]."""
        with self._instrumented():
            logits = self.model(mx.array(rows), cache=self.cache)
        if LOGITS_NAME not in self.names.values():
            self.sink.tensor(LOGITS_NAME, logits)
        return logits

    @contextmanager
    def _instrumented(self) -> Iterator[None]:
        originals: dict[type[nn.Module], Callable[..., Any]] = {cls: cls.__call__ for cls in self._leaves + self._layers}
        for cls in self._leaves:
            cls.__call__ = self._recording(originals[cls])
        for cls in self._layers:
            cls.__call__ = self._entering_layer(self._recording(originals[cls]))
        mx.fast.scaled_dot_product_attention = self._spy_sdpa
        caches = [(layer, cache) for layer, cache in enumerate(self.cache) if type(cache) is KVCache]
        for layer, cache in caches:
            cache.update_and_fetch = self._recording_cache(layer, cache.update_and_fetch)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for _, cache in caches:
                del cache.update_and_fetch
            mx.fast.scaled_dot_product_attention = self._sdpa
            for cls, original in originals.items():
                cls.__call__ = original

    def _recording_cache(self, layer: int, original: CacheUpdate) -> CacheUpdate:
        """The cells a call wrote into layer `layer`'s KV cache, read back from the cache (`CACHE_KEYS`,
        `CACHE_VALUES`): mlx-lm's plain `KVCache` keeps every cell in order, so they are the last
        rows of what it returns. Other caches (rotating, quantized) store cells elsewhere and are
        not recorded."""

        def update_and_fetch(keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
            stored_keys, stored_values = original(keys, values)
            rows = keys.shape[2]
            self.sink.tensor(CACHE_KEYS.format(layer=layer), stored_keys[..., -rows:, :], layer=layer)
            self.sink.tensor(CACHE_VALUES.format(layer=layer), stored_values[..., -rows:, :], layer=layer)
            return stored_keys, stored_values

        return update_and_fetch

    def _entering_layer(self, recording: Callable[..., Any]) -> Callable[..., Any]:
        """The SDPA spy names its record after the layer whose forward is running."""

        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self._attention_layer = layer_of(self.names.get(id(module), ""))
            return recording(module, *args, **kwargs)

        return call


def run_schedule(recorder: MlxRecorder, schedule: TokenSchedule, rows: list[list[int]], request: int) -> ProgressGenerator[list[int]]:
    """Prefill (segment by segment), then greedy decode of every request in `rows` (one, or a
    batch whose row `request` is the request recorded in the token table)."""
    sink, writer = recorder.sink, recorder.sink.writer
    emitted: list[list[int]] = []
    total = schedule.decode_steps + 1
    for step in range(total):
        sink.step = step
        at = len(schedule.prompt) + step - 1
        pieces = [(s, a, [r[a:b] for r in rows]) for s, a, b in schedule.segments()] if step == 0 else [(DECODE, at, [[t] for t in emitted[-1]])]
        for segment, first, ids in pieces:
            sink.segment, sink.position = segment, first
            logits = recorder.forward_rows(ids)
        tokens = [int(t) for t in mx.argmax(logits[:, -1], axis=-1).tolist()]
        emitted.append(tokens)
        token = tokens[request]
        stop = token in schedule.stop_tokens
        writer.add_token(step=step, segment=sink.segment, token_id=token, is_stop=stop)
        writer.end_step()
        yield Progress(step + 1, total, f"step {step}")
        if stop:
            break
    return [tokens[request] for tokens in emitted]


def plain_run_mlx(model_dir: Path, schedule: TokenSchedule, device: str = "cpu") -> list[int]:
    """The schedule through mlx-lm with nothing recorded: the baseline a recording's cost is measured against."""
    with mx.stream(device_of(device)):
        model, _ = load_local_model(Path(model_dir))
        cache = make_prompt_cache(model)
        emitted: list[int] = []
        for step in range(schedule.decode_steps + 1):
            pieces = [list(schedule.prompt[a:b]) for _, a, b in schedule.segments()] if step == 0 else [[emitted[-1]]]
            for ids in pieces:
                logits = model(mx.array(ids)[None], cache=cache)
            emitted.append(int(mx.argmax(logits[0, -1]).item()))
            if emitted[-1] in schedule.stop_tokens:
                break
    return emitted


def iter_record_mlx(
    model_dir: Path,
    schedule: TokenSchedule,
    out: Path,
    *,
    role: str = "oracle",
    device: str = "cpu",
    extra: dict[str, Any] | None = None,
    weights_hash: str | None = None,
    batch: int = 1,
    batch_row: int = 0,
) -> ProgressGenerator[list[int]]:
    """Record one run of the model in `model_dir` into `out`; yields Progress, returns the emitted tokens.

    `weights_hash` overrides the capture's weights hash (default: the safetensors files' SHA-256,
    which provenance keeps either way). With `batch` > 1 the prompt runs as row `batch_row` of a
    batch of other requests (`batch_prompts`): the batch-invariance check."""
    check_batch(batch, batch_row)
    model_dir = Path(model_dir)
    stream = device_of(device)
    with mx.stream(stream):
        model, config = load_local_model(model_dir)
        vocab = int(config.get("vocab_size", 0))
        outside = [t for t in schedule.prompt if vocab and t >= vocab]
        if outside:
            raise ModelDirError(f"{model_dir}: token id {outside[0]} is outside the model's vocabulary ({vocab} ids)")
        sizes = hf_config(config)  # a multimodal model's language model keeps them in text_config
        check_run_size(schedule, batch, sizes, 4 if sizes.get("torch_dtype") == "float32" else 2, physical_memory())
        digest = weights_sha256(model_dir)
        provenance = {
            "recorder": "parity-xray record mlx",
            "model_dir": str(model_dir.resolve()),
            "model_type": config.get("model_type", ""),
            "config": hf_config(config),
            "weights_sha256": digest,
            "mlx_version": mx.__version__,
            "mlx_lm_version": mlx_lm.__version__,
            "head_chunk": False,
            "batch": batch,
            "batch_row": batch_row,
            **schedule.as_provenance(),
            **(extra or {}),
        }
        meta = CaptureMeta(
            role=role,
            engine_name=f"mlx-lm {config.get('model_type', '')}".strip(),
            engine_version=mlx_lm.__version__,
            model_id=model_dir.name,
            weights_hash=weights_hash or weights_id(digest),
            device=device,
            compiler=f"mlx {mx.__version__}",
            prompt=schedule.describe(),
            provenance=provenance,
            batch_size=batch,
            batch_row=batch_row,
        )
        rows = batch_prompts(schedule.prompt, batch, batch_row, vocab or 1)
        with CaptureWriter(out, meta) as writer:
            sink = CaptureSink(writer)
            emitted = yield from run_schedule(MlxRecorder(model, sink), schedule, rows, batch_row)
    return emitted
