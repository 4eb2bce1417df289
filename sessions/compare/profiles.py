"""Engine profiles: how an engine's tensor names map to canonical ops.

A profile is a TOML file (docs/profiles.md). Built-in profiles live in
`sessions/compare/builtin_profiles/` and are written in the same format users write, so they double
as examples. A rule matches a name pattern (with a `{layer}` placeholder, `{n}` for any number, `{any}` for
any text) and, optionally, an occurrence of that name within (step, segment, layer) -- the way
engines that reuse one name for several stages are told apart -- and gives the canonical op and
layout transform. Real-engine recorders give more to match on: the record's kernel id (the
llama.cpp recorder writes the ggml op there, `kernel = "ROPE"`) and its source tensor names
(`source = "blk.{layer}.attn_output.weight"` anchors a node llama.cpp leaves unnamed). A rule
with `one_sided = "why"` instead of an op names a stage the other engine has no tensor for;
alignment lists such records as one-sided with that reason. With an op as well, the stage is
canonical but optional (the KV cache's written cells: llama.cpp records them, mlx-lm does not):
its records pair when the other capture has that op, and are one-sided with the reason when not.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sessions.compare.key import OpKey
from sessions.compare.layout_transform import LayoutError, LayoutTransform
from sessions.printable import printable
from sessions.side_file import parse_problem, read_side_file

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_profiles"
BUILTIN_FILES = {"canonical": "canonical.toml", "llama.cpp": "llama_cpp.toml", "mlx-lm": "mlx_lm.toml"}
MAX_PROFILE_BYTES = 4 * 1024**2
"""The built-in profiles are a few KiB; 4 MiB leaves room for a generated one with thousands of
rules, and refuses a device or a huge file before it is read whole."""

CANONICAL_OPS: dict[str, str] = {
    "embed": "rows hidden",
    "attn_rms": "rows hidden",
    "attn_norm": "rows hidden",
    "q_proj": "rows (heads dim)",
    "k_proj": "rows (heads dim)",
    "v_proj": "rows (heads dim)",
    "q_rms": "heads rows dim",
    "q_norm": "heads rows dim",
    "k_rms": "heads rows dim",
    "k_norm": "heads rows dim",
    "q_rope": "heads rows dim",
    "k_rope": "heads rows dim",
    "k_cache": "rows (heads dim)",
    "v_cache": "rows (heads dim)",
    "attn_scores": "heads rows cells",
    "attn_probs": "heads rows cells",
    "attn_pv": "heads rows dim",
    "sdpa": "rows (heads dim)",
    "o_proj": "rows hidden",
    "attn_residual": "rows hidden",
    "ffn_rms": "rows hidden",
    "ffn_norm": "rows hidden",
    "ffn_gate": "rows ffn",
    "ffn_up": "rows ffn",
    "ffn_act": "rows ffn",
    "ffn_down": "rows hidden",
    "layer_out": "rows hidden",
    "final_rms": "rows hidden",
    "final_norm": "rows hidden",
    "logits": "rows vocab",
}
"""Canonical ops and their canonical layouts (docs/architecture.md); `(heads dim)` is one axis.
The `*_rms` ops (an RMSNorm before its weight multiply), `attn_scores`, `attn_probs` and
`attn_pv` (attention's matmuls and softmax one by one) are stages a fused kernel (MLX's) never
writes out: optional, compared between two captures that both record them."""


STAGE_OF: dict[str, str] = {
    "attn_rms": "attn_norm",
    "q_rms": "q_norm",
    "k_rms": "k_norm",
    "ffn_rms": "ffn_norm",
    "final_rms": "final_norm",
    "attn_scores": "sdpa",
    "attn_probs": "sdpa",
    "attn_pv": "sdpa",
}
"""Stages only an engine without fused kernels writes out (llama.cpp), and the op (same step,
segment and layer) that computes each: that op's rerun and diagnosis cover them."""


def whole_op(key: OpKey) -> OpKey:
    """The op whose rerun covers `key`: itself, or the op a stage (`STAGE_OF`) is part of."""
    op = STAGE_OF.get(key.op)
    return key if op is None else OpKey(key.step, key.segment, key.layer, op, key.occurrence, key.positions)


