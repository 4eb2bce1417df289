"""An op's captured inputs, found by canonical key, with the KV history and weights it needs.

A rerun recomputes one record from the records that fed it, so this module knows the
decoder's dataflow in canonical ops (docs/architecture.md): q_proj reads attn_norm, sdpa
reads q_rope plus every k_rope and v_proj of its layer so far (the KV cache, gathered
from earlier segments and steps in execution order), and so on. Records are found through
the same profiles and alignment keys the comparison uses, and read in canonical layout, so
native and oracle captures serve alike. Weights come from the capture itself (a record
named like the weight) or from the weights file the capture references (safetensors, or
GGUF decoded with the gguf package's dequantizers -- never `mx.load`, whose K-quant decode
is wrong). Whatever is missing is named: which op, which layer, which side.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import mlx.core as mx
import numpy as np

from backends.engines.capture_sink import to_numpy_bits
from backends.recorders.model_config import (
    MLX_WEIGHT_FILES,
    ModelConfigError,
    weights_file_config,
)
from sessions.capture.format import RERUN_ROLE
from sessions.capture.reader import Capture
from sessions.compare.key import OpKey
from sessions.compare.mapped_record import MappedRecord
from sessions.compare.positions import span_text
from sessions.compare.profiles import STAGE_OF
from sessions.compare.unaligned import UnalignedRecord
from sessions.printable import printable

LAYER_INPUT = "layer_input"
"""Pseudo-op: the residual stream entering a layer (embed for layer 0, else the previous layer_out)."""

OP_INPUTS: dict[str, tuple[str, ...]] = {
    "attn_norm": (LAYER_INPUT,),
    "q_proj": ("attn_norm",),
    "k_proj": ("attn_norm",),
    "v_proj": ("attn_norm",),
    "q_norm": ("q_proj",),
    "k_norm": ("k_proj",),
    "q_rope": ("q_norm",),
    "k_rope": ("k_norm",),
    "k_cache": ("k_rope",),
    "v_cache": ("v_proj",),
    "sdpa": ("q_rope", "k_rope", "v_proj"),
    "o_proj": ("sdpa",),
    "attn_residual": (LAYER_INPUT, "o_proj"),
    "ffn_norm": ("attn_residual",),
    "ffn_gate": ("ffn_norm",),
    "ffn_up": ("ffn_norm",),
    "ffn_act": ("ffn_gate", "ffn_up"),
    "ffn_down": ("ffn_act",),
    "layer_out": ("attn_residual", "ffn_down"),
    "final_norm": (LAYER_INPUT,),
    "logits": ("final_norm",),
}
"""The captured inputs each canonical op reads (embed reads token ids, which are not rerun)."""
_STAGE_TEXT: dict[str, str] = {
    "attn_scores": "the attention scores over the engine's padded cache",
    "attn_probs": "the attention probabilities over the engine's padded cache",
    "attn_pv": "the per-head attention output before the head merge",
}
"""What each attention stage holds, for its reason; the `*_rms` stages are RMSNorms before their weight multiply."""
NOT_RERUNNABLE: dict[str, str] = {
    "embed": "its input is token ids, not a captured tensor",
    **{
        stage: f"{_STAGE_TEXT.get(stage, 'an RMSNorm before its weight multiply')}, which only an engine without fused kernels writes out: rerun {op}, which computes it"
        for stage, op in STAGE_OF.items()
    },
}
"""Canonical ops without a rerun, and why."""


def why_not_rerunnable(op: str) -> str | None:
    """Why `op` cannot be rerun, or None when it can."""
    if op in OP_INPUTS:
        return None
    return NOT_RERUNNABLE.get(op, f"{op!r} is not a canonical op")

SHORT_NAMES = {"q_rope": "q", "k_rope": "k", "v_proj": "v"}
"""How an SDPA message names its inputs ("needs q, k and v")."""

WEIGHT_NAMES: dict[str, tuple[str, str]] = {
    "attn_norm": ("model.layers.{n}.input_layernorm.weight", "blk.{n}.attn_norm.weight"),
    "q_proj": ("model.layers.{n}.self_attn.q_proj.weight", "blk.{n}.attn_q.weight"),
    "k_proj": ("model.layers.{n}.self_attn.k_proj.weight", "blk.{n}.attn_k.weight"),
    "v_proj": ("model.layers.{n}.self_attn.v_proj.weight", "blk.{n}.attn_v.weight"),
    "q_norm": ("model.layers.{n}.self_attn.q_norm.weight", "blk.{n}.attn_q_norm.weight"),
    "k_norm": ("model.layers.{n}.self_attn.k_norm.weight", "blk.{n}.attn_k_norm.weight"),
    "o_proj": ("model.layers.{n}.self_attn.o_proj.weight", "blk.{n}.attn_output.weight"),
    "ffn_norm": ("model.layers.{n}.post_attention_layernorm.weight", "blk.{n}.ffn_norm.weight"),
    "ffn_gate": ("model.layers.{n}.mlp.gate_proj.weight", "blk.{n}.ffn_gate.weight"),
    "ffn_up": ("model.layers.{n}.mlp.up_proj.weight", "blk.{n}.ffn_up.weight"),
    "ffn_down": ("model.layers.{n}.mlp.down_proj.weight", "blk.{n}.ffn_down.weight"),
    "final_norm": ("model.norm.weight", "output_norm.weight"),
    "logits": ("lm_head.weight", "output.weight"),
}
"""Hugging Face / mlx-lm and GGUF (llama.cpp) names of each op's weight."""


