"""The gate manifest: which capture pairs a gate judges, and with what options (docs/gate.md).

A parity claim is made over many cases (images, prompts, seeds), each judged as `report`
judges one pair. The manifest is TOML so that a person writes it by hand and a pipeline
generates it; paths in it are relative to the manifest's own folder, so a run directory can
be moved or mounted elsewhere whole. A mistake in it (a typo'd key, a negative budget, a glob
that matches nothing) is refused before any capture is read, with the file, the line and the
case named: a gate that silently judged fewer cases than intended would over-claim.
"""

from __future__ import annotations

import glob
import re
import tomllib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sessions.compare.align_modes import ALIGN_MODES
from sessions.compare.options import CompareOptions
from sessions.compare.profiles import builtin_profiles
from sessions.compare.tolerance_bounds import bound_problem, ulp_problem
from sessions.compare.tolerance_policy import PolicyError, TolerancePolicy, load_policy
from sessions.side_file import parse_problem, read_side_file

EOS_STOP = "stop"
"""Compare up to the shared EOS when both runs reach it; not reaching it is no failure."""
EOS_REQUIRE = "require"
"""The case fails unless both runs reach the same stop token within its budget (the per-image EOS gate)."""
EOS_RULES = (EOS_STOP, EOS_REQUIRE)

MAX_MANIFEST_BYTES = 16 * 1024**2
"""A pipeline may list tens of thousands of cases (a few hundred bytes each); 16 MiB holds that,
and refuses a device or a huge file before it is read whole."""

OPTION_KEYS = ("atol", "rtol", "max_ulp", "tolerance_policy", "native_profile", "oracle_profile", "align", "token_budget", "eos")
"""Keys a case sets for itself, or the manifest's top level sets for every case."""
CASE_KEYS = ("name", "native", "oracle", *OPTION_KEYS)
TOP_KEYS = ("cases", "oracle", "case", *OPTION_KEYS)
"""`cases` (a native glob) with `oracle` (the matching oracle pattern); `case`: the explicit cases."""

_WILDCARD = re.compile(r"[*?]")
_TOML_LOCATION = re.compile(r"\s*\(at line (\d+), column \d+\)$")


class ManifestError(Exception):
    """A manifest that cannot be used, located: the file, the line when known, the case, what is wrong."""

    def __init__(self, path: Path, line: int | None, where: str, problem: str) -> None:
        self.path, self.line, self.where, self.problem = path, line, where, problem
        place = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{place}: {where}: {problem}" if where else f"{place}: {problem}")


@dataclass(frozen=True)
class GateCase:
    """One pair to judge: absolute paths as the workers see them, and the options to judge it by."""

    name: str
    native: str
    oracle: str
    options: CompareOptions
    """The comparison's options; `options.max_steps` is the case's token budget."""
    eos: str = EOS_STOP

    @property
    def token_budget(self) -> int | None:
        return self.options.max_steps


@dataclass(frozen=True)
class Manifest:
    path: Path
    cases: tuple[GateCase, ...]


