"""A large structure is freed a batch at a time, and only what it alone holds is taken apart."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import pytest

from sessions import gradual_release
from sessions.gradual_release import BATCH, iter_release

exact_counts = pytest.mark.skipif(
    not gradual_release._counts_are_exact(), reason="this interpreter's reference counts do not say who holds an object: nothing is taken apart"
)


class Item:
    """Something freed by reference counting that a test can watch die (a weak reference)."""


@dataclass
class Tree:
    items: list[Item] = field(default_factory=list)
    by_id: dict[int, Item] = field(default_factory=dict)
    small: list[Item] = field(default_factory=list)


@dataclass
class Viewed:
    tree: Tree
    label: str = "a comparison"


def _viewed(items: int) -> tuple[Viewed, list[weakref.ref[Item]]]:
    tree = Tree([Item() for _ in range(items)], small=[Item()])
    tree.by_id = {id(item): item for item in tree.items[: items // 2]}
    return Viewed(tree), [weakref.ref(item) for item in tree.items]


def _alive(watched: list[weakref.ref[Item]]) -> int:
    return sum(ref() is not None for ref in watched)


@exact_counts
def test_a_structure_held_only_by_the_releaser_is_freed_a_batch_per_step() -> None:
    viewed, watched = _viewed(5 * BATCH)
    holder = [viewed]
    del viewed
    alive = []
    for _ in iter_release(holder):
        alive.append(_alive(watched))
    assert holder == []
    assert _alive(watched) == 0
    freed_per_step = [before - after for before, after in zip([5 * BATCH, *alive], alive)]
    assert max(freed_per_step) <= BATCH, "no step frees more than one batch of the list"
    assert alive.count(5 * BATCH) >= gradual_release.DEPTH, "nothing is freed while the levels above are taken apart"


@exact_counts
def test_a_part_something_else_holds_is_left_whole() -> None:
    """A panel still showing the tree's list: the list keeps every item, the rest is freed."""
    viewed, watched = _viewed(2 * BATCH)
    kept_items = viewed.tree.items
    by_id = weakref.ref(viewed.tree)
    holder = [viewed]
    del viewed
    for _ in iter_release(holder):
        pass
    assert len(kept_items) == 2 * BATCH and _alive(watched) == 2 * BATCH
    assert by_id() is None


def test_a_structure_still_held_elsewhere_is_not_touched() -> None:
    """A worker still reading the comparison: not one of its fields changes."""
    viewed, watched = _viewed(2 * BATCH)
    tree = viewed.tree
    holder = [viewed]
    assert list(iter_release(holder)) == []
    assert viewed.tree is tree and len(tree.items) == 2 * BATCH and len(tree.by_id) == BATCH
    assert _alive(watched) == 2 * BATCH


def test_a_part_a_weak_reference_still_sees_is_left_whole() -> None:
    """A weak reference adds nothing to the count: the tree it reaches looked held by the
    comparison alone, and would have been emptied under it."""
    viewed, watched = _viewed(2 * BATCH)
    tree = weakref.ref(viewed.tree)
    holder = [viewed]
    del viewed
    seen = [len(tree().items) for _ in iter_release(holder)]  # type: ignore[union-attr]
    assert seen and set(seen) == {2 * BATCH}
    assert tree() is None and _alive(watched) == 0


def test_where_counts_do_not_say_who_holds_an_object_the_structure_is_dropped_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that borrows references counts fewer, and a shared part would read as held
    here alone: there nothing is taken apart, and the structure goes when its holder lets go."""
    monkeypatch.setattr(gradual_release, "_counts_are_exact", lambda: False)
    viewed, watched = _viewed(2 * BATCH)
    holder = [viewed]
    del viewed
    assert list(iter_release(holder)) == []
    assert _alive(watched) == 0