class RerunInputError(ValueError):
    """What a rerun needs and the capture does not hold, in words."""


def bits_to_mx(bits: np.ndarray, logical: str) -> mx.array:
    """Stored bits as an MLX array of the logical dtype, bit for bit (bf16 and f16 via a view)."""
    if logical == "bfloat16":
        return mx.array(np.ascontiguousarray(bits)).view(mx.bfloat16)
    if logical == "float16":
        return mx.array(np.ascontiguousarray(bits).view(np.uint16)).view(mx.float16)
    if logical in ("float32", "int32", "int64", "bool", "uint8", "int8", "uint32", "int16", "uint16"):
        return mx.array(np.ascontiguousarray(bits))
    raise RerunInputError(f"a rerun cannot compute in {logical}; it reruns bfloat16, float16 and float32 tensors")


def mx_to_bits(array: mx.array) -> tuple[np.ndarray, str]:
    return to_numpy_bits(array)


def splits_heads(calls: np.ndarray) -> bool:
    """Whether attention calls split the query heads: several calls, or one per KV group."""
    return len(calls) > 1 or bool((calls["kv_group"] != -1).any())


@dataclass
class CapturedOps:
    """One capture's records by canonical key, and where each (step, segment) sits in time."""

    side: str
    capture: Capture
    by_key: dict[OpKey, MappedRecord]
    positions: list[tuple[int, str]]
    """(step, segment) in execution order: the order the KV cache grew in."""
    config: dict[str, Any] = field(default_factory=dict)
    config_problem: str = ""
    """Why a weights file's config could not be read ("; x.gguf: ..."), for the message of a
    rerun that needs a scalar neither capture names."""
    unpaired: dict[OpKey, str] = field(default_factory=dict)
    """This side's records the comparison left without a partner, by canonical key: why
    (`lacks`). Such a record is there, so "the capture has no ..." blamed the wrong capture."""
    run_positions: list[tuple[int, str]] | None = None
    """For a saved rerun compared with a run: that run's `positions`, which say what calls came
    before the rerun's own (`share_run_positions`)."""

    @classmethod
    def build(cls, capture: Capture, side: str, records: dict[OpKey, MappedRecord], unaligned: list[UnalignedRecord]) -> "CapturedOps":
        """`records` are this side's records as the comparison paired them (sessions.compare.pair_tensors.aligned_records);
        `unaligned` the comparison's records without a partner, both sides'."""
        first_seq: dict[tuple[int, str], int] = {}
        for record in capture.records:
            first_seq.setdefault((record.step, record.segment), record.seq)
        positions = sorted(first_seq, key=first_seq.__getitem__)
        provenance = capture.meta.provenance if isinstance(capture.meta.provenance, dict) else {}
        config = provenance.get("config", {})
        # By the call's key: paired by position, each stretch without a partner is keyed by its positions (`align`).
        unpaired = {u.key.whole_call(): u.why() for u in unaligned if u.side == side and u.key is not None}
        return cls(side, capture, records, positions, config if isinstance(config, dict) else {}, unpaired=unpaired)

    def lacks(self, step: int, segment: str, layer: int, op: str, shown: str | None = None) -> str:
        """What this side "has" of an input it has no paired record of: "no OP", or the record
        and why the comparison left it unpaired. `shown`: the name the message gives the op."""
        why = self.unpaired.get(OpKey(step, segment, layer, op))
        name = shown or op
        return f"{name}, but the comparison left it unpaired ({why})" if why else f"no {name}"

    def find(self, step: int, segment: str, layer: int, op: str, positions: tuple[int, ...] = ()) -> MappedRecord | None:
        """The record paired under this key; `positions` when the comparison aligned by position."""
        return self.by_key.get(OpKey(step, segment, layer, op, 0, positions))

    def bits(self, mapped: MappedRecord) -> np.ndarray:
        """What the pair compares of a record (its batch row and positions), in canonical layout."""
        return mapped.canonical(self.capture.read_bits(mapped.record, mapped.selection()))

    def array(self, mapped: MappedRecord) -> mx.array:
        return bits_to_mx(self.bits(mapped), mapped.record.dtype)

    def layers(self) -> list[int]:
        return sorted({k.layer for k in self.by_key if k.layer >= 0})

    def dispatch_events(self, seq: int) -> np.ndarray:
        table = self.capture.dispatch
        return table[table["index_seq"] == seq] if len(table) else table

    def sdpa_calls(self, key: OpKey) -> np.ndarray:
        """The attention calls this side's sdpa record at `key`'s place made (its dispatch rows; none without one)."""
        mapped = self.find(key.step, key.segment, key.layer, "sdpa", key.positions)
        return self.dispatch_events(mapped.record.seq) if mapped is not None else self.capture.dispatch[:0]

    def earlier_positions(self, step: int, segment: str, needed_by: str) -> list[tuple[int, str]]:
        """The (step, segment) forward calls before this one: their K/V are this call's cache.
        A saved rerun holds only the calls it recomputed, so the calls before them are unknown,
        not absent: read as none, they made a rerun from it run without its cache and RoPE
        offset and call a faithful native "does not reproduce". `needed_by` says what asks."""
        if self.capture.meta.role == RERUN_ROLE:
            if self.run_positions is not None and self.run_positions[:1] == [(step, segment)]:
                return []  # the run's first call: nothing came before it
            provenance = self.capture.meta.provenance if isinstance(self.capture.meta.provenance, dict) else {}
            made_from = [str(provenance[k]) for k in ("native_capture", "oracle_capture") if provenance.get(k)]
            raise RerunInputError(
                f"{needed_by} needs the KV cache the calls before step {step} {segment} left, and the {self.side} capture "
                f"is a saved rerun, which holds only the ops it recomputed; rerun from the captures it was made from"
                + (f" ({' and '.join(made_from)})" if made_from else "")
            )
        if (step, segment) not in self.positions:
            return []
        return self.positions[: self.positions.index((step, segment))]