def load_manifest(path: str | Path) -> Manifest:
    """Read and check a manifest file; raises ManifestError."""
    path = Path(path).absolute()
    try:
        text = read_side_file(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(path, None, "", f"cannot read the manifest ({exc})") from None
    return parse_manifest(text, path)


def parse_manifest(text: str, path: Path) -> Manifest:
    """The manifest in `text`, read as the file at `path` (relative paths start at its folder)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LOCATION.search(str(exc))
        line = int(found.group(1)) if found else None
        raise ManifestError(path, line, "", f"not valid TOML: {_TOML_LOCATION.sub('', str(exc))}") from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(path, None, "", f"not valid TOML: {parse_problem(exc)}") from None
    reader = _Reader(text, path)
    reader.check_keys(data, TOP_KEYS, None, "the top level")
    defaults = {k: data[k] for k in OPTION_KEYS if k in data}
    # Checked on their own, not only through the cases: a bad default that every case overrides
    # was accepted, and became a refusal the day a case was added without that key.
    reader.options(defaults, (), None, "the top level")
    cases: list[GateCase] = []
    if "cases" in data or "oracle" in data:
        cases += reader.glob_cases(data, defaults)
    explicit = data.get("case", [])
    if not isinstance(explicit, list) or not all(isinstance(c, dict) for c in explicit):
        raise ManifestError(path, reader.key_line(None, "case"), "the top level", "'case' must be tables: [[case]]")
    for number, entry in enumerate(explicit, start=1):
        cases.append(reader.explicit_case(number, entry, defaults))
    if not cases:
        raise ManifestError(path, None, "", 'no cases: give [[case]] tables, or cases = "runs/*/native.h5" with oracle = "runs/*/oracle.h5"')
    # Each case as every other message names it: an explicit table by its number, a glob's match by its file.
    globbed = len(cases) - len(explicit)
    places = [f"the cases glob's match {case.native}" for case in cases[:globbed]] + [f"case {number}" for number in range(1, len(explicit) + 1)]
    seen: dict[str, int] = {}
    for index, case in enumerate(cases):
        if case.name in seen:
            number = index - globbed + 1 if index >= globbed else None
            line = reader.key_line(number, "name") if number is not None else reader.key_line(None, "cases")
            raise ManifestError(path, line, f"case {case.name!r}", f"the name is used twice ({places[seen[case.name]]} and {places[index]}); names must be unique")
        seen[case.name] = index
    return Manifest(path, tuple(cases))


class _Reader:
    """Checks values against the manifest's rules and knows where in the text each one stands."""

    def __init__(self, text: str, path: Path) -> None:
        self.lines = text.splitlines()
        self.path = path
        self.folder = path.parent
        self._policies: dict[Path, TolerancePolicy] = {}

    # -- locating ----------------------------------------------------------------------------

    def _case_span(self, number: int | None) -> tuple[int, int]:
        """0-based [start, stop) line span of [[case]] number `number` (1-based), or of the top level."""
        headers = [i for i, line in enumerate(self.lines) if re.match(r"\s*\[", line)]
        cases = [i for i in headers if re.match(r"\s*\[\[\s*case\s*\]\]", self.lines[i])]
        if number is None:
            return 0, headers[0] if headers else len(self.lines)
        if number > len(cases):
            return 0, 0
        start = cases[number - 1]
        stop = next((h for h in headers if h > start), len(self.lines))
        return start, stop

    def key_line(self, number: int | None, key: str | None) -> int | None:
        """1-based line of `key` in case `number` (None: the top level), or of the case's header."""
        start, stop = self._case_span(number)
        if key is not None:
            pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
            for i in range(start, stop):
                if pattern.match(self.lines[i]):
                    return i + 1
        return start + 1 if number is not None and stop > start else None

    def fail(self, number: int | None, key: str | None, where: str, problem: str) -> ManifestError:
        return ManifestError(self.path, self.key_line(number, key), where, problem)

    # -- values ------------------------------------------------------------------------------

    def check_keys(self, table: dict[str, Any], known: tuple[str, ...], number: int | None, where: str) -> None:
        for key in table:
            if key not in known:
                raise self.fail(number, key, where, f"unknown key {key!r}; known: {', '.join(known)}")

    def options(self, values: dict[str, Any], own: Collection[str], number: int | None, where: str) -> tuple[CompareOptions, str]:
        """CompareOptions and the EOS rule from a case's values (the top level's merged in); a bad
        value is located in the case when the case set it (`own`), else on the top level."""

        def bad(key: str, problem: str) -> ManifestError:
            inherited = key not in own
            return self.fail(None if inherited else number, key, "the top level" if inherited else where, f"{key!r} {problem}, got {values[key]!r}")

        for key, problem_of in (("atol", bound_problem), ("rtol", bound_problem), ("max_ulp", ulp_problem)):
            problem = None if values.get(key) is None else problem_of(values[key])
            if problem is not None:
                raise bad(key, problem)
        budget = values.get("token_budget")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise bad("token_budget", "must be an integer >= 1")
        align = values.get("align", "auto")
        if align not in ALIGN_MODES:
            raise bad("align", f"must be one of {', '.join(repr(mode) for mode in ALIGN_MODES)}")
        eos = values.get("eos", EOS_STOP)
        if eos not in EOS_RULES:
            raise bad("eos", f"must be one of {', '.join(repr(r) for r in EOS_RULES)}")
        profiles = {}
        for key in ("native_profile", "oracle_profile"):
            value = values.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise bad(key, "must be a built-in profile name or a .toml path")
            if value.endswith(".toml"):
                value = str(self.folder / value)
            elif value not in builtin_profiles():
                raise bad(key, f"is neither a built-in profile ({', '.join(builtin_profiles())}) nor a .toml path")
            profiles[key] = value
        options = CompareOptions(
            policy=self.policy(values, bad),
            atol=None if values.get("atol") is None else float(values["atol"]),
            rtol=None if values.get("rtol") is None else float(values["rtol"]),
            max_ulp=values.get("max_ulp"),
            max_steps=values.get("token_budget"),
            alignment=align,
            workers=1,
            **profiles,
        )
        return options, eos

    def policy(self, values: dict[str, Any], bad: Callable[[str, str], ManifestError]) -> TolerancePolicy | None:
        """The case's tolerance policy (a TOML file, docs/tolerance-policy.md), read once per path:
        its rules win over atol/rtol/max_ulp, as with `report --tolerance-policy`."""
        value = values.get("tolerance_policy")
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise bad("tolerance_policy", "must be the path of a policy file")
        path = self.folder / value
        if path not in self._policies:
            try:
                self._policies[path] = load_policy(path)
            except PolicyError as exc:
                raise bad("tolerance_policy", f"cannot be used ({exc})") from None
        return self._policies[path]

    def path_value(self, values: dict[str, Any], key: str, number: int | None, where: str) -> str:
        value = values.get(key)
        if not isinstance(value, str) or not value:
            problem = f"needs {key!r}, the path of its {key} capture" if value is None else f"{key!r} must be a path, got {value!r}"
            raise self.fail(number, key, where, problem)
        return str(self.folder / value)

    # -- cases -------------------------------------------------------------------------------

    def explicit_case(self, number: int, entry: dict[str, Any], defaults: dict[str, Any]) -> GateCase:
        where = f"case {number}" + (f" ({entry['name']!r})" if isinstance(entry.get("name"), str) else "")
        self.check_keys(entry, CASE_KEYS, number, where)
        native = self.path_value(entry, "native", number, where)
        oracle = self.path_value(entry, "oracle", number, where)
        name = entry.get("name", entry["native"])
        if not isinstance(name, str) or not name.strip():
            raise self.fail(number, "name", where, f"'name' must be a non-empty string, got {name!r}")
        options, eos = self.options({**defaults, **entry}, entry.keys(), number, where)
        return GateCase(name, native, oracle, options, eos)

    def glob_cases(self, data: dict[str, Any], defaults: dict[str, Any]) -> list[GateCase]:
        """`cases = "runs/*/native.h5"` with `oracle = "runs/*/oracle.h5"`: one case per native match,
        named by what its wildcards matched, its oracle the oracle pattern with those parts put in."""
        where = "the cases glob"
        native_pattern, oracle_pattern = data.get("cases"), data.get("oracle")
        for key, value in (("cases", native_pattern), ("oracle", oracle_pattern)):
            if not isinstance(value, str) or not value:
                raise self.fail(None, key if key in data else None, where, f"{key!r} must be a glob string: cases = \"runs/*/native.h5\" with oracle = \"runs/*/oracle.h5\"")
        assert isinstance(native_pattern, str) and isinstance(oracle_pattern, str)
        # Matched against what glob finds, which drops a leading "./" and doubled slashes: written
        # so, a pattern matched nothing and the manifest was refused. A ".." stays: collapsed, it
        # named another file than the OS opens when the folder before it is a link, and it took
        # `runs/*/../x` its wildcard.
        native_pattern, oracle_pattern = PurePosixPath(native_pattern).as_posix(), PurePosixPath(oracle_pattern).as_posix()
        wildcards = _WILDCARD.findall(native_pattern)
        if not wildcards or "**" in native_pattern or "[" in native_pattern:
            raise self.fail(None, "cases", where, f"{native_pattern!r} must use * or ? wildcards (not ** or [...]) so each match names its case")
        if _WILDCARD.findall(oracle_pattern) != wildcards:
            raise self.fail(None, "oracle", where, f"{oracle_pattern!r} must have the same wildcards in the same order as {native_pattern!r} ({''.join(wildcards)})")
        matcher = re.compile("".join("([^/]*)" if part == "*" else "([^/])" if part == "?" else re.escape(part) for part in re.split(r"([*?])", native_pattern)) + r"\Z")
        options, eos = self.options(defaults, (), None, where)
        cases = []
        for found in sorted(glob.glob(native_pattern, root_dir=self.folder)):
            match = matcher.match(Path(found).as_posix())
            if match is None:
                continue
            parts = iter(match.groups())
            oracle = _WILDCARD.sub(lambda _: next(parts), oracle_pattern)
            cases.append(GateCase("/".join(match.groups()), str(self.folder / found), str(self.folder / oracle), options, eos))
        if not cases:
            raise self.fail(None, "cases", where, f"{native_pattern!r} matches no file under {self.folder}")
        return cases
