"""Structural checks that make an untrusted HDF5 file safe to read, each done before any data is read.

A capture comes from someone else's engine, so every object is inspected through metadata
alone (GUIDE section 7): links are walked one path part at a time so an external link is seen
before libhdf5 follows it, datasets are refused when they would read another file (virtual
layout, external raw storage), run a filter that is not built in and allow-listed, or declare
more bytes than the memory budget. Attribute types are checked before their values are read
because variable-length strings live in the global heap, whose reader hangs on crafted input.
None of these checks opens another file or reads raw data.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

ALLOWED_FILTERS: dict[int, str] = {1: "deflate (gzip)", 2: "shuffle", 32000: "lzf"}
"""Filter ids a capture may use. Fletcher32 (3) is refused: it is where byte-mutated files segfaulted."""

KNOWN_FILTER_NAMES: dict[int, str] = {3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset"}

DEFAULT_MEMORY_BUDGET = 2 * 1024**3
"""Largest number of bytes one read may produce (whole dataset, or one decompressed chunk)."""

CHECK_TIMEOUT_S = 60.0
"""Wall-clock limit of the child process that checks a file's structure before its first open."""

MAX_SOFT_LINK_HOPS = 8

_H5D_VIRTUAL = 3


@dataclass(frozen=True)
class Problem:
    """One structural problem: where it is (an HDF5 path, maybe with an attribute) and what is wrong."""

    location: str
    problem: str