def share_run_positions(native: CapturedOps, oracle: CapturedOps) -> None:
    """A saved rerun learns the call order of the run beside it, when that is a run."""
    for rerun, run in ((native, oracle), (oracle, native)):
        if rerun.capture.meta.role == RERUN_ROLE and run.capture.meta.role != RERUN_ROLE:
            rerun.run_positions = run.positions


def referenced_weights(capture: Capture, explicit: Path | None) -> Path | None:
    """The weights file: `explicit`, else the one the provenance names -- `weights_file` (the demo
    engines), `gguf` (the llama.cpp recorder), the one weights file in `weights_from` (a saved
    rerun) or the single safetensors file in `model_dir` (the MLX recorder) -- relative paths
    taken from the capture's folder."""
    if explicit is not None:
        return explicit
    provenance = capture.meta.provenance if isinstance(capture.meta.provenance, dict) else {}
    for field_name in ("weights_file", "gguf"):
        name = provenance.get(field_name)
        if name is None or name == "":
            continue
        _check_file_name(capture, field_name, name)
        path = Path(name)
        return path if path.is_absolute() else capture.path.parent / path
    taken = provenance.get("weights_from")  # a saved rerun: the file its own rerun read them from
    names = [name for name in taken if isinstance(name, str) and Path(name).suffix in (".safetensors", ".gguf")] if isinstance(taken, list) else []
    for name in names:
        _check_file_name(capture, "weights_from", name)
    if len(names) == 1:
        return Path(names[0]) if Path(names[0]).is_absolute() else capture.path.parent / names[0]
    model_dir = provenance.get("model_dir")
    if isinstance(model_dir, str) and model_dir:
        _check_file_name(capture, "model_dir", model_dir)
        folder = Path(model_dir) if Path(model_dir).is_absolute() else capture.path.parent / model_dir
        files = sorted(folder.glob(MLX_WEIGHT_FILES)) if folder.is_dir() else []
        if len(files) == 1:
            return files[0]
    return None


