"""`parity-xray record llama MODEL.gguf`: record a real llama.cpp run node by node.

llama-cpp-python's low-level API gives a context an eval callback (`cb_eval`) that sees every
graph node: asked first (`ask=True`: do you want this node?), then, once the node is computed,
again with `ask=False`, when its data is readable. Two rules keep a run honest:
- the callback catches every exception and returns True on every `ask=False` call, because
  returning False aborts the decode silently with partial results;
- node memory is read only through the `ggml_tensor` mirror proven by
  `backends.recorders.ggml_tensor_struct.check_layout` (`backends.recorders.llama_nodes`).

With the parity settings (no flash attention) each layer's attention is three ggml nodes
(`kq-N`, `kq_soft_max-N`, `kqv-N`); the recorder writes one dispatch event for it on the
`kqv_out-N` record: primitive `fallback` (decomposed), heads, rows, the cache cells attended
(llama.cpp's padded KV length) and the mask kind (`causal` when its KQ mask is, value for
value, the causal mask of the call's positions; else `additive`).

What a record holds: the node's name (llama.cpp's `NAME-LAYER`, or ggml's `node_N` for an
unnamed one), its op (`ggml_op_desc`) as `kernel_id`, and its source tensor names as the
dataset attribute `ggml_src` (a JSON list, docs/capture-format.md "Recorder attributes").
The layer comes from the name (`Qcur-3`), else from a source weight (`blk.3.attn_output.weight`).

Parity settings are the defaults and are written into provenance: flash attention off, an
F32 KV cache (llama.cpp's default F16 cache moves its own logits by ~1e-3), logits for every
token (or the last layer is cut down to the output rows). With `n_ubatch` below the prompt
length the node sequence repeats per micro-batch; each repetition is its own segment.

A batch of requests (`batch` > 1) runs each request as its own sequence with one KV-cache stream
per sequence; nodes whose elements are the requests in turn are stored with a leading request
axis (`request_ne`), the others whole (docs/recorders.md, "Batches").

Everything here runs llama.cpp in the calling process, where an illegal instruction or a failed
GGML_ASSERT ends that process. Callers use `backends.recorders.llama_process`, which runs this
in a child process and turns such an end into a message.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backends.recorders.ggml_tensor_struct import (
    load_checked,
    tensor_at,
)
from backends.recorders.llama_nodes import (
    Described,
    NodeRead,
    NodeReader,
    RecorderError,
    node_layer,
)
from backends.recorders.llama_process_env import (
    ERROR_LINES,
    LOG_LINES,
    OPENMP_WAIT,
    buffer_types,
    first_error_since,
    keep_log,
)
from backends.recorders.model_config import ModelConfigError, gguf_config
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
from sessions.side_file import file_kind

KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8}
"""KV-cache types a recording may ask for (ggml_type ids)."""
KV_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
"""What one cached element costs in each of those types (q8_0: 34-byte blocks of 32)."""
SRC_ATTR = "ggml_src"
NO_COMPUTE_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})
"""ggml ops that only describe memory another tensor holds: the CPU backend computes nothing for them."""
ENGINE_NAME = "llama.cpp (llama-cpp-python)"



def require_gguf_file(model_path: Path) -> None:
    """RecorderError unless `model_path` is a regular file: a folder or a FIFO is named as what it
    is (llama.cpp would wait on a FIFO for a writer that never comes)."""
    try:
        mode = model_path.stat().st_mode
    except OSError:
        raise RecorderError(f"{model_path}: no such GGUF file") from None
    if not stat.S_ISREG(mode):
        raise RecorderError(f"{model_path}: {file_kind(mode)}, not a GGUF file")


MAX_THREADS = 1024
"""More threads than any CPU runs: 100,000 crashed llama.cpp's OpenMP runtime (SIGSEGV in libgomp),
and the crash was reported as a damaged GGUF."""


@dataclass(frozen=True)
class LlamaSettings:
    """Context settings; the defaults are the parity settings recorded in provenance."""

    flash_attn: bool = False
    kv_type: str = "f32"
    n_threads: int = 2
    all_nodes: bool = False
    """Record every node (the KV cache's views only with `whole_cache`); by default unnamed nodes
    are kept only when a weight anchors them."""
    whole_cache: bool = False
    """Record the KV cache as llama.cpp's nodes show it: every cell at every step, in each of its
    views and copies (quadratic in the positions). By default a `SET_ROWS` write is recorded as
    the cells it wrote (`NAME (written)`), and the cache's views and its copies (flash attention
    casts an F32 cache to F16 every step) are left out: each cell's bits once."""
    extra_bufts: bool = True
    """llama.cpp's extra buffer types (weights repacked for AMX or wider SIMD kernels), its default.
    Off keeps every weight in a plain CPU buffer: other kernels, other bits, and no AMX."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_threads <= MAX_THREADS:
            raise ValueError(f"--threads must be from 1 to {MAX_THREADS}, not {self.n_threads}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"KV cache type {self.kv_type!r} is not one of {', '.join(KV_TYPES)}")



@dataclass(frozen=True)
class FlashCall:
    """A FLASH_ATTN_EXT node's geometry, read from its sources when it is asked for."""

    heads: int
    rows: int
    cells: int
    """Cache cells the kernel attends over: llama.cpp's padded KV length."""
    kv_heads: int
    head_dim: int
    v_head_dim: int
    mask: str
    started: int