PADDED_AXIS = "cells"
"""A canonical axis whose length is the engine's allocation, not the model's (llama.cpp pads its
KV cache to a multiple of 256 cells): runs cut differently may hold more or fewer of them."""


@cache
def canonical_axes(op: str) -> tuple[str, ...]:
    """`op`'s canonical axes by name ("rows", "(heads dim)", ...)."""
    return tuple(re.findall(r"\([^)]*\)|\S+", CANONICAL_OPS[op]))


@cache
def padded_axis(op: str) -> int | None:
    """The canonical axis of `op` that counts padded cache cells, if it has one."""
    axes = canonical_axes(op)
    return axes.index(PADDED_AXIS) if PADDED_AXIS in axes else None


@cache
def rows_axis(op: str) -> int:
    """The canonical axis of `op` whose index is a token position: what alignment by position cuts."""
    return canonical_axes(op).index("rows")

HEADS_SOURCE: dict[str, tuple[str, ...]] = {
    "q_proj": ("q_rope", "q_norm"),
    "sdpa": ("q_rope", "q_norm"),
    "k_proj": ("k_rope", "k_norm"),
    "v_proj": ("k_rope", "k_norm"),
    "k_cache": ("k_rope", "k_norm"),
    "v_cache": ("k_rope", "k_norm"),
}
"""For ops whose canonical axis is `(heads dim)`: the ops of the same layer whose axis 0 counts the heads."""


class ProfileError(ValueError):
    """A profile file that cannot be used, with the file and the place."""


@dataclass(frozen=True)
class NameRule:
    pattern: str
    op: str
    occurrence: int | str | None = None
    """None: any occurrence, passed through as the canonical occurrence. int n: the n-th
    (negative counts from the end). "last": the last one."""
    count: int | None = None
    """The rule applies only when the name occurs exactly this many times in (step, segment, layer)."""
    min_count: int | None = None
    canonical_occurrence: int | None = None
    """The canonical occurrence of every record the rule matches; unset: 0 when `occurrence` is
    given, else the record's own occurrence."""
    layout: LayoutTransform | None = None
    regex: re.Pattern[str] = field(default=re.compile(""), compare=False, repr=False)
    kernel: str | None = None
    """Only records whose kernel id is exactly this (llama.cpp recorder: the ggml op)."""
    source: str | None = None
    """Only records one of whose source tensors matches this pattern (may carry {layer})."""
    source_regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    without_sources: bool = False
    """Only records whose source tensors are unknown: a fallback for callers that do not read
    them, which must not catch a record its sources would place elsewhere."""
    one_sided: str | None = None
    """Why the other engine may have no such tensor: instead of an op (it never has), or beside
    one (an optional stage, one-sided only when the other capture has no record of the op)."""

    def matches_occurrence(self, occurrence: int, count: int) -> bool:
        if self.count is not None and count != self.count:
            return False
        if self.min_count is not None and count < self.min_count:
            return False
        if self.occurrence is None:
            return True
        if self.occurrence == "last":
            return occurrence == count - 1
        assert isinstance(self.occurrence, int)
        wanted = self.occurrence if self.occurrence >= 0 else count + self.occurrence
        return occurrence == wanted


