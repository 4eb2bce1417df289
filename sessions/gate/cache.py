"""The gate's cache of judged cases, so a rerun judges only what changed.

It lives under Parity X-ray's user cache directory (`$PARITY_XRAY_CACHE_DIR` when set),
in `gates/`, never beside the captures or the gate's outputs: captures may sit on a
read-only share, and two manifests naming the same pair with the same options share its
result. One entry per case key: `<key>.json` (the result and its fingerprint,
sessions.gate.judge) and, when the case's report was asked for, `<key>.html`. The key covers
both capture paths, the comparison options (tolerance, profiles, token budget), the EOS rule
and a digest of the domain code, so an edited diff engine or other options never reuse a
result; whether the captures and profiles are unchanged is the fingerprint's business,
checked where the captures are. Trouble with the cache (read-only home, a damaged entry)
only means judging again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from sessions.atomic_write import atomic_write_bytes
from sessions.capture.check_cache import cache_root
from sessions.compare.document import from_plain
from sessions.compare.json_plain import plain
from sessions.compare.result_cache import code_digest
from sessions.gate.judge import CachedCase, CaseOutcome
from sessions.gate.manifest import GateCase

GATE_CACHE_FORMAT = 2


def gate_cache_dir() -> Path:
    return cache_root() / "gates"


def _real(path: str) -> str:
    """One pair however manifests spell it (`..`, `./`, a link): "the same pair shares the result"
    was false of `../a/n.h5` beside `n.h5`."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):  # a NUL: the case is unusable, and keyed as written
        return path


def case_key(case: GateCase) -> str:
    material = {
        "format": GATE_CACHE_FORMAT,
        "code": code_digest(),
        "paths": [_real(case.native), _real(case.oracle)],
        "options": dataclasses.asdict(case.options),
        "eos": case.eos,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def load_entry(directory: Path, key: str) -> CachedCase | None:
    try:
        return from_plain(CachedCase, json.loads((directory / f"{key}.json").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def load_html(directory: Path, key: str) -> str | None:
    try:
        return (directory / f"{key}.html").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def store_entry(directory: Path, key: str, outcome: CaseOutcome) -> None:
    """Keep a judged case. A fresh judgment replaces the report too (removing an older one it
    did not write: that one describes other captures); a reused one keeps the report it had."""
    if outcome.fingerprint is None:
        return
    entry = CachedCase(dataclasses.replace(outcome.result, report=None, worker=None, reused=False), outcome.fingerprint)
    html = directory / f"{key}.html"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not outcome.result.reused:
            if outcome.html is None:
                html.unlink(missing_ok=True)
            else:
                atomic_write_bytes(html, outcome.html.encode("utf-8"))
        atomic_write_bytes(directory / f"{key}.json", json.dumps(plain(entry), allow_nan=False).encode("utf-8"))
    except OSError:
        return