def _check_file_name(capture: Capture, key: str, name: object) -> None:
    """RerunInputError, naming the capture and the provenance key, when `name` cannot name a file:
    a number was passed over in silence ("neither capture nor a referenced weights file holds
    it"), and a NUL or a lone surrogate failed in the operating system's call with a message
    naming neither capture nor key."""
    if not isinstance(name, str):
        problem = f"is {json.dumps(name)[:80]}, not a file name"
    elif "\0" in name:
        problem = f"holds a NUL, so it names no file ('{printable(name)}')"
    else:
        try:
            os.fsencode(name)
            return
        except UnicodeEncodeError:
            problem = f"is not a file name this system can spell ('{printable(name)}')"
    raise RerunInputError(f"{capture.path}: / attribute 'provenance_json' key {key!r}: {problem}; the command's --weights names the weights file instead")


def files_named(native: str, oracle: str, weights: str | None, profiles: tuple[str | None, str | None]) -> dict[str, str | Path | None]:
    """The files a rerun or a diagnosis was given, by what they are: its inputs before the
    captures are open (`files_read` adds the weights files they reference)."""
    return {"native capture": native, "oracle capture": oracle, "weights file": weights, "native profile": profiles[0], "oracle profile": profiles[1]}


def files_read(native: Capture, oracle: Capture, weights: str | None, profiles: tuple[str | None, str | None]) -> dict[str, str | Path | None]:
    """Every file a rerun or a diagnosis of this pair reads, by what it is: the captures, the
    weights each side's reruns take (`weights`, else the file its capture references) and the
    (native, oracle) profiles given by path, none of which an output may replace."""
    explicit = None if weights is None else Path(weights)
    return {
        "native capture": native.path,
        "oracle capture": oracle.path,
        "native capture's weights file": referenced_weights(native, explicit),
        "oracle capture's weights file": referenced_weights(oracle, explicit),
        "native profile": profiles[0],
        "oracle profile": profiles[1],
    }


class Weights(Protocol):
    """Where an op's weight comes from (backends.rerun.weights.WeightSource, which reads through this module)."""

    def get(self, op: str, layer: int, width: int | None = None) -> mx.array: ...