MASK_SOURCE = {"SOFT_MAX": 1, "FLASH_ATTN_EXT": 3}
"""Which source of an attention node is its KQ mask."""


@dataclass
class AttentionTrace:
    """Turns each llama.cpp attention into one dispatch event on its `kqv_out-N` record: what
    actually ran, over how many cache cells, with which mask. Decomposed (kq MUL_MAT,
    kq_soft_max, kqv) it is a `fallback`; flash attention's one unnamed FLASH_ATTN_EXT node,
    seen just before its layer's `kqv_out`, is a `flash_attn_ext`."""

    kv_heads: dict[int, int] = field(default_factory=dict)
    scores: dict[int, tuple[int, int, int, int | None]] = field(default_factory=dict)
    """layer -> (heads, rows, cache cells attended, start ns) of its `kq-N`."""
    masks: dict[int, str] = field(default_factory=dict)
    flash: FlashCall | None = None
    """The flash-attention call whose `kqv_out` comes next."""

    def see(self, writer: CaptureWriter, node: NodeRead, seq: int, started: int | None, mask: str = "none") -> None:
        """`mask`: the kind of a `kq_soft_max` node's mask (`NodeReader.mask_kind`)."""
        stem, layer = node.name.rsplit("-", 1)[0], node.layer
        shape = node.request_shape()
        if stem == "Kcur" and node.op == "ROPE" and len(shape) == 3:
            self.kv_heads[layer] = shape[1]
        elif stem == "kq" and node.op == "MUL_MAT" and len(shape) == 3:
            self.scores[layer] = (shape[0], shape[1], shape[2], started)
        elif stem == "kq_soft_max":
            self.masks[layer] = mask
        elif stem == "kqv_out" and layer in self.scores and len(shape) == 2:
            heads, rows, cells, start = self.scores.pop(layer)
            writer.add_dispatch(
                index_seq=seq, call=0, batch=node.requests(), kv_group=-1, head_start=0, head_count=heads, q_heads=heads,
                kv_heads=self.kv_heads.get(layer, heads), q_rows=rows, kv_len=cells, head_dim=shape[1] // heads,
                mask_kind=self.masks.pop(layer, "none"), dtype=node.dtype, primitive="fallback",
                t_start_ns=start or 0, t_end_ns=writer.now_ns(),
            )
        elif stem == "kqv_out" and self.flash is not None:
            call, self.flash = self.flash, None
            writer.add_dispatch(
                index_seq=seq, call=0, batch=node.requests(), kv_group=-1, head_start=0, head_count=call.heads, q_heads=call.heads,
                kv_heads=call.kv_heads, q_rows=call.rows, kv_len=call.cells, head_dim=call.head_dim, v_head_dim=call.v_head_dim,
                mask_kind=call.mask, dtype=node.dtype, primitive="flash_attn_ext", t_start_ns=call.started, t_end_ns=writer.now_ns(),
            )


@dataclass
class _Pass:
    """What the callback tracks within one llama_decode call."""

    step: int
    segments: list[str]
    rows: list[int]
    starts: list[int]
    """The first token position of each micro-batch."""
    first_name: str | None = None
    graph: int = -1
    asked: dict[int, tuple[int, Described]] = field(default_factory=dict)
    """Nodes the graph stops after: when each was asked for (ns), and what it is."""
    computed: bool = False
    """Every node of the graph asked about so far is computed, or computes nothing."""
    masks: dict[tuple[int, int], str] = field(default_factory=dict)
    """(graph, mask tensor address) -> its kind: every layer's soft_max reads the graph's one KQ
    mask, which is checked once."""


