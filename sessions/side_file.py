"""Reading a side file (a policy, a profile, a manifest, a session) that someone else handed over.

Such a path is untrusted: it may name a FIFO (an open for reading waits for a writer that never
comes), a device such as /dev/zero (endless bytes), a directory, or a regular file far larger
than any real one. Reading it whole as text hangs or exhausts memory before any parser can say
what is wrong. `read_side_file` opens without blocking, looks at what the descriptor really is
(after symlinks, and immune to the path being swapped after the check), and reads at most the
caller's limit. Each caller chooses the limit that fits its kind of file and says it where it
defines it:

- tolerance policy (`sessions.compare.tolerance_policy.MAX_POLICY_BYTES`): 4 MiB
- profile (`sessions.compare.profiles.MAX_PROFILE_BYTES`): 4 MiB
- gate manifest (`sessions.gate.manifest.MAX_MANIFEST_BYTES`): 16 MiB
- import manifest (`sessions.importers.manifest.MAX_MANIFEST_BYTES`): 64 MiB
- session file (`sessions.investigation.store.MAX_SESSION_BYTES`): 64 MiB
- config.json beside a rerun's safetensors weights (`backends.recorders.model_config.MAX_CONFIG_BYTES`): 4 MiB
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class SideFileError(OSError):
    """A side file refused before it is read: not a regular file, or over its limit.

    An OSError, because to every caller it is a file that cannot be read: each one already turns
    OSError into its own located message ("cannot be read (...)"), and this one's text is the reason.
    """


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is ("a FIFO", "a directory"), from its stat mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def regular_file_problem(path: str | Path) -> str | None:
    """Why `path` is no file to read ("does not exist", ...), or None when it is a regular file."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist"
    except OSError as exc:  # a name too long, a loop of links
        return f"cannot be read ({exc.strerror or exc})"
    return None if stat.S_ISREG(mode) else "is not a regular file"


def open_regular_file(path: str | Path) -> BinaryIO:
    """`path` opened for binary reading, refused with SideFileError unless it is a regular file
    (decided on the open descriptor, so a path swapped after a check cannot slip through)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise SideFileError(f"not a regular file: {file_kind(mode)}")
        return open(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_side_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.

    Raises SideFileError for anything that is not a regular file, or that holds more than
    `limit` bytes (checked before reading, and again while reading in case it grows);
    other OSErrors (missing, no permission) pass through unchanged for the caller to word.
    """
    with open_regular_file(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise SideFileError(f"{size} bytes, over the {limit}-byte limit for this kind of file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise SideFileError(f"over the {limit}-byte limit for this kind of file (it grew while being read)")
    return data


def parse_problem(exc: ValueError | RecursionError) -> str:
    """Why json or tomllib gave up on a side file's text, for the caller's "not JSON/TOML (...)".

    Besides their decode errors (ValueErrors that say where), both raise RecursionError on
    nesting deeper than the interpreter's stack and a plain ValueError on an integer longer than
    `int()` converts (4300 digits); a hostile file holds either, and neither may escape as a traceback.
    """
    if isinstance(exc, RecursionError):
        return "it nests deeper than a reader follows"
    return str(exc)


MAX_JSON_DEPTH = 64
"""JSON from another engine nested deeper is refused: Python's parser reads about 990 levels,
but what later walks the value recursively (copying a capture's metadata, writing it out again)
failed from 500 on, so a provenance 900 levels deep passed `validate` and broke `report`."""


class JsonTooDeep(ValueError):
    """JSON that parses but nests past MAX_JSON_DEPTH."""


def load_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON whose every object gives each key once, nested at most `max_depth` levels. Python's
    parser keeps the last of a key given twice and says nothing: an engine's manifest entry with
    two `step`s, or a provenance with two `contracts`, read as whichever came last, where the
    writer may have meant the first."""
    value = json.loads(text, object_pairs_hook=_unique_keys)
    depth = _nesting(value)
    if depth > max_depth:
        raise JsonTooDeep(f"its values nest {depth} levels deep, past the {max_depth} a reader follows")
    return value


def _nesting(value: Any) -> int:
    """How many objects and arrays deep `value` nests, found without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key!r} is given twice in one object")
        found[key] = value
    return found


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (a link, another spelling); False when either is not there."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


DiskStamp = tuple[int, int, int]
"""(inode, modification time in ns, size) of a file: a write or an atomic replace changes one."""


def disk_stamp(path: str | Path) -> DiskStamp | None:
    """The file at `path` as it is now, to tell later whether anyone wrote there; None when absent."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size