@dataclass
class OpInputs:
    """Everything one op's rerun reads, in canonical layouts, plus the scalars it needs."""

    key: OpKey
    arrays: dict[str, mx.array]
    history: dict[str, mx.array]
    """For sdpa: "k" and "v" of the earlier forward calls of the layer, [kv_heads, rows, dim]."""
    weight: mx.array | None
    params: dict[str, Any]
    dtype: str


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _missing_message(key: OpKey, ops: CapturedOps, needs: tuple[str, ...], missing: list[tuple[str, int, str]], where: str) -> str:
    """`missing`: (name in `needs`, layer, op) of each input this side has no paired record of."""

    def short(name: str) -> str:
        if name == LAYER_INPUT:
            return "the layer input"
        return SHORT_NAMES.get(name, name) if key.op == "sdpa" else name

    layer = f" of layer {key.layer}" if key.layer >= 0 else ""
    title = "SDPA" if key.op == "sdpa" else key.op
    shown = [(op if name == LAYER_INPUT else short(name), at, op) for name, at, op in missing]
    unpaired = [(name, at, op) for name, at, op in shown if OpKey(key.step, key.segment, at, op) in ops.unpaired]
    absent = [name for name, at, op in shown if (name, at, op) not in unpaired]
    said = [f"no {_and(list(dict.fromkeys(absent)))}"] if absent else []
    said += [ops.lacks(key.step, key.segment, at, op, name) for name, at, op in unpaired]
    return f"{title} rerun needs {_and([short(n) for n in needs])}{layer}; the {ops.side} capture has {'; and '.join(said)} ({where})"


def layer_input_key(ops: CapturedOps, step: int, segment: str, layer: int) -> tuple[int, str]:
    """(layer, op) of the residual stream entering `layer` (or the final norm for layer -1)."""
    if layer == 0:
        return -1, "embed"
    if layer == -1:
        layers = ops.layers()
        return (layers[-1] if layers else 0), "layer_out"
    return layer - 1, "layer_out"


RERUN_CONFIG = ("rms_norm_eps", "rope_theta")
"""The model scalars a rerun reads from the provenance `config`: the norms' eps, RoPE's base."""


def _is_model_scalar(value: Any) -> bool:
    """A value an eps or a RoPE base can take: a finite number above 0 (NaN would spread through
    every rerun and read as a diagnosis; an integer of 400 digits, past any float, raised)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0


def _usable(config: dict[str, Any]) -> dict[str, Any]:
    """`config` without the rerun's scalars that cannot be one (a capture is untrusted: a `null`,
    NaN or negative eps must not hide the weights file's)."""
    return {name: value for name, value in config.items() if name not in RERUN_CONFIG or _is_model_scalar(value)}


def share_config(native: CapturedOps, oracle: CapturedOps) -> None:
    """Give both sides one model config. Both captures run one model: a scalar only one side's
    provenance names is the other's too, and one that neither names comes from the weights files
    they reference (a GGUF's metadata, the config.json beside a safetensors file), so a capture
    recorded without a config can still be rerun. Recorded values come first, each side's own
    before the other's, then the files, each side's own before the other's (a GGUF keeps eps as
    float32, config.json as written)."""
    recorded = {side.side: _usable(side.config) for side in (native, oracle)}
    from_files: dict[str, dict[str, Any]] = {side.side: {} for side in (native, oracle)}
    problems: list[str] = []
    if any(name not in {**recorded["native"], **recorded["oracle"]} for name in RERUN_CONFIG):
        for side in (native, oracle):
            try:
                path = referenced_weights(side.capture, None)
                from_files[side.side] = _usable(weights_file_config(path)) if path is not None else {}
            except (ModelConfigError, RerunInputError) as exc:  # a config the reruns need says so, with this
                problems.append(str(exc))
    for side, other in ((native, oracle), (oracle, native)):
        side.config = {**from_files[other.side], **from_files[side.side], **recorded[other.side], **recorded[side.side]}
        side.config_problem = "".join(f"; {problem}" for problem in problems)


def config_value(ops: CapturedOps, name: str, what: str) -> float:
    value = ops.config.get(name)
    if _is_model_scalar(value):
        return float(value)
    raise RerunInputError(
        f"{what} needs {name}; neither capture's provenance config nor a weights file they reference "
        f"names it as a finite number above 0{ops.config_problem} (docs/capture-format.md, provenance `config`)"
    )


def input_width(op: str, arrays: dict[str, mx.array]) -> int:
    """The last dimension of the input `op`'s weight multiplies: what the weight's shape must fit."""
    return int(arrays[OP_INPUTS[op][0]].shape[-1])


