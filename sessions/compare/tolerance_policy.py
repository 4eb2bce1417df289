"""Per-op, per-dtype tolerances from one TOML policy file, used alike by the CLI, the viewer and reports.

Real ports accept different bounds at different places (a few ULPs on the logits, bit-exact on
the KV cache); Polygraphy and SGLang users ask for per-output thresholds. A policy names ops by
canonical op name or by a regular expression over the op key's text form, optionally for one
dtype; the first rule that fits a pair gives its tolerance, else the default. Bits are always
counted: a tolerance only decides whether a difference fails.

```toml
[default]            # optional; bit-exact when absent
max_ulp = 0

[[rule]]
op = "logits"        # a canonical op name ...
dtype = "bfloat16"   # ... optionally only for this dtype
max_ulp = 4

[[rule]]
match = '^0:visual:\\d+:sdpa(@.*)?$'   # ... or a regex over the key text (0:visual:3:sdpa, 0:visual:3:sdpa@5-76)
atol = 1e-3
rtol = 1e-2
```
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import re2

from sessions.bits.dtypes import LOGICAL_DTYPES
from sessions.compare.key import OpKey
from sessions.compare.profiles import CANONICAL_OPS
from sessions.compare.tensor_diff import Tolerance
from sessions.compare.tolerance_bounds import (
    BOUNDS,
    bound_problem,
    drop_zero_bounds,
    ulp_problem,
)
from sessions.side_file import parse_problem, read_side_file

MAX_POLICY_BYTES = 4 * 1024**2
"""A policy is written by hand (a few rules); 4 MiB leaves room for a generated one with thousands
of rules, and refuses a device or a huge file before it is read whole."""


class PolicyError(ValueError):
    """A policy file that cannot be used: names the file, the place and what is wrong."""


@dataclass(frozen=True)
class ToleranceRule:
    atol: float | None = None
    rtol: float | None = None
    max_ulp: int | None = None
    op: str | None = None
    match: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        drop_zero_bounds(self)

    @cached_property
    def tolerance(self) -> Tolerance:
        """One object per rule: a comparison judges pairs once per tolerance object, and with a
        new object per call every pair of a policy's run was judged anew."""
        return Tolerance(self.atol, self.rtol, self.max_ulp)

    def fits(self, key: OpKey, dtype: str) -> bool:
        if self.dtype is not None and self.dtype != dtype:
            return False
        if self.op is not None and self.op != key.op:
            return False
        return self.match is None or self._pattern.search(key.text()) is not None

    @cached_property
    def _pattern(self) -> Any:
        return re2.compile(self.match or "", _RE2_OPTIONS)


@dataclass(frozen=True)
class TolerancePolicy:
    rules: tuple[ToleranceRule, ...] = ()
    default: ToleranceRule = ToleranceRule()
    source: str = ""
    """Where the policy came from (a file path), for reports."""

    def rule_for(self, key: OpKey, dtype: str) -> ToleranceRule | None:
        """The first rule that fits the pair; None leaves it to the command line or the default."""
        return next((r for r in self.rules if r.fits(key, dtype)), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TolerancePolicy:
        """The inverse of `dataclasses.asdict` (a policy crosses a process boundary inside the options)."""
        return cls(tuple(ToleranceRule(**r) for r in data.get("rules", ())), ToleranceRule(**data.get("default", {})), data.get("source", ""))


def with_op_rules(policy: TolerancePolicy | None, per_op: Mapping[str, Tolerance], where: str) -> TolerancePolicy | None:
    """`policy` with a rule for each canonical op of `per_op` (a session's own per-op tolerances)
    ahead of its rules: the first rule that fits wins, so the session's word on an op counts over
    a policy file's. `where` names them in reports."""
    if not per_op:
        return policy
    rules = tuple(ToleranceRule(t.atol, t.rtol, t.max_ulp, op=op) for op, t in per_op.items())
    if policy is None:
        return TolerancePolicy(rules, source=where)
    return TolerancePolicy(rules + policy.rules, policy.default, f"{where} and {policy.source}")


def _number(value: object, where: str, name: str, whole: bool) -> float | int:
    problem = ulp_problem(value) if whole else bound_problem(value)
    if problem is not None:
        raise PolicyError(f"{where}: {name} {problem}, not {value!r}")
    return int(value) if whole else float(value)  # type: ignore[call-overload]


def _rule(table: object, where: str, named: bool) -> ToleranceRule:
    if not isinstance(table, dict):
        raise PolicyError(f"{where}: must be a table")
    allowed = {*BOUNDS, *(("op", "match", "dtype") if named else ())}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    bounds = {name: _number(table[name], where, name, name == "max_ulp") for name in BOUNDS if name in table}
    names = {name: table[name] for name in ("op", "match", "dtype") if name in table}
    for name, value in names.items():
        if not isinstance(value, str) or not value:
            raise PolicyError(f"{where}: {name} must be a non-empty string, not {value!r}")
    if "op" in names and names["op"] not in CANONICAL_OPS:
        raise PolicyError(f"{where}: op {names['op']!r} is not a canonical op ({', '.join(sorted(CANONICAL_OPS))})")
    if "dtype" in names and names["dtype"] not in LOGICAL_DTYPES:
        raise PolicyError(f"{where}: dtype {names['dtype']!r} is not a capture dtype ({', '.join(sorted(LOGICAL_DTYPES))})")
    if named and "op" not in names and "match" not in names:
        raise PolicyError(f"{where}: a rule needs `op` (a canonical op name) or `match` (a regex over keys like 0:visual:0:sdpa)")
    if "match" in names:
        problem = _pattern_problem(names["match"])
        if problem is not None:
            raise PolicyError(f"{where}: match {names['match']!r} is not a regular expression ({problem})")
    return ToleranceRule(**bounds, **names)  # type: ignore[arg-type]


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # its refusal is said once, in the policy's message, not also logged to stderr


def _pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a rule's `match`. It is written in Python's syntax and matched by
    RE2, in time linear in the key: Python's own matcher backtracks without limit, and a pattern
    such as `.*.*.*.*.*.*.*.*x` or `(.*){20}x` held a report on one key for good. RE2 has no back
    references or look-arounds, which no pattern over op keys needs."""
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        return str(exc)
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return f"{reason}: keys are matched by RE2, which has no back references, look-arounds or \\Z (use $)"
    return None


def load_policy(path: str | Path) -> TolerancePolicy:
    """Read and check a policy file; PolicyError names the file, the place and what is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(read_side_file(path, MAX_POLICY_BYTES).decode("utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise PolicyError(f"{path}: not TOML ({parse_problem(exc)})") from None
    unknown = sorted(set(data) - {"default", "rule"})
    if unknown:
        raise PolicyError(f"{path}: unknown table(s) {', '.join(unknown)}; a policy has [default] and [[rule]]")
    rules = data.get("rule", [])
    if not isinstance(rules, list):
        raise PolicyError(f"{path}: `rule` must be an array of tables ([[rule]])")
    default = _rule(data.get("default", {}), f"{path} [default]", named=False)
    return TolerancePolicy(tuple(_rule(r, f"{path} rule {i + 1}", named=True) for i, r in enumerate(rules)), default, str(path.resolve()))