class LlamaRun:
    """One llama.cpp model + context, decoding a token schedule, optionally recording it."""

    def __init__(
        self, model_path: Path, schedule: TokenSchedule, settings: LlamaSettings, *, record: bool, batch: int = 1, batch_row: int = 0,
    ) -> None:
        import llama_cpp as llama

        check_batch(batch, batch_row)
        self.llama = llama
        self.schedule = schedule
        self.settings = settings
        self.record = record
        self.batch, self.batch_row = batch, batch_row
        self.writer: CaptureWriter | None = None
        """Set before `run` when recording; the callback writes through it."""
        self.errors: list[str] = []
        self.library = load_checked() if record else None
        self.reader = NodeReader(self.library) if self.library is not None else None
        self._pass: _Pass | None = None
        self._attention = AttentionTrace()
        self._occurrences: dict[tuple[int, str, int, str], int] = {}
        self._sources_text: dict[tuple[str, ...], str] = {}
        """Source names -> their `ggml_src` JSON: a node's sources repeat every step."""
        self.before_decode: Callable[[int], None] | None = None
        """Called with the step number before each llama_decode (the child reports its stage)."""
        llama.llama_log_set(keep_log(), ctypes.c_void_p(0))
        llama.llama_backend_init()
        params = llama.llama_model_default_params()
        params.use_extra_bufts = settings.extra_bufts
        # Every layer on the CPU, as the capture's device says: the default (-1) offloads them all
        # to a GPU where llama.cpp was built with one (Metal on Apple silicon), a run the
        # capture would still call a CPU run, and whose tensors the callback reads from host memory.
        params.n_gpu_layers = 0
        errors = len(ERROR_LINES)
        self.model = llama.llama_model_load_from_file(str(model_path).encode(), params)
        if not self.model:
            raise RecorderError(f"{model_path}: llama.cpp could not load the model{first_error_since(errors) or ' (it logged no reason)'}")
        self.vocab_size = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self.model)))
        outside = [t for t in schedule.prompt if t >= self.vocab_size]
        if outside:
            llama.llama_model_free(self.model)
            raise RecorderError(f"token id {outside[0]} is outside {model_path.name}'s vocabulary ({self.vocab_size} ids)")
        self.requests = batch_prompts(schedule.prompt, batch, batch_row, self.vocab_size)
        """Each sequence's prompt: the request in row `batch_row`, other requests around it."""
        self._callback = llama.ggml_backend_sched_eval_callback(self._eval)
        self.context = None
        try:
            if record:
                self._probe_ranks(model_path)
            self.context = self._new_context(model_path, self._context_params())
        except RecorderError:
            llama.llama_model_free(self.model)
            raise

    def _new_context(self, model_path: Path, params: Any) -> Any:
        errors = len(ERROR_LINES)
        context = self.llama.llama_init_from_model(self.model, params)
        if not context:
            raise RecorderError(
                f"{model_path}: llama.cpp could not create a context for a batch of {self.batch} with {asdict(self.settings)}"
                f"{first_error_since(errors) or ' (it logged no reason)'}"
            )
        return context

    def _probe_ranks(self, model_path: Path) -> None:
        """Learn each recorded node's rank from one call of two rows per request, in a throwaway
        context, before the run. A run whose every call has one row (a one-token prompt, `ubatch`
        1) never shows a node's row axis, and a reader must find [1, X] where other runs have
        [rows, X]. The probe asks for no node, so the graph runs without stopping."""
        assert self.reader is not None
        reader, settings, batch = self.reader, self.settings, self.batch
        occurrences: dict[tuple[int, str], int] = {}

        def learn(address: int, ask: bool, _user: Any) -> bool:
            try:
                if ask:
                    name, op, sources = reader.describe(address)
                    if reader.wanted(name, op, sources, all_nodes=settings.all_nodes, whole_cache=settings.whole_cache):
                        counted = (node_layer(name, sources), name)
                        occurrence = occurrences.get(counted, 0)
                        occurrences[counted] = occurrence + 1
                        reader.learn_rank([int(n) for n in tensor_at(address).ne], (name, op, occurrence), batch)
            except Exception as exc:  # noqa: BLE001  (an exception must never reach ggml: it would abort the decode)
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return not ask

        callback = self.llama.ggml_backend_sched_eval_callback(learn)
        params = self._context_params()
        params.cb_eval = callback
        params.n_batch = max(params.n_batch, 2 * batch)
        params.n_ubatch = max(params.n_ubatch, 2 * batch)
        context = self._new_context(model_path, params)
        try:
            status = self._llama_decode(context, [request[:1] * 2 for request in self.requests], 0)
        finally:
            self.llama.llama_free(context)
        if status != 0 or self.errors:
            raise RecorderError(f"the probe of each node's rank failed: {self.errors[0] if self.errors else f'llama_decode returned {status}'}")

    def _context_params(self) -> Any:
        llama, s = self.llama, self.settings
        params = llama.llama_context_default_params()
        total = len(self.schedule.prompt) + self.schedule.decode_steps + 1
        # One KV cache stream per sequence (not unified): each request attends over its own cells,
        # as many as a run of it alone has, and the attention nodes get a per-sequence dimension.
        # llama.cpp then splits a batch equally: each micro-batch holds n_ubatch / n_seq_max tokens
        # of every sequence, so a request's micro-batches are those of its run alone.
        params.n_seq_max = self.batch
        params.kv_unified = False
        params.n_ctx = max(256, -(-total // 256) * 256) * self.batch
        prompt = max(len(self.schedule.prompt), 1)
        params.n_batch = prompt * self.batch
        params.n_ubatch = min(self.schedule.ubatch, prompt) * self.batch
        params.n_threads = params.n_threads_batch = s.n_threads
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.type_k = params.type_v = KV_TYPES[s.kv_type]
        params.no_perf = True
        if self.record:
            params.cb_eval = self._callback
        return params

    def provenance(self) -> dict[str, Any]:
        return {
            "recorder": "parity-xray record llama",
            "llama_cpp_python_version": self.llama.__version__,
            "system_info": self.llama.llama_print_system_info().decode("utf-8", "replace").strip(),
            "buffer_types": buffer_types(LOG_LINES),
            "openmp_wait": {name: os.environ.get(name, "") for name in OPENMP_WAIT},
            "parity_settings": {**asdict(self.settings), "logits_all": True, "n_ubatch": self.schedule.ubatch, "kv_unified": False, "n_gpu_layers": 0},
            "batch": self.batch,
            "batch_row": self.batch_row,
            "threads": self.settings.n_threads,
            **self.schedule.as_provenance(),
        }

    def close(self) -> None:
        if self.context:
            self.llama.llama_free(self.context)
            self.context = None
        if self.model:
            self.llama.llama_model_free(self.model)
            self.model = None

    def _eval(self, address: int, ask: bool, _user: Any) -> bool:
        try:
            return self._on_node(address, ask)
        except Exception as exc:  # noqa: BLE001  (an exception must never reach ggml: it would abort the decode)
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return not ask

    def _on_node(self, address: int, ask: bool) -> bool:
        current, reader = self._pass, self.reader
        if current is None or reader is None or self.writer is None:
            return not ask
        if not ask:
            asked = current.asked.pop(address, None)
            started, described = asked if asked is not None else (None, reader.describe(address))
            current.computed = True
            self._record(address, described, current, started)
            return True
        described = reader.describe(address)
        name, op, sources = described
        if current.first_name is None or name == current.first_name:
            current.first_name = name
            current.graph += 1
            current.computed = False
        if op == "FLASH_ATTN_EXT":
            self._attention.flash = self._flash_call(address, current)
        if not reader.wanted(name, op, sources, all_nodes=self.settings.all_nodes, whole_cache=self.settings.whole_cache):
            if op not in NO_COMPUTE_OPS:
                current.computed = False
            return False
        if current.computed and op in NO_COMPUTE_OPS:
            # Its bits are final already: everything before it is computed and it computes
            # nothing. Read now, the graph goes on without stopping here (each stop costs
            # llama.cpp a separate graph computation; a third of a layer's records are views).
            self._record(address, described, current, self.writer.now_ns())
            return False
        current.asked[address] = (self.writer.now_ns(), described)
        return True

    def _record(self, address: int, described: Described, current: _Pass, started: int | None) -> None:
        """Write the computed node at `address` as the next record of the current graph."""
        assert self.reader is not None and self.writer is not None
        name, op, sources = described
        graph = min(current.graph, len(current.segments) - 1)
        segment, rows, first = current.segments[graph], current.rows[graph], current.starts[graph]
        layer = node_layer(name, sources)
        count_key = (current.step, segment, layer, name)
        occurrence = self._occurrences.get(count_key, 0)
        self._occurrences[count_key] = occurrence + 1
        if op == "SET_ROWS" and not self.settings.whole_cache:
            node = self.reader.read_written(address, described, layer, rows, self.batch)
        else:
            node = self.reader.read(address, described, (name, op, occurrence), layer, rows, self.batch)
        sources_text = self._sources_text.get(tuple(node.sources))
        if sources_text is None:
            sources_text = self._sources_text[tuple(node.sources)] = json.dumps(node.sources)
        seq = self.writer.add_tensor(
            node.name,
            node.bits,
            step=current.step,
            segment=segment,
            layer=node.layer,
            dtype=node.dtype,
            logical_shape=node.logical_shape,
            kernel_id=node.op,
            t_start_ns=started,
            attrs={SRC_ATTR: sources_text},
            position=first,
        )
        self._attention.see(self.writer, node, seq, started, self._mask_kind(address, op, current, first, rows))

    def _flash_call(self, address: int, current: _Pass) -> FlashCall:
        assert self.writer is not None
        node = tensor_at(address)
        q, k, v = (tensor_at(node.src[i]) for i in range(3))
        graph = min(current.graph, len(current.segments) - 1)
        return FlashCall(
            heads=int(q.ne[2]), rows=int(q.ne[1]), cells=int(k.ne[1]), kv_heads=int(k.ne[2]), head_dim=int(q.ne[0]),
            v_head_dim=int(v.ne[0]), mask=self._mask_kind(address, "FLASH_ATTN_EXT", current, current.starts[graph], current.rows[graph]),
            started=self.writer.now_ns(),
        )

    def _mask_kind(self, address: int, op: str, current: _Pass, first: int, rows: int) -> str:
        """The kind of a `SOFT_MAX` or `FLASH_ATTN_EXT` node's mask, read once per graph ("none"
        for other nodes)."""
        assert self.reader is not None
        source = MASK_SOURCE.get(op)
        if source is None:
            return "none"
        mask = int(tensor_at(address).src[source] or 0)
        key = (current.graph, mask)
        if key not in current.masks:
            current.masks[key] = self.reader.mask_kind(mask, first, rows)
        return current.masks[key]

    def _llama_decode(self, context: Any, tokens: list[list[int]], start: int) -> int:
        """llama_decode's status for each sequence's `tokens` (equally many) from position `start`,
        sequence after sequence, every token's logits kept."""
        llama = self.llama
        batch = llama.llama_batch_init(len(tokens[0]) * len(tokens), 0, 1)
        try:
            i = 0
            for sequence, ids in enumerate(tokens):
                for offset, token in enumerate(ids):
                    batch.token[i] = token
                    batch.pos[i] = start + offset
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = sequence
                    batch.logits[i] = 1
                    i += 1
            batch.n_tokens = i
            return int(llama.llama_decode(context, batch))
        finally:
            llama.llama_batch_free(batch)

    def _decode(self, tokens: list[list[int]], start: int, step: int, segments: list[tuple[str, int, int]]) -> np.ndarray:
        """One llama_decode of each sequence's `tokens` (equally many) from position `start`, sequence
        after sequence; `segments` are its micro-batches (segment, first, stop). Returns the logits
        [sequence, token, vocab]."""
        llama = self.llama
        length = len(tokens[0])
        self._pass = _Pass(step, [s for s, _, _ in segments], [b - a for _, a, b in segments], [a for _, a, _ in segments])
        if self.reader is not None:
            self.reader.new_call()
        if self.before_decode is not None:
            self.before_decode(step)
        try:
            status = self._llama_decode(self.context, tokens, start)
            graphs = self._pass.graph + 1
        finally:
            self._pass = None
        if status != 0:
            raise RecorderError(f"llama_decode returned {status} at step {step}")
        if self.errors:
            raise RecorderError(f"step {step}: {len(self.errors)} node(s) could not be recorded; first: {self.errors[0]}")
        if self.record and graphs != len(segments):
            raise RecorderError(f"step {step}: llama.cpp computed {graphs} micro-batch graph(s), the schedule expects {len(segments)}")
        pointer = llama.llama_get_logits(self.context)
        return np.ctypeslib.as_array(pointer, shape=(len(tokens), length, self.vocab_size)).copy()

    def run(self) -> ProgressGenerator[list[np.ndarray]]:
        """Prefill, then greedy decode of every sequence; returns the logits llama.cpp handed back
        for the request (row `batch_row`), per step."""
        schedule, writer = self.schedule, self.writer
        emitted: list[list[int]] = []
        returned: list[np.ndarray] = []
        position = 0
        total = schedule.decode_steps + 1
        for step in range(total):
            if step == 0:
                calls = [([r[call[0][1] : call[-1][2]] for r in self.requests], call) for call in schedule.calls()]
            else:
                calls = [([[t] for t in emitted[-1]], [(DECODE, position, position + 1)])]
            for tokens, segments in calls:
                logits = self._decode(tokens, position, step, segments)
                position += len(tokens[0])
            returned.append(logits[self.batch_row])
            emitted.append([int(t) for t in np.argmax(logits[:, -1], axis=-1)])
            token = emitted[-1][self.batch_row]
            stop = token in schedule.stop_tokens
            if writer is not None:
                writer.add_token(step=step, segment=segments[-1][0], token_id=token, is_stop=stop)
                writer.end_step()
            yield Progress(step + 1, total, f"step {step}")
            if stop:
                break
        return returned


def iter_record_here(
    model_path: Path, schedule: TokenSchedule, out: Path, settings: LlamaSettings = LlamaSettings(),
    *, role: str = "native", extra: dict[str, Any] | None = None, weights_hash: str | None = None,
    before_decode: Callable[[int], None] | None = None, batch: int = 1, batch_row: int = 0,
) -> ProgressGenerator[list[np.ndarray]]:
    """Record `schedule` on the GGUF at `model_path` into `out` in this process; returns llama.cpp's
    logits per step. Only the recording child calls it (`backends.recorders.llama_process`): a crash
    in llama.cpp here ends the process.

    `weights_hash` overrides the capture's weights hash (default: the GGUF file's SHA-256, which
    provenance keeps either way), for pairs whose engines load the same values from different files.
    With `batch` > 1 the prompt runs as sequence `batch_row` of a batch of other requests
    (`batch_prompts`), each its own sequence: records hold the requests stacked along axis 0."""
    model_path = Path(model_path)
    require_gguf_file(model_path)
    config = _model_config(model_path)
    check_run_size(schedule, batch, config["config"], KV_ELEMENT_BYTES[settings.kv_type], physical_memory(), "the GGUF's context_length")
    digest = artifact_sha256([model_path])
    run = LlamaRun(model_path, schedule, settings, record=True, batch=batch, batch_row=batch_row)
    run.before_decode = before_decode
    try:
        meta = CaptureMeta(
            role=role,
            engine_name=ENGINE_NAME,
            engine_version=run.llama.__version__,
            model_id=model_path.name,
            weights_hash=weights_hash or weights_id(digest),
            device="cpu",
            compiler=f"llama-cpp-python {run.llama.__version__}",
            prompt=schedule.describe(),
            provenance={
                **run.provenance(), "gguf": str(model_path.resolve()), "weights_sha256": digest, **config, **(extra or {}),
            },
            batch_size=batch,
            batch_row=batch_row,
            batch_stacked=batch > 1,
        )
        with CaptureWriter(out, meta) as writer:
            run.writer = writer
            returned = yield from run.run()
    finally:
        run.close()
    return returned


def _model_config(model_path: Path) -> dict[str, Any]:
    """Provenance `config` from the GGUF's metadata; a file the `gguf` package cannot parse (a
    type newer than it) still records, and says why its config is missing."""
    try:
        return {"config": gguf_config(model_path)}
    except ModelConfigError as exc:
        return {"config": {}, "config_error": str(exc)}


def iter_plain_here(
    model_path: Path, schedule: TokenSchedule, settings: LlamaSettings = LlamaSettings(),
    before_decode: Callable[[int], None] | None = None,
) -> ProgressGenerator[list[np.ndarray]]:
    """The same schedule with no callback installed, in this process: what capture must not change."""
    run = LlamaRun(Path(model_path), schedule, settings, record=False)
    run.before_decode = before_decode
    try:
        return (yield from run.run())
    finally:
        run.close()
