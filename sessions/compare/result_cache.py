"""Sidecar cache of comparison results, so a second open of the same pair is instant.

Results live in the user cache directory (platformdirs), never beside or inside the
captures, which may sit on a read-only share or belong to someone else. The key covers
both files' content identity (size, mtime_ns, SHA-256 of root attributes + index -- see
sessions.capture.identity), the comparison options (manual alignment overrides included), the content of the profiles the options
resolve to (an edited TOML profile keeps its path and name), the report document's version
and a digest of the comparison code, so a rewritten capture, an edited profile, different
options or a changed diff engine can never return a stale result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import platformdirs

from sessions.capture.identity import CaptureIdentity, identity_of_capture
from sessions.capture.reader import Capture
from sessions.compare.comparison import (
    CompareOptions,
    Comparison,
    iter_compare,
    resolve_profiles,
)
from sessions.compare.document import DOCUMENT_VERSION, ReportFormatError, dumps, loads
from sessions.compare.profile_identity import identify
from sessions.compare.profiles import Profile
from sessions.progress import Progress, ProgressGenerator

CACHE_FORMAT = 2
SESSIONS_DIR = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("parity-xray")) / "comparisons"


def _identity_fields(identity: CaptureIdentity) -> list[object]:
    return [identity.size, identity.mtime_ns, identity.sha256]


@functools.cache
def code_digest() -> str:
    """SHA-256 over the source of the Qt-free domain layer (every sessions/**/*.py), where every number
    of a comparison is computed: a fixed diff engine must not serve results of the old one,
    and a development checkout changes without a version bump. Read once per process
    (about 50 files, a few milliseconds)."""
    digest = hashlib.sha256()
    for source in sorted(SESSIONS_DIR.rglob("*.py")):
        digest.update(str(source.relative_to(SESSIONS_DIR)).encode("utf-8") + b"\0")
        try:
            digest.update(source.read_bytes())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def cache_key(native: Capture, oracle: Capture, options: CompareOptions, profiles: tuple[Profile, Profile]) -> str:
    """`profiles` are the (native, oracle) profiles `options` resolve to (compare.resolve_profiles)."""
    material = {
        "cache": CACHE_FORMAT,
        "document": DOCUMENT_VERSION,
        "code": code_digest(),
        "native": _identity_fields(identity_of_capture(native)),
        "oracle": _identity_fields(identity_of_capture(oracle)),
        "paths": [str(native.path.resolve()), str(oracle.path.resolve())],
        "options": dataclasses.asdict(options),
        "profiles": [dataclasses.asdict(identify(p)) for p in profiles],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def load(cache_dir: Path, key: str) -> Comparison | None:
    """The cached result, or None when absent or unreadable (a damaged entry is recomputed)."""
    path = cache_dir / f"{key}.json"
    try:
        return loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ReportFormatError):
        return None


def store(cache_dir: Path, key: str, comparison: Comparison) -> None:
    """Write atomically (temp file + fsync + replace); a cache that cannot be written is skipped."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(dumps(comparison))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, cache_dir / f"{key}.json")
    except OSError:
        return


def iter_compare_cached(
    native: Capture, oracle: Capture, options: CompareOptions = CompareOptions(), cache_dir: Path | None = None
) -> ProgressGenerator[Comparison]:
    """`iter_compare` behind the sidecar cache; a hit yields one Progress and returns at once.

    Raises ProfileError (before any cache lookup) when a profile cannot be found or read."""
    directory = default_cache_dir() if cache_dir is None else cache_dir
    profiles = resolve_profiles(native, oracle, options)
    key = cache_key(native, oracle, options, profiles)
    cached = load(directory, key)
    if cached is not None:
        yield Progress(1, 1, "cached result")
        return cached
    result = yield from iter_compare(native, oracle, options, profiles)
    store(directory, key, result)
    return result
