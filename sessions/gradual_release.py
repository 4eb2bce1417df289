"""A large structure freed a batch of objects at a time, so that freeing it never holds the interpreter for long.

A real model's comparison is millions of small objects. Dropping the last reference to it frees
them all in one cascade inside CPython, during which no Python code runs on any thread: 113 ms
for a comparison of 220,000 pairs, and a window re-opening a pair froze that long. Here the
structure is taken apart from the top: each large list or dict it holds is detached and emptied
a batch of items per step, and the caller decides when the next step runs (a window: when its
event loop is idle).

Only what the structure alone holds is taken apart. A part that anything else references (a
panel's list, a worker still reading) is left whole and is freed by reference counting when its
last holder lets go, so nothing another holder can see ever changes. Whether a part is held
only here is read from CPython's reference counts, whose meaning is checked for the running
interpreter before anything is taken apart (`_counts_are_exact`); where they differ, the
structure is simply dropped at once, as before.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Iterator
from functools import cache
from typing import Any

BATCH = 10_000
"""Items freed per step: 10,000 pairs of a comparison take about 2 ms."""
LARGE = 1_000
"""A list or dict this long is emptied in steps; a shorter one is freed with its holder."""
DEPTH = 4
"""Levels of objects descended into (the window's comparison, its engine comparison, the tree,
the tree's root): the large containers sit at these levels."""


def iter_release(holder: list[Any]) -> Iterator[None]:
    """Take the only object out of `holder` and free it in steps, yielding between them.

    The caller passes the object in a list it keeps no other reference to, so that once taken
    out here this generator holds it alone; if anything else still holds it, it is left to
    them whole. Closing the generator early frees what is left at once."""
    owner = holder.pop()
    if not _counts_are_exact() or sys.getrefcount(owner) != 2 or weakref.getweakrefcount(owner):  # this frame and the call's argument
        return
    level = [owner]
    del owner
    containers: list[list[Any] | dict[Any, Any]] = []
    for _ in range(DEPTH):
        below: list[Any] = []
        for held in level:
            _detach_parts(held, below, containers)
        level = below
        yield
    del level, below
    while containers:
        container = containers.pop()
        while container:
            if isinstance(container, list):
                del container[-BATCH:]
            else:
                for _ in range(min(BATCH, len(container))):
                    container.popitem()
            yield
        del container


def _detach_parts(owner: Any, below: list[Any], containers: list[list[Any] | dict[Any, Any]]) -> None:
    """Take out of `owner` the parts it alone holds: a large list or dict into `containers`, an
    object with fields into `below` (its parts are the next level's); the rest go with `owner`."""
    for name in _field_names(owner):
        part = getattr(owner, name, None)
        # Held by the field, this frame and the call's argument only, and by no weak reference
        # (which counts for nothing here): nothing else can see it.
        if part is None or sys.getrefcount(part) != 3 or weakref.getweakrefcount(part):
            continue
        if isinstance(part, (list, dict)) and len(part) >= LARGE:
            containers.append(part)
        elif _field_names(part):
            below.append(part)
        else:
            continue
        object.__setattr__(owner, name, None)


def _field_names(value: Any) -> tuple[str, ...]:
    """The attributes of a dataclass instance, or of any object with its own attribute dict;
    () for other values (containers, tuples, numbers, arrays: freed with their holder)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple(f.name for f in dataclasses.fields(value))
    if isinstance(value, (list, dict, tuple, str, bytes, int, float, type)):
        return ()
    return tuple(getattr(value, "__dict__", {}))


@cache
def _counts_are_exact() -> bool:
    """Whether a reference count says exactly who holds an object, as the ownership checks above
    read it: a list held by one object's field and one local name counts 3 in the call. Newer
    interpreters may borrow references and count fewer, which would read a shared part as
    held here alone; there nothing is taken apart."""

    class _Holder:
        part: list[int]

    probe = _Holder()
    probe.part = []
    part = probe.part
    return sys.getrefcount(part) == 3
