"""What every recorder shares: the token schedule (one prefill, then greedy decode steps) and batches of requests.

The prefill is token step 0: one forward call, or the calls a cut names (`--segments`), and
the prompt's last tokens fed one call each (`--feed-last`); a call split into micro-batches
(llama.cpp's `n_ubatch`, MLX's prefill step) is one segment per piece. Every later step decodes
the greedy token of the step before, segment `decode`. Runs cut alike align call by call; runs
cut differently align by token position, which every record carries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.capture import format as cf
from sessions.capture.text_fields import control_character
from sessions.printable import printable

PREFILL = "prefill"
DECODE = "decode"
FEED = "feed-"
"""Segments `feed-P`: the prompt's last tokens fed one call each (`--feed-last`)."""
_INTEGER = re.compile(r"-?[0-9]+")


Piece = tuple[str, int, int]
"""(segment, first position, stop position) of one micro-batch."""


def _pieces(name: str, first: int, stop: int, ubatch: int) -> list[Piece]:
    """One call's micro-batches: the call itself when it fits in `ubatch`, else `name.0`, `name.1`, ..."""
    bounds = [(start, min(start + ubatch, stop)) for start in range(first, stop, ubatch)]
    if len(bounds) == 1:
        return [(name, first, stop)]
    return [(f"{name}.{i}", start, end) for i, (start, end) in enumerate(bounds)]


def parse_segments(text: str) -> tuple[tuple[str, int], ...]:
    """`5,1008,14` or `text-before=5,visual=1008,text-after=14` as (segment, tokens) calls; unnamed
    calls are `prefill.0`, `prefill.1`, ..."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("no segment sizes given")
    calls: list[tuple[str, int]] = []
    for i, part in enumerate(parts):
        name, named, size = part.rpartition("=")
        if not _INTEGER.fullmatch(size) or int(size) < 1:
            raise ValueError(f"segment '{printable(part)}': the size must be a positive integer (e.g. 5 or visual=1008)")
        problem = _segment_name_problem(name.strip()) if named else None
        if problem is not None:
            raise ValueError(f"segment '{printable(part)}': {problem}")
        calls.append((name.strip() or f"{PREFILL}.{i}", int(size)))
    names = [n for n, _ in calls]
    if len(set(names)) != len(names):
        raise ValueError(f"segment names repeat in {text!r}: each call needs its own name")
    return tuple(calls)


def _segment_name_problem(name: str) -> str | None:
    """Why a name given to a prefill call cannot be a segment's, or None: the capture stores it
    in a 16-byte text field, shows it in reports, and names the calls it makes itself
    (`prefill.N`, `NAME.N` micro-batches, `feed-P`, `decode`), which a given name must not take."""
    control = control_character(name)
    if not name:
        return "the name is empty (leave out `=` for an unnamed call)"
    if control is not None:
        return f"the name holds a control character ({printable(control)})"
    if len(name.encode("utf-8")) > cf.INDEX_DTYPE["segment"].itemsize:
        return f"the name is longer than the capture's {cf.INDEX_DTYPE['segment'].itemsize}-byte segment field"
    if name == DECODE or name.startswith(FEED) or "." in name:
        return f"`{DECODE}`, `{FEED}P` and names with `.` are the ones a recording gives its own calls"
    return None


def parse_token_list(text: str, option: str) -> list[int]:
    """`1,2,3` (spaces allowed) as token ids; a clear message naming `option` for anything else."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{option}: no token ids given")
    bad = next((p for p in parts if not _INTEGER.fullmatch(p)), None)
    if bad is not None:
        raise ValueError(f"{option}: token id '{printable(bad)}' is not an integer")
    tokens = [int(p) for p in parts]
    negative = [t for t in tokens if t < 0]
    if negative:
        raise ValueError(f"{option}: token id {negative[0]} is negative")
    return tokens