def gather(
    ops: CapturedOps, key: OpKey, weights: Weights, mask_side: CapturedOps | None = None
) -> OpInputs:
    """The captured inputs of the op at `key` on one side, or RerunInputError naming what is missing.

    `mask_side` is the capture whose attention mask the op applies (default: `ops`): a rerun on
    the other side's route applies that side's mask, which is part of its route."""
    why = why_not_rerunnable(key.op)
    if why is not None:
        raise RerunInputError(f"{key.op} cannot be rerun: {why}")
    needs = OP_INPUTS[key.op]
    arrays: dict[str, mx.array] = {}
    missing: list[tuple[str, int, str]] = []
    for name in needs:
        if name == LAYER_INPUT:
            layer, op = layer_input_key(ops, key.step, key.segment, key.layer)
        else:
            layer, op = key.layer, name
        mapped = ops.find(key.step, key.segment, layer, op, key.positions)
        if mapped is None:
            missing.append((name, layer, op))
        else:
            arrays[name] = ops.array(mapped)
    # Paired by position, the key names the native's call; the other side's records of those positions may sit in calls of other names.
    where = f"looked at step {key.step} {key.segment}" if not key.positions else f"looked for the records paired with step {key.step} {key.segment} {span_text(key.positions)}"
    if missing:
        raise RerunInputError(_missing_message(key, ops, needs, missing, where))
    history = kv_history(ops, key) if key.op == "sdpa" else {}
    weight = weights.get(key.op, key.layer, input_width(key.op, arrays)) if key.op in WEIGHT_NAMES else None
    params = op_params(ops, key, arrays, weight, mask_side)
    dtype = next(iter(arrays.values())).dtype
    return OpInputs(key, arrays, history, weight, params, str(dtype).removeprefix("mlx.core."))


def kv_history_rows(ops: CapturedOps, key: OpKey) -> int:
    """Rows of K/V the layer's cache holds before this forward call (the RoPE offset): the first
    position, when the comparison aligned by position."""
    if key.positions:
        return key.positions[0]
    total = 0
    needed_by = f"{key.op} rerun of layer {key.layer} at step {key.step} {key.segment}"
    for step, segment in ops.earlier_positions(key.step, key.segment, needed_by):
        mapped = ops.find(step, segment, key.layer, "k_rope") or ops.find(step, segment, key.layer, "k_proj")
        if mapped is None:
            raise RerunInputError(
                f"{needed_by} needs the KV cache rows of the earlier call step {step} {segment}; "
                f"the {ops.side} capture has {ops.lacks(step, segment, key.layer, 'k_rope', 'k')} for layer {key.layer} there"
            )
        total += mapped.shape[1] if mapped.key.op == "k_rope" else mapped.shape[0]
    return total


_HistoryPart = tuple[MappedRecord | None, MappedRecord | None, str, tuple[int, str] | None]


def _history_calls(ops: CapturedOps, key: OpKey) -> list[_HistoryPart]:
    """(k_rope, v_proj, where, call) of each part of the KV cache before this call: the earlier
    calls (`call` their (step, segment)), or, aligned by position, the pairs holding positions
    0 .. first-1 of this layer in order (`call` None)."""
    if not key.positions:
        needed_by = f"SDPA rerun of layer {key.layer} at step {key.step} {key.segment}"
        return [
            (ops.find(step, segment, key.layer, "k_rope"), ops.find(step, segment, key.layer, "v_proj"), f"step {step} {segment}", (step, segment))
            for step, segment in ops.earlier_positions(key.step, key.segment, needed_by)
        ]
    before = sorted(
        (k for k in ops.by_key if k.op == "k_rope" and k.layer == key.layer and k.positions and k.positions[1] <= key.positions[0]),
        key=lambda k: k.positions,
    )
    covered = 0
    parts: list[_HistoryPart] = []
    for k in before:
        if k.positions[0] != covered:
            break
        v = ops.by_key.get(OpKey(k.step, k.segment, k.layer, "v_proj", 0, k.positions))
        parts.append((ops.by_key[k], v, f"positions {k.positions[0]}-{k.positions[1] - 1}", None))
        covered = k.positions[1]
    if covered != key.positions[0]:
        parts.append((None, None, f"positions {covered}-{key.positions[0] - 1}", None))
    return parts