@dataclass(frozen=True)
class RuleMatch:
    op: str
    layer: int | None
    """The layer named in the engine name, or None when the pattern has no {layer}."""
    occurrence: int
    layout: LayoutTransform | None
    one_sided: str | None = None
    """Set when the record is a known stage that may have no counterpart: the reason (with `op`
    empty: it never has one)."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    rules: tuple[NameRule, ...]
    contracts: dict[str, tuple[str, ...]]
    """Composite contract id -> the effective contract ids (routes) validated for it."""
    source: str

    def match(
        self, name: str, occurrence: int, count: int, kernel_id: str = "", sources: tuple[str, ...] = ()
    ) -> RuleMatch | None:
        """The first rule (in file order) that matches; None if none does.

        A rule with `kernel` needs that kernel id; a rule with `source` needs a source name that
        fits it (records without known sources never match such a rule); a `without_sources`
        rule needs the sources to be unknown."""
        for rule in self.rules:
            found = rule.regex.fullmatch(name)
            if found is None or not rule.matches_occurrence(occurrence, count):
                continue
            if rule.kernel is not None and rule.kernel != kernel_id:
                continue
            if rule.without_sources and sources:
                continue
            layer = int(found.group("layer")) if "layer" in found.groupdict() else None
            if rule.source_regex is not None:
                anchored = _source_layer(rule.source_regex, sources, layer)
                if anchored is False:
                    continue
                layer = layer if anchored is None else anchored
            canonical = rule.canonical_occurrence
            if canonical is None:
                canonical = occurrence if rule.occurrence is None else 0
            return RuleMatch(rule.op, layer, canonical, rule.layout, rule.one_sided)
        return None

    @property
    def uses_sources(self) -> bool:
        """Whether any rule needs the records' source tensor names."""
        return any(rule.source is not None for rule in self.rules)

    def names_match(self, name: str) -> bool:
        return any(rule.regex.fullmatch(name) for rule in self.rules)


def _source_layer(regex: re.Pattern[str], sources: tuple[str, ...], layer: int | None) -> int | None | bool:
    """The layer the first fitting source names (None if its pattern has no {layer}); False if
    no source fits, or none fits the layer the record's own name gives."""
    for source in sources:
        found = regex.fullmatch(source)
        if found is None:
            continue
        if "layer" not in found.groupdict():
            return None
        anchored = int(found.group("layer"))
        if layer is None or anchored == layer:
            return anchored
    return False


_PLACEHOLDERS = {"{layer}": r"(?P<layer>\d+)", "{n}": r"\d+", "{any}": r".*"}


MAX_WILDCARDS = 3
"""{any} and {n} per pattern at most: each one multiplies what a regex tries on a name that does
not fit (20 of them took 51 s on one name); the built-in profiles use 2 at most."""


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    if pattern.count("{layer}") > 1:
        raise ValueError("{layer} may appear once")
    while "{any}{any}" in pattern:
        pattern = pattern.replace("{any}{any}", "{any}")
    wildcards = pattern.count("{any}") + pattern.count("{n}")
    if wildcards > MAX_WILDCARDS:
        raise ValueError(f"{wildcards} {{any}}/{{n}} wildcards; a pattern takes at most {MAX_WILDCARDS}")
    parts = re.split(r"(\{layer\}|\{n\}|\{any\})", pattern)
    return re.compile("".join(_PLACEHOLDERS.get(p, re.escape(p)) for p in parts))