class UnsafeObject(Exception):
    """Raised by the checks that must stop at the first problem (following a path)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(f"{problem.location}: {problem.problem}")


def _join(base: str, part: str) -> str:
    return f"{base.rstrip('/')}/{part}"


def _normalise(path: str) -> list[str]:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return parts


class LinkWalker:
    """Resolves in-file paths through hard links only, remembering groups already proven safe.

    `get(path, getlink=True)` inspects only the last part of a path: libhdf5 follows every
    intermediate part, including an external link that opens another file. So each part is
    looked up on its own, as one name inside a group already reached by hard links, with the
    low-level link API (which also keeps a 50,000-record check to a few seconds). Soft links
    stay inside the file by construction; they are followed to their target with a hop limit,
    so a loop or a dangling link is reported instead of followed forever.
    """

    def __init__(self, file: h5py.File) -> None:
        self._groups: dict[str, h5py.h5g.GroupID] = {"/": file.id}

    def group_id(self, path: str) -> h5py.h5g.GroupID:
        """The group at a hard-link path (as `resolve` returns), opened once and kept."""
        group = self._groups.get(path)
        if group is None:
            parent, _, name = path.rpartition("/")
            try:
                obj = h5py.h5o.open(self._groups[parent or "/"], name.encode())
            except (KeyError, ValueError, OSError, RuntimeError) as exc:
                raise UnsafeObject(Problem(path, f"cannot be opened ({exc})")) from None
            if not isinstance(obj, h5py.h5g.GroupID):
                raise UnsafeObject(Problem(path, "is not a group, yet a path continues below it"))
            group = self._groups[path] = obj
        return group

    def resolve(self, path: str, *, hops: int = 0) -> str:
        """The hard-link path an in-file path leads to; raises UnsafeObject when it leaves the file."""
        current = "/"
        parts = _normalise(path)
        for i, part in enumerate(parts):
            group = self.group_id(current)
            candidate = _join(current, part)
            try:
                info = group.links.get_info(part.encode())
            except (KeyError, RuntimeError):
                raise UnsafeObject(Problem(candidate, f"does not exist (needed for {path})")) from None
            except (ValueError, OSError) as exc:
                raise UnsafeObject(Problem(candidate, f"link cannot be inspected ({exc})")) from None
            if info.type == h5py.h5l.TYPE_EXTERNAL:
                filename, target = group.links.get_val(part.encode())
                raise UnsafeObject(
                    Problem(
                        candidate,
                        f"is an external link to {filename.decode(errors='replace')}:{target.decode(errors='replace')}; "
                        "captures may not point at other files",
                    )
                )
            if info.type == h5py.h5l.TYPE_SOFT:
                if hops >= MAX_SOFT_LINK_HOPS:
                    raise UnsafeObject(Problem(candidate, f"soft links nest deeper than {MAX_SOFT_LINK_HOPS} (a loop?)"))
                target = group.links.get_val(part.encode()).decode(errors="replace")
                candidate = self.resolve(target if target.startswith("/") else _join(current, target), hops=hops + 1)
            elif info.type != h5py.h5l.TYPE_HARD:
                raise UnsafeObject(Problem(candidate, f"is a user-defined link (type {info.type}); only hard and soft links are followed"))
            current = candidate
        return current

    def dataset(self, path: str) -> h5py.Dataset:
        """The dataset at `path`, reached through checked links; raises UnsafeObject otherwise."""
        return h5py.Dataset(self.dataset_id(path))

    def dataset_id(self, path: str) -> h5py.h5d.DatasetID:
        """Like `dataset`, as the low-level handle that checks of many datasets use."""
        resolved = self.resolve(path)
        parent, _, name = resolved.rpartition("/")
        if not name:
            raise UnsafeObject(Problem(path, "is the root group, not a dataset"))
        try:
            obj = h5py.h5o.open(self.group_id(parent or "/"), name.encode())
        except (KeyError, ValueError, OSError, RuntimeError) as exc:
            raise UnsafeObject(Problem(path, f"cannot be opened ({exc})")) from None
        if not isinstance(obj, h5py.h5d.DatasetID):
            raise UnsafeObject(Problem(path, "is a group or named type, not a dataset"))
        return obj


def type_problem(tid: h5py.h5t.TypeID) -> str | None:
    """Why an HDF5 datatype cannot appear in a capture, or None when it is a plain fixed-size type."""
    cls = tid.get_class()
    if cls == h5py.h5t.STRING:
        return "is a variable-length string; the format has fixed-length strings only" if tid.is_variable_str() else None
    if cls in (h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.ENUM):
        return None
    if cls == h5py.h5t.ARRAY:
        return type_problem(tid.get_super())
    if cls == h5py.h5t.COMPOUND:
        for i in range(tid.get_nmembers()):
            inner = type_problem(tid.get_member_type(i))
            if inner is not None:
                return f"field {tid.get_member_name(i).decode(errors='replace')!r} {inner}"
        return None
    names = {
        h5py.h5t.VLEN: "a variable-length sequence",
        h5py.h5t.REFERENCE: "an object reference",
        h5py.h5t.OPAQUE: "an opaque type",
        h5py.h5t.BITFIELD: "a bitfield",
        h5py.h5t.TIME: "a time type",
    }
    return f"is {names.get(cls, f'HDF5 type class {cls}')}, which the format does not use"


def _product(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def dataset_problems(dsid: h5py.h5d.DatasetID, location: str, budget: int, file_size: int) -> list[Problem]:
    """Everything that makes reading this dataset unsafe, found from its metadata alone."""
    problems: list[Problem] = []
    try:
        dcpl = dsid.get_create_plist()
        layout = dcpl.get_layout()
        external = dcpl.get_external_count()
        filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
        chunk = dcpl.get_chunk() if layout == h5py.h5d.CHUNKED else None
        shape = dsid.shape or ()
        tid = dsid.get_type()
        itemsize = tid.get_size()
        why_type = type_problem(tid)
    except (KeyError, ValueError, OSError, RuntimeError, TypeError) as exc:
        return [Problem(location, f"dataset metadata cannot be read ({exc})")]
    if layout == _H5D_VIRTUAL:
        problems.append(Problem(location, "is a virtual dataset, which reads other files; refused"))
    if external:
        problems.append(
            Problem(location, f"keeps its raw data in {external} external file(s) outside the capture; refused")
        )
    for code in filters:
        if code not in ALLOWED_FILTERS:
            name = KNOWN_FILTER_NAMES.get(code, "unknown")
            allowed = ", ".join(f"{n} ({c})" for c, n in ALLOWED_FILTERS.items())
            problems.append(Problem(location, f"uses filter id {code} ({name}); allowed filters: {allowed}"))
    if why_type is not None:
        problems.append(Problem(location, f"element type {why_type}"))
    declared = _product(shape) * itemsize
    if declared > budget:
        problems.append(
            Problem(location, f"declares shape {shape} = {declared} bytes, over the memory budget of {budget} bytes")
        )
    if chunk is not None:
        chunk_bytes = _product(chunk) * itemsize
        if chunk_bytes > budget:
            problems.append(
                Problem(location, f"declares chunks of {chunk} = {chunk_bytes} bytes, over the memory budget of {budget}")
            )
    if layout == h5py.h5d.CONTIGUOUS and declared > 0 and not problems:
        offset = dsid.get_offset()
        if offset is not None and offset + declared > file_size:
            problems.append(
                Problem(
                    location,
                    f"its data ends at byte {offset + declared}, past the end of the file ({file_size} bytes): truncated",
                )
            )
    return problems


def read_attribute(obj_id: h5py.h5o.ObjectID, location: str, name: str) -> np.ndarray | None:
    """One attribute's value, read only after its type and size were checked; None when absent.

    Raises UnsafeObject when the attribute cannot be read safely.
    """
    where = f"{location} attribute '{name}'"
    raw = name.encode()
    try:
        try:
            attr = h5py.h5a.open(obj_id, raw)
        except KeyError:
            return None
        why = type_problem(attr.get_type())
        if why is None and attr.get_storage_size() > DEFAULT_MEMORY_BUDGET:
            why = f"declares {attr.get_storage_size()} bytes"
        if why is None and attr.shape is None:
            why = "has no value (empty dataspace)"
        if why is not None:
            raise UnsafeObject(Problem(where, why))
        value = np.empty(attr.shape, dtype=attr.dtype)
        attr.read(value)
    except (KeyError, ValueError, OSError, RuntimeError, TypeError) as exc:
        raise UnsafeObject(Problem(where, f"cannot be read ({exc})")) from None
    return value
