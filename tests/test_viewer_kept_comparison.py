"""The comparison a window keeps is hidden from the cyclic collector (gc.freeze), so it must be
freed by reference counting alone: a reference cycle in it would leak every comparison a long
session drops."""

from __future__ import annotations

import weakref
from pathlib import Path

from sessions.capture.opening import open_capture
from sessions.progress import run_to_end
from viewer import comparison_view as cv


def test_a_dropped_window_comparison_is_freed_without_the_collector(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    native_path, oracle_path = demo_pairs["attention-contract"]
    with open_capture(native_path) as native, open_capture(oracle_path) as oracle:
        viewed = run_to_end(cv.iter_compare_pair(native, oracle))
        assert viewed.timeline is not None and viewed.comparison.pairs and viewed.tree.root.children
        pair = viewed.comparison.pairs[len(viewed.comparison.pairs) // 2]
        kept = {
            "viewed comparison": weakref.ref(viewed),
            "comparison": weakref.ref(viewed.comparison),
            "pair": weakref.ref(pair),
            "metrics": weakref.ref(pair.metrics),
            "tree group": weakref.ref(next(iter(viewed.tree.root.children.values()))),
            "timeline": weakref.ref(viewed.timeline),
            "growth series": weakref.ref(viewed.growth),
        }
        del viewed, pair
        alive = [name for name, ref in kept.items() if ref() is not None]
    assert alive == [], f"still alive without a collection: {alive}"
