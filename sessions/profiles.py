"""Engine profiles: how an engine's tensor names map to canonical ops.

A profile is a TOML file (docs/profiles.md). Built-in profiles live in
`sessions/builtin_profiles/` and are written in the same format users write, so they double
as examples. A rule matches a name pattern (with a `{layer}` placeholder) and, optionally, an
occurrence of that name within (step, segment, layer) -- the way engines that reuse one name
for several stages are told apart -- and gives the canonical op and layout transform.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.layout_transform import LayoutError, LayoutTransform

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_profiles"
BUILTIN_FILES = {"canonical": "canonical.toml", "llama.cpp": "llama_cpp.toml", "mlx-lm": "mlx_lm.toml"}

CANONICAL_OPS: dict[str, str] = {
    "embed": "rows hidden",
    "attn_norm": "rows hidden",
    "q_proj": "rows (heads dim)",
    "k_proj": "rows (heads dim)",
    "v_proj": "rows (heads dim)",
    "q_norm": "heads rows dim",
    "k_norm": "heads rows dim",
    "q_rope": "heads rows dim",
    "k_rope": "heads rows dim",
    "sdpa": "rows (heads dim)",
    "o_proj": "rows hidden",
    "attn_residual": "rows hidden",
    "ffn_norm": "rows hidden",
    "ffn_gate": "rows ffn",
    "ffn_up": "rows ffn",
    "ffn_act": "rows ffn",
    "ffn_down": "rows hidden",
    "layer_out": "rows hidden",
    "final_norm": "rows hidden",
    "logits": "rows vocab",
}
"""Canonical ops and their canonical layouts (docs/architecture.md); `(heads dim)` is one axis."""

HEADS_SOURCE: dict[str, tuple[str, ...]] = {
    "q_proj": ("q_rope", "q_norm"),
    "sdpa": ("q_rope", "q_norm"),
    "k_proj": ("k_rope", "k_norm"),
    "v_proj": ("k_rope", "k_norm"),
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
    canonical_occurrence: int = 0
    layout: LayoutTransform | None = None
    regex: re.Pattern[str] = field(default=re.compile(""), compare=False, repr=False)

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


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    rules: tuple[NameRule, ...]
    contracts: dict[str, tuple[str, ...]]
    """Composite contract id -> the effective contract ids (routes) validated for it."""
    source: str

    def match(self, name: str, occurrence: int, count: int) -> RuleMatch | None:
        """The first rule (in file order) that matches; None if none does."""
        for rule in self.rules:
            found = rule.regex.fullmatch(name)
            if found is None or not rule.matches_occurrence(occurrence, count):
                continue
            layer = int(found.group("layer")) if "layer" in found.groupdict() else None
            canonical = occurrence if rule.occurrence is None else rule.canonical_occurrence
            return RuleMatch(rule.op, layer, canonical, rule.layout)
        return None

    def names_match(self, name: str) -> bool:
        return any(rule.regex.fullmatch(name) for rule in self.rules)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = pattern.split("{layer}")
    if len(parts) > 2:
        raise ValueError("{layer} may appear once")
    return re.compile(r"(?P<layer>\d+)".join(re.escape(p) for p in parts))


def _rule(entry: Any, where: str) -> NameRule:
    if not isinstance(entry, dict):
        raise ProfileError(f"{where}: must be a table")
    unknown = set(entry) - {"name", "op", "occurrence", "count", "min_count", "canonical_occurrence", "layout"}
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    pattern, op = entry.get("name"), entry.get("op")
    if not isinstance(pattern, str) or not pattern:
        raise ProfileError(f"{where}: 'name' must be a non-empty string")
    if op not in CANONICAL_OPS:
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
    except ValueError as exc:
        raise ProfileError(f"{where}: name {pattern!r}: {exc}") from None
    return NameRule(
        pattern=pattern,
        op=op,
        occurrence=occurrence,
        count=entry.get("count"),
        min_count=entry.get("min_count"),
        canonical_occurrence=entry.get("canonical_occurrence", 0),
        layout=layout,
        regex=regex,
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
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    return profile_from_dict(data, str(path))


def builtin_profiles() -> dict[str, Profile]:
    return {name: load_profile_file(BUILTIN_DIR / file) for name, file in BUILTIN_FILES.items()}


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
