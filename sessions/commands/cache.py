"""`parity-xray cache [--clear]`: what Parity X-ray keeps in its cache directory, and emptying it.

The cache holds comparison results (`comparisons/`, capped and evicted least recently used
first), the files that passed their structural check (`checked/`), the weights hashes of
recorded models (`hashes/`, `sessions.artifact_hash`) and the judged cases of gates (`gates/`,
with the HTML reports asked for). It lives in the user cache directory or in
`$PARITY_XRAY_CACHE_DIR`, which may be a folder the user also keeps other things in, so
`--clear` removes only the entries Parity X-ray wrote there (its `.json` entries and a gate
case's `.html`), never the folders or anything else. The demo captures (`demo/`) are not results
and are kept.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sessions.artifact_hash import hashes_dir
from sessions.capture.check_cache import CACHE_DIR_ENV, cache_root, checked_dir
from sessions.compare.result_cache import MAX_CACHE_BYTES, default_cache_dir
from sessions.gate.cache import gate_cache_dir

EXIT_OK, EXIT_NOT_CLEARED, EXIT_NOT_A_FOLDER = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clear", action="store_true", help="delete every cached result and remembered check")


def _own_entries(folder: Path, suffixes: tuple[str, ...]) -> list[tuple[Path, int]]:
    """(path, bytes) of the files Parity X-ray wrote in one of its cache folders: those ending in `suffixes`."""
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return []
    found = []
    for entry in listing:
        if entry.name.endswith(suffixes) and entry.is_file(follow_symlinks=False):
            try:
                found.append((Path(entry.path), entry.stat(follow_symlinks=False).st_size))
            except OSError:
                continue
    return found


def _not_a_folder(root: Path) -> Path | None:
    """The first of `root` and the folders above it that exists and is not a folder (a file where
    the cache should be, or where one of the folders holding it should be), or None."""
    for place in (root, *root.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    folders = (
        ("comparison results", default_cache_dir(), f", limit {_mib(MAX_CACHE_BYTES)}", (".json",)),
        ("passed structure checks", checked_dir(), "", (".json",)),
        ("weights hashes of recorded models", hashes_dir(), "", (".json",)),
        ("judged gate cases", gate_cache_dir(), "", (".json", ".html")),
    )
    where = f"${CACHE_DIR_ENV}" if os.environ.get(CACHE_DIR_ENV) else "user cache directory"
    blocking = _not_a_folder(cache_root())
    if blocking is not None:
        why = "is not a folder" if blocking == cache_root() else f"cannot be made: {blocking} is not a folder"
        print(f"cache: {cache_root()} ({where}) {why}, so nothing is cached; point {CACHE_DIR_ENV} at a folder, or unset it", file=sys.stderr)
        return EXIT_NOT_A_FOLDER
    print(f"cache: {cache_root()} ({where})")
    status = EXIT_OK
    for label, folder, limit, suffixes in folders:
        found = _own_entries(folder, suffixes)
        size = sum(bytes_ for _, bytes_ in found)
        if args.clear:
            kept = []
            for path, _ in found:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    kept.append(f"{path.name} ({exc.strerror})")
            print(f"  {label}: removed {len(found) - len(kept)} entries ({_mib(size)})")
            if kept:
                status = EXIT_NOT_CLEARED
                print(f"cache: could not remove {label}: {', '.join(kept)}", file=sys.stderr)
        else:
            print(f"  {label}: {len(found)} entries, {_mib(size)}{limit}")
    return status
