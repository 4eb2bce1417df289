"""Sidecar cache of comparison results, so a second open of the same pair is instant.

Results live in `comparisons/` of Parity X-ray's cache directory (the user cache directory, or
`$PARITY_XRAY_CACHE_DIR`), never beside or inside the captures, which may sit on a read-only
share or belong to someone else. The key covers both files' content identity (SHA-256 of root
attributes + index -- see sessions.capture.identity) and their identity on disk (resolved
path, device, inode, size, modification and change time), the comparison options (manual
alignment overrides included), the content of the profiles the options resolve to (an edited
TOML profile keeps its path and name), the report document's version and a digest of the
comparison code, so a rewritten capture, an edited profile, different options or a changed
diff engine can never return a stale result. Tensor bytes are not hashed (captures run to
gigabytes): a tensor edited in place keeps the size and can be given its old mtime back, but
not its old change time, which only the kernel sets. The folder is capped at MAX_CACHE_BYTES;
the least recently used results go first.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

from sessions.atomic_write import atomic_write_bytes
from sessions.capture.check_cache import cache_root, identity_of
from sessions.capture.identity import identity_of_capture
from sessions.capture.reader import Capture
from sessions.compare.comparison import Comparison, iter_compare, resolve_profiles
from sessions.compare.document import (
    DOCUMENT_VERSION,
    ReportFormatError,
    document_bytes,
    loads_lines,
    with_paths,
)
from sessions.compare.options import CompareOptions
from sessions.compare.profile_identity import identify
from sessions.compare.profiles import Profile
from sessions.progress import Progress, ProgressGenerator
from sessions.side_file import same_file

CACHE_FORMAT = 6
"""4: an entry is the report document in lines (`document_lines`), metrics shared by identical
pairs written once: a 240,000-record pair's entry in one JSON document was 236 MB and its cache
hit (10.2 s) slower than comparing again (7.8 s). 5: without the error growth, which the
comparison derives from its pairs. 6: a pair is a row of its fields' values (`PAIR_FIELDS`)."""
SESSIONS_DIR = Path(__file__).resolve().parent.parent
MAX_CACHE_BYTES = 256 * 1024**2
"""Largest total size of cached results; a report of a large pair with few records is a few
hundred KiB, of a real model's 240,000 records about 100 MB."""
ENTRY_SUFFIX = ".json"


def default_cache_dir() -> Path:
    return cache_root() / "comparisons"


def _identity_fields(capture: Capture) -> dict[str, object]:
    on_disk = dataclasses.asdict(identity_of(capture.path, capture.memory_budget))
    return {**on_disk, "content": identity_of_capture(capture).sha256}


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
        "native": _identity_fields(native),
        "oracle": _identity_fields(oracle),
        "options": {**dataclasses.asdict(options), "workers": None},  # how many processes compare does not change the result
        "profiles": [dataclasses.asdict(identify(p)) for p in profiles],
        "same_file": same_file(native.path, oracle.path),  # one file twice is warned about; two equal copies are not
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _read(cache_dir: Path, key: str) -> tuple[bytes, Comparison] | None:
    """The entry's bytes and the comparison they read back as, or None when absent or unreadable
    (a damaged entry is recomputed). A hit is marked as used now (its mtime), which is what
    eviction orders by."""
    path = cache_dir / f"{key}{ENTRY_SUFFIX}"
    try:
        data = path.read_bytes()
        result = loads_lines(data)
    except (OSError, ReportFormatError):
        return None
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still serves its results; they just age
    return data, result


def load(cache_dir: Path, key: str) -> Comparison | None:
    """The cached result, or None when absent or unreadable (a damaged entry is recomputed)."""
    hit = _read(cache_dir, key)
    return None if hit is None else hit[1]


def entries(cache_dir: Path) -> list[tuple[int, int, Path]]:
    """(last use in ns, bytes, path) of every cached result, least recently used first."""
    found = []
    try:
        listing = list(os.scandir(cache_dir))
    except OSError:
        return []
    for entry in listing:
        if entry.name.endswith(ENTRY_SUFFIX) and not entry.name.startswith("."):
            try:
                stat = entry.stat()
            except OSError:
                continue
            found.append((stat.st_mtime_ns, stat.st_size, Path(entry.path)))
    return sorted(found)


def evict(cache_dir: Path, max_bytes: int = MAX_CACHE_BYTES) -> None:
    """Remove the least recently used results until the folder holds at most `max_bytes`."""
    cached = entries(cache_dir)
    total = sum(size for _, size, _ in cached)
    for _, size, path in cached:
        if total <= max_bytes:
            return
        path.unlink(missing_ok=True)
        total -= size


def store(cache_dir: Path, key: str, comparison: Comparison, max_bytes: int = MAX_CACHE_BYTES) -> bytes:
    """Write atomically (`atomic_write_bytes`), then evict down to `max_bytes`; a cache that
    cannot be written is skipped. Returns the entry's bytes (`document_bytes`), written or not."""
    data = document_bytes(comparison)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache_dir / f"{key}{ENTRY_SUFFIX}", data)
        evict(cache_dir, max_bytes)
    except OSError:
        pass
    return data


def iter_compare_cached(
    native: Capture, oracle: Capture, options: CompareOptions = CompareOptions(), cache_dir: Path | None = None
) -> ProgressGenerator[Comparison]:
    """`iter_compare` behind the sidecar cache; a hit yields one Progress and returns at once.

    Raises ProfileError (before any cache lookup) when a profile cannot be found or read."""
    return (yield from _iter_cached(native, oracle, options, cache_dir))[1]


def iter_document_cached(
    native: Capture, oracle: Capture, options: CompareOptions = CompareOptions(), cache_dir: Path | None = None
) -> ProgressGenerator[bytes]:
    """`iter_compare_cached`'s comparison as its document's bytes (`document_bytes`): for a process
    that passes the document on (a window's comparing child), the entry's own bytes, not the
    comparison written again (a real model's 220,000 pairs take a second to write)."""
    return (yield from _iter_cached(native, oracle, options, cache_dir))[0]


def _iter_cached(native: Capture, oracle: Capture, options: CompareOptions, cache_dir: Path | None) -> ProgressGenerator[tuple[bytes, Comparison]]:
    """The comparison and its entry's bytes: read back on a hit, compared and stored on a miss."""
    profiles = resolve_profiles(native, oracle, options)
    directory, key = default_cache_dir() if cache_dir is None else cache_dir, cache_key(native, oracle, options, profiles)
    hit = _read(directory, key)
    if hit is not None:
        yield Progress(1, 1, "cached result")
        # The key is the files' identity, not their paths: the run that filled the entry may have
        # named them through another folder or a link, and a report names them as given now.
        data, cached = hit
        paths = str(native.path), str(oracle.path)
        if (cached.native_path, cached.oracle_path) == paths:
            return hit
        return with_paths(data, *paths), dataclasses.replace(cached, native_path=paths[0], oracle_path=paths[1])
    result = yield from iter_compare(native, oracle, options, profiles)
    return store(directory, key, result), result
