"""A dispatch difference's two summary lines: a person reads the difference off them."""

from __future__ import annotations

from sessions.compare.dispatch_diff import COMPARED_FIELDS, summarize


def _calls(q_rows: list[int]) -> list[dict[str, object]]:
    base: dict[str, object] = dict.fromkeys(COMPARED_FIELDS, 0)
    base.update(kv_group=0, head_count=6, kv_len=100, mask_kind="causal", primitive="fallback", metal_primitive="")
    return [{**base, "call": number, "q_rows": rows} for number, rows in enumerate(q_rows)]


def test_a_field_that_differs_in_a_later_call_shows_each_calls_value_on_both_lines() -> None:
    """The first call's rows alone: two runs whose second calls took 8 and 4 rows printed two identical lines."""
    native, oracle = summarize(_calls([4, 8]), ["q_rows"]), summarize(_calls([4, 4]), ["q_rows"])
    assert native == "2 call(s), heads per call 6+6 per KV group, 4+8 rows, kv 100, mask causal, primitive fallback"
    assert oracle == "2 call(s), heads per call 6+6 per KV group, 4+4 rows, kv 100, mask causal, primitive fallback"


def test_a_field_alike_on_both_sides_shows_its_values_once_each() -> None:
    assert summarize(_calls([4, 8]), ["head_count"]).startswith("2 call(s), heads per call 6+6 per KV group, 4/8 rows, kv 100,")
    assert summarize(_calls([4, 4])).startswith("2 call(s), heads per call 6+6 per KV group, 4 rows, kv 100,")