def kv_history(ops: CapturedOps, key: OpKey) -> dict[str, mx.array]:
    ks, vs = [], []
    for k, v, where, call in _history_calls(ops, key):
        if k is None or v is None:
            gone = [(name, op) for name, op, m in (("k", "k_rope", k), ("v", "v_proj", v)) if m is None]
            raise RerunInputError(
                f"SDPA rerun needs the K/V cache of layer {key.layer} from {where} (earlier rows of this layer's "
                f"cache); the {ops.side} capture has {_history_lacks(ops, key.layer, call, gone)} there"
            )
        ks.append(ops.array(k))
        v_arr = ops.array(v)
        kv_heads = ks[-1].shape[0]
        vs.append(v_arr.reshape(v_arr.shape[0], kv_heads, -1).transpose(1, 0, 2))
    if not ks:
        return {}
    return {"k": mx.concatenate(ks, axis=1), "v": mx.concatenate(vs, axis=1)}


def _history_lacks(ops: CapturedOps, layer: int, call: tuple[int, str] | None, gone: list[tuple[str, str]]) -> str:
    """What `ops` has of the (name, op) cache records `gone` in `call`: records there that the
    comparison left unpaired are named as such ("no k and v" blamed a capture that holds them),
    once for both when one reason left both unpaired."""
    whys = {ops.unpaired.get(OpKey(*call, layer, op)) for _, op in gone} if call else {None}
    names = " and ".join(name for name, _ in gone)
    if len(whys) == 1 and None not in whys:
        return f"{names}, but the comparison left {'them' if len(gone) > 1 else 'it'} unpaired ({whys.pop()})"
    return " and ".join(ops.lacks(*call, layer, op, name) if call else f"no {name}" for name, op in gone)


def op_params(
    ops: CapturedOps, key: OpKey, arrays: dict[str, mx.array], weight: mx.array | None, mask_side: CapturedOps | None = None
) -> dict[str, Any]:
    """The scalars an op needs beside its arrays (eps, RoPE base and offset, heads, scale, mask).

    `arrays` may be captured inputs or a segment rerun's own intermediate results: only
    their shapes are read.
    """
    op = key.op
    params: dict[str, Any] = {}
    if op in ("attn_norm", "ffn_norm", "final_norm", "q_norm", "k_norm"):
        params["eps"] = config_value(ops, "rms_norm_eps", f"{op} rerun")
    if op in ("q_norm", "k_norm"):
        assert weight is not None
        params["heads"] = arrays[OP_INPUTS[op][0]].shape[-1] // weight.shape[-1]
    if op in ("q_rope", "k_rope"):
        params["base"] = config_value(ops, "rope_theta", f"{op} rerun")
        params["offset"] = kv_history_rows(ops, key)
        params["dims"] = int(arrays[OP_INPUTS[op][0]].shape[-1])
    if op == "sdpa":
        q, k = arrays["q_rope"], arrays["k_rope"]
        params["head_dim"] = q.shape[-1]
        params["kv_heads"] = k.shape[0]
        params["scale"] = 1.0 / math.sqrt(q.shape[-1])
        params["mask"] = _mask_of(mask_side or ops, key, q.shape[1])
    return params


def _mask_of(ops: CapturedOps, key: OpKey, rows: int) -> str | None:
    """The mask the captured call used, from its dispatch events; a decoder's causal/none without them."""
    mapped = ops.find(key.step, key.segment, key.layer, "sdpa", key.positions)
    events = ops.dispatch_events(mapped.record.seq) if mapped is not None else ops.capture.dispatch[:0]
    kinds = {bytes(k).rstrip(b"\0").decode() for k in events["mask_kind"].tolist()} if len(events) else set()
    if not kinds:
        return "causal" if rows > 1 else None
    kind = kinds.pop()
    if kind in ("none", "causal"):
        return None if kind == "none" else "causal"
    raise RerunInputError(
        f"SDPA rerun needs the {kind} mask of layer {key.layer} at step {key.step} {key.segment}; the {ops.side} "
        f"capture records only the mask's kind, not its values"
    )
