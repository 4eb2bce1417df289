"""Every link and object of a capture, checked even where no index row leads.

The reader only follows the paths index rows name, but the file is also opened by other tools:
h5dump and HDFView list every link, open every object and show every attribute, so an external
link nobody uses still opens another file there, and an object-reference dataset or an opaque
attribute still reaches a decoder. `validate` promises that a file it accepts holds nothing the
format refuses, so the structural check walks the whole tree once: links of every group
reached by hard links, the attributes of every object, and every dataset and named type that
no index row names (the record scan checks the datasets and packs that rows name). Groups are
walked with an explicit stack and each object is visited once by address, so hard-link cycles
and deep nesting neither loop nor exhaust the interpreter's stack.

Only finished files are walked. In a file whose writer did not finish, the groups and tensors
of the step being written may point past the end of what was flushed; readers never go there
(they read committed rows only), `validate` refuses the file as unfinished anyway, and the
viewer must still open it.
"""

from __future__ import annotations

import h5py

from sessions.capture import format as cf
from sessions.capture.hdf5_safety import (
    HDF5_ERRORS,
    Problem,
    UnsafeObject,
    attribute_problems,
    dataset_problems,
    describe_error,
    foreign_link,
    normalised_path,
    type_problem,
)
from sessions.capture.reader import Capture


def _links(group: h5py.h5g.GroupID) -> list[tuple[bytes, int, int]]:
    """(name, link type, address for a hard link) of every link in a group, in one iteration."""
    found: list[tuple[bytes, int, int]] = []

    def note(name: bytes, info: h5py.h5l.LinkInfo) -> None:
        found.append((name, info.type, info.u))  # h5py hands every call the same LinkInfo object

    group.links.iterate(note, info=True)
    return found


def _object_problems(obj: h5py.h5o.ObjectID, location: str, capture: Capture) -> list[Problem]:
    """A dataset's or named type's own problems (attributes are checked for every kind by the caller)."""
    if isinstance(obj, h5py.h5d.DatasetID):
        return dataset_problems(obj, location, capture.memory_budget, capture.file_size)
    if isinstance(obj, h5py.h5t.TypeID):
        why = type_problem(obj)
        return [] if why is None else [Problem(location, f"named type {why}")]
    return []


def walk_problems(capture: Capture) -> list[Problem]:
    """Problems of every link, attribute and unnamed object of a finished file, in the order they are reached."""
    if not capture.complete:
        return []
    rows = {normalised_path(cf.decode_field(raw)) for raw in capture.columns.codes("path")[0].tolist()}
    root = capture.walker.group_id("/")
    found = attribute_problems(root, "/", capture.memory_budget)
    seen: set[int] = set()
    stack: list[tuple[str, h5py.h5g.GroupID]] = [("/", root)]
    while stack:
        path, group = stack.pop()
        try:
            links = _links(group)
        except HDF5_ERRORS as exc:
            found.append(Problem(path, f"its links cannot be listed ({describe_error(exc)})"))
            continue
        for name, link_type, address in links:
            location = f"{path.rstrip('/')}/{name.decode('utf-8', errors='replace')}"
            foreign = foreign_link(group, name, link_type, location)
            if foreign is not None:
                found.append(foreign)
            elif link_type == h5py.h5l.TYPE_SOFT:
                try:
                    capture.walker.resolve(location)
                except UnsafeObject as exc:
                    found.append(Problem(f"{location} -> {exc.problem.location}", exc.problem.problem))
            elif location not in rows and address not in seen:
                seen.add(address)
                try:
                    obj = h5py.h5o.open(group, name)
                except HDF5_ERRORS as exc:
                    found.append(Problem(location, f"cannot be opened ({describe_error(exc)})"))
                    continue
                found += attribute_problems(obj, location, capture.memory_budget)
                found += _object_problems(obj, location, capture)
                if isinstance(obj, h5py.h5g.GroupID):
                    stack.append((location, obj))
    return found