@dataclass(frozen=True)
class TokenSchedule:
    """How a run feeds its prompt and decodes: the cut of the prompt into forward calls decides
    which kernels each position meets, so two runs cut differently are compared by position."""

    prompt: tuple[int, ...]
    decode_steps: int = 0
    ubatch: int = 512
    stop_tokens: frozenset[int] = frozenset()
    cut: tuple[tuple[str, int], ...] = ()
    """The prompt's forward calls as (segment, tokens), e.g. text-before 5, visual 1008, text-after 14; empty: one call."""
    feed_last: int = 0
    """The prompt's last tokens fed one call each (segments `feed-P`), as decode would feed them."""

    def __post_init__(self) -> None:
        if self.decode_steps < 0:
            raise ValueError(f"decode steps must be >= 0, not {self.decode_steps}")
        if not self.prompt:
            raise ValueError("the prompt needs at least one token")
        if self.ubatch < 1:
            raise ValueError(f"micro-batch size must be positive, not {self.ubatch}")
        head = len(self.prompt) - self.feed_last
        if self.feed_last < 0:
            raise ValueError(f"--feed-last {self.feed_last}: the count of prompt tokens fed one by one must be >= 0")
        if self.feed_last >= len(self.prompt):
            raise ValueError(f"feeding the last {self.feed_last} of {len(self.prompt)} prompt tokens one by one leaves no prefill")
        if self.cut and sum(n for _, n in self.cut) != head:
            raise ValueError(f"the segments hold {sum(n for _, n in self.cut)} tokens; the prompt's prefill has {head}")
        field = cf.INDEX_DTYPE["segment"].itemsize
        long = next((name for call in self.calls() if len(call) > 1 for name, _, _ in call if len(name.encode("utf-8")) > field), None)
        if long is not None:
            raise ValueError(
                f"segment '{printable(long)}' is longer than the capture's {field}-byte segment field: a call longer than "
                f"the micro-batch size {self.ubatch} is recorded as NAME.0, NAME.1, ...; give it a shorter name"
            )

    def calls(self) -> list[list[Piece]]:
        """The prompt's forward calls in order, each as its micro-batches (llama.cpp's `n_ubatch`)."""
        head = len(self.prompt) - self.feed_last
        calls: list[list[Piece]] = []
        first = 0
        for name, size in self.cut or ((PREFILL, head),):
            calls.append(_pieces(name, first, first + size, self.ubatch))
            first += size
        calls += [[(f"{FEED}{p}", p, p + 1)] for p in range(head, len(self.prompt))]
        return calls

    def segments(self) -> list[Piece]:
        """Every micro-batch of the prompt in order: one segment each."""
        return [piece for call in self.calls() for piece in call]

    def describe(self) -> str:
        return " ".join(map(str, self.prompt))

    def as_provenance(self) -> dict[str, object]:
        return {
            "prompt_tokens": list(self.prompt),
            "decode_steps": self.decode_steps,
            "ubatch": self.ubatch,
            "stop_tokens": sorted(self.stop_tokens),
            "cut": [list(c) for c in self.cut],
            "feed_last": self.feed_last,
            "segments": [list(s) for s in self.segments()],
        }


def check_batch(batch: int, row: int) -> None:
    """ValueError unless `row` is a request of a batch of `batch`."""
    if batch < 1:
        raise ValueError(f"a batch holds at least 1 request, not {batch}")
    if not 0 <= row < batch:
        raise ValueError(f"row {row} is not a row of a batch of {batch}")


def batch_prompts(prompt: tuple[int, ...], batch: int, row: int, vocab: int) -> list[list[int]]:
    """`batch` requests of the prompt's length with the prompt itself in `row`; the others are the
    prompt's tokens shifted by their row (mod the vocabulary), so every row is a different request.
    Equal lengths keep every call's rows aligned across the batch, so a record splits by request."""
    return [[(t + (r - row) * 7919) % vocab if r != row else t for t in prompt] for r in range(batch)]


def _config_size(config: Mapping[str, Any], name: str) -> int | None:
    """A positive integer config field, or None: the config comes from someone else's weights."""
    value = config.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_run_size(
    schedule: TokenSchedule, batch: int, config: Mapping[str, Any], cache_element_bytes: float, memory: int, context_named: str = "max_position_embeddings"
) -> None:
    """ValueError for a run the model cannot take, before it starts: more positions than the
    model's context (`max_position_embeddings`, named in the message as the model's own file
    names it: `context_named`), or more memory than `memory` bytes for what it must hold at
    once at the least, every request's KV cache at the last position and the largest call's
    logits (an engine needs more: its weights and activations). A field the config lacks leaves
    its check out."""
    positions = len(schedule.prompt) + schedule.decode_steps
    context = _config_size(config, "max_position_embeddings")
    if context is not None and positions > context:
        raise ValueError(
            f"the run needs {positions} positions (prompt {len(schedule.prompt)}, decode steps {schedule.decode_steps}), "
            f"more than the model's context of {context} ({context_named})"
        )
    layers, heads, vocab = (_config_size(config, n) for n in ("num_hidden_layers", "num_attention_heads", "vocab_size"))
    kv_heads = _config_size(config, "num_key_value_heads") or heads
    head_dim = _config_size(config, "head_dim") or (hidden // heads if heads and (hidden := _config_size(config, "hidden_size")) else None)
    cache = batch * positions * layers * 2 * kv_heads * head_dim * cache_element_bytes if layers and kv_heads and head_dim else 0
    logits = batch * max(stop - first for _, first, stop in schedule.segments()) * vocab * 4 if vocab else 0
    if cache + logits > memory:
        gib = 1 << 30
        raise ValueError(
            f"a batch of {batch}, {positions} positions each, needs at least {(cache + logits) / gib:.1f} GiB at once "
            f"(KV cache {cache / gib:.1f} GiB, logits {logits / gib:.1f} GiB), more than this machine's {memory / gib:.1f} GiB"
        )
