"""A capture's weights hash: SHA-256 over the artifact files, remembered while the files stay the same.

Recording a model hashes its files every time, and that is seconds of every recording: a 677 MB
GGUF took 0.56 s on the development VM, longer than the 48-token run it was recorded with. The
digest is kept in the user cache directory (`hashes/`, beside `checked/`, or in
`$PARITY_XRAY_CACHE_DIR`), one small JSON entry per list of files (the most recent 4,096 kept),
and counts only while every file has the same resolved path, device, inode, size, modification
and change time as when it was hashed: the trust the structure-check cache gives a capture (`sessions.capture.check_cache`),
where ctime is what a writer cannot set back. Cache trouble only means hashing again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from sessions.atomic_write import atomic_write_bytes
from sessions.capture.check_cache import cache_root, identity_of, prune

HASH_VERSION = 2
"""What the digest covers (`_digest`); bumped when that changes. Version 1 mixed in each file's
name: a renamed copy of the same GGUF read as DIFFERENT WEIGHTS, and a one-file hash was not
what `sha256sum` prints."""


def hashes_dir() -> Path:
    return cache_root() / "hashes"


def _identity(paths: list[Path]) -> list[dict[str, object]]:
    """Each file as the structure-check cache identifies it (no memory budget: hashing has none)."""
    return [asdict(identity_of(path, 0)) for path in paths]


def _entry(paths: list[Path]) -> Path:
    """One entry per list of files (each named as the structure-check cache names it: by path,
    device and inode), so a changed file replaces its own entry."""
    names = "".join(identity_of(path, 0).entry_name() for path in paths)
    return hashes_dir() / (hashlib.sha256(names.encode()).hexdigest() + ".json")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest(paths: list[Path]) -> str:
    """One file: its SHA-256, as `sha256sum` prints it. Several (a model's shards): the SHA-256
    of their own SHA-256s, sorted, one per line: the same bytes hash alike whatever the files
    are called or the order they are listed in."""
    each = [_file_sha256(path) for path in paths]
    if len(each) == 1:
        return each[0]
    return hashlib.sha256("".join(f"{digest}\n" for digest in sorted(each)).encode()).hexdigest()


WEIGHTS_ID_PREFIX = "sha256:"
"""How a recorder's weights hash begins (`weights_id`). Recorders before HASH_VERSION 2 wrote the
bare digest of names and bytes: told apart by this, a capture of that time and one of now are
"hashed differently", not "different weights" (`sessions.compare.provenance_diff`)."""


def weights_id(digest: str) -> str:
    """A capture's `weights_hash` from its files' digest (`artifact_sha256`)."""
    return WEIGHTS_ID_PREFIX + digest


def artifact_sha256(paths: list[Path]) -> str:
    """The weights hash of a capture: of the files' bytes alone (`_digest`)."""
    paths = [Path(p) for p in paths]
    identity = _identity(paths)
    entry = _entry(paths)
    try:
        stored = json.loads(entry.read_text("utf-8"))
        if stored["version"] == HASH_VERSION and stored["files"] == identity:
            return str(stored["sha256"])
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        pass
    digest = _digest(paths)
    if _identity(paths) == identity:  # a file that changed while it was read is hashed again next time
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(entry, json.dumps({"version": HASH_VERSION, "files": identity, "sha256": digest}).encode())
            prune(entry.parent)
        except OSError:
            pass
    return digest