def _rule(entry: Any, where: str) -> NameRule:
    if not isinstance(entry, dict):
        raise ProfileError(f"{where}: must be a table")
    known = {"name", "op", "occurrence", "count", "min_count", "canonical_occurrence", "layout", "kernel", "source", "one_sided", "without_sources"}
    unknown = set(entry) - known
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    pattern, op = entry.get("name"), entry.get("op")
    if not isinstance(pattern, str) or not pattern:
        raise ProfileError(f"{where}: 'name' must be a non-empty string")
    for key in ("kernel", "source", "one_sided"):
        if key in entry and (not isinstance(entry[key], str) or not entry[key]):
            raise ProfileError(f"{where}: {key} must be a non-empty string")
    if not isinstance(entry.get("without_sources", False), bool):
        raise ProfileError(f"{where}: without_sources must be true or false")
    one_sided = entry.get("one_sided")
    if one_sided is not None and op is None:
        if "layout" in entry:
            raise ProfileError(f"{where}: a one_sided rule without an op takes no layout")
        op = ""
    elif op not in CANONICAL_OPS:
        raise ProfileError(f"{where}: op {op!r} is not a canonical op ({', '.join(CANONICAL_OPS)})")
    occurrence = entry.get("occurrence")
    if occurrence is not None and occurrence != "last" and (not isinstance(occurrence, int) or isinstance(occurrence, bool)):
        raise ProfileError(f"{where}: occurrence must be an integer or \"last\", not {occurrence!r}")
    for key in ("count", "min_count", "canonical_occurrence"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ProfileError(f"{where}: {key} must be a non-negative integer")
    layout = None
    if "layout" in entry:
        if not isinstance(entry["layout"], str):
            raise ProfileError(f"{where}: layout must be a string")
        try:
            layout = LayoutTransform.parse(entry["layout"])
        except LayoutError as exc:
            raise ProfileError(f"{where}: {exc}") from None
    try:
        regex = _pattern_regex(pattern)
        source_regex = _pattern_regex(entry["source"]) if "source" in entry else None
    except ValueError as exc:
        raise ProfileError(f"{where}: name or source pattern: {exc}") from None
    return NameRule(
        pattern=pattern,
        op=op,
        occurrence=occurrence,
        count=entry.get("count"),
        min_count=entry.get("min_count"),
        canonical_occurrence=entry.get("canonical_occurrence"),
        layout=layout,
        regex=regex,
        kernel=entry.get("kernel"),
        source=entry.get("source"),
        source_regex=source_regex,
        one_sided=one_sided,
        without_sources=entry.get("without_sources", False),
    )


def profile_from_dict(data: dict[str, Any], source: str) -> Profile:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{source}: 'name' must be a non-empty string")
    rules = data.get("rule")
    if not isinstance(rules, list) or not rules:
        raise ProfileError(f"{source}: needs at least one [[rule]]")
    contracts_raw = data.get("contracts", {})
    if not isinstance(contracts_raw, dict) or not all(
        isinstance(v, list) and all(isinstance(r, str) for r in v) for v in contracts_raw.values()
    ):
        raise ProfileError(f"{source}: [contracts] maps contract ids to lists of route ids")
    unknown = set(data) - {"name", "description", "rule", "contracts"}
    if unknown:
        raise ProfileError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    return Profile(
        name=name,
        description=str(data.get("description", "")),
        rules=tuple(_rule(entry, f"{source}: rule {i + 1}") for i, entry in enumerate(rules)),
        contracts={k: tuple(v) for k, v in contracts_raw.items()},
        source=source,
    )


def load_profile_file(path: str | Path) -> Profile:
    path = Path(path)
    try:
        text = read_side_file(path, MAX_PROFILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProfileError(f"{path}: not valid TOML ({parse_problem(exc)})") from None
    unprintable = _unprintable_text(data, "")
    if unprintable is not None:
        where, value = unprintable
        raise ProfileError(f"{path}: {where} holds a control character ({printable(value)}): a profile's words are printed in every report")
    return profile_from_dict(data, str(path))


def _unprintable_text(value: object, where: str) -> tuple[str, str] | None:
    """The first string of a parsed profile (key or value) holding a control character, and
    where: a profile is someone else's file, and its name, descriptions and reasons reach the
    terminal (an escape sequence in `name` printed a fake verdict line)."""
    if isinstance(value, str):
        return None if value.isprintable() else (where or "a value", value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        place = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and not key.isprintable():
            return place, key
        found = _unprintable_text(item, place)
        if found is not None:
            return found
    return None


@cache
def _builtin_profiles() -> tuple[tuple[str, Profile], ...]:
    """Parsed once per process: they ship with the package, and detecting a capture's profile
    parses all of them (about 7 ms, once per side of every comparison)."""
    return tuple((name, load_profile_file(BUILTIN_DIR / file)) for name, file in BUILTIN_FILES.items())


def builtin_profiles() -> dict[str, Profile]:
    return dict(_builtin_profiles())


def resolve_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a user profile by TOML path."""
    builtins = builtin_profiles()
    if name_or_path in builtins:
        return builtins[name_or_path]
    if name_or_path.endswith(".toml") or Path(name_or_path).exists():
        return load_profile_file(name_or_path)
    raise ProfileError(f"{name_or_path!r} is neither a built-in profile ({', '.join(builtins)}) nor a TOML file")


def detect_profile(names: Iterable[str]) -> Profile | None:
    """The built-in profile that recognises most of the distinct names (more than half), if any."""
    distinct = set(names)
    if not distinct:
        return None
    best, best_share = None, 0.5
    for profile in builtin_profiles().values():
        share = sum(profile.names_match(n) for n in distinct) / len(distinct)
        if share > best_share:
            best, best_share = profile, share
    return best
