"""Alignment groups a run's records with numpy over their columns: the groups are the records'
own, whatever the values' range, and a capture's records align the same as a list of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sessions.capture.columns import SORTED_RUNS, Coded, codes
from sessions.capture.opening import open_capture
from sessions.compare.align import align
from sessions.compare.comparison import resolve_profiles
from sessions.compare.options import CompareOptions
from sessions.compare.positions import record_spans
from sessions.compare.record_columns import groups

LOWEST, HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def test_groups_of_integers_spanning_all_of_int64_are_the_rows_equal_tuples() -> None:
    steps = np.array([0, HIGHEST, 0, LOWEST, HIGHEST, 0, 7], dtype=np.int64)
    layers = np.array([-1, 5, -1, 5, 5, 2, -1], dtype=np.int64)
    names = np.array([3, 0, 3, 0, 0, 3, 3], dtype=np.int64)
    found = groups(steps, layers, names)
    rows = list(zip(steps.tolist(), layers.tolist(), names.tolist()))
    for a in range(len(rows)):
        for b in range(len(rows)):
            assert (found.of_row[a] == found.of_row[b]) == (rows[a] == rows[b]), (a, b)
    assert sorted(found.first.tolist()) == [0, 1, 3, 5, 6]
    assert found.sizes[found.of_row].tolist() == [2, 2, 2, 1, 2, 1, 1]


def test_columns_whose_ranges_multiply_past_int64_are_still_told_apart() -> None:
    """Six columns of 4,096 values each span 2**72 combinations. Folded into one int64 without
    re-ranking, (0, 0, ...) and (16, 0, ...) would wrap onto the same value."""
    columns = [np.arange(4096, dtype=np.int64) for _ in range(6)]
    columns[0][1] = 16
    for column in columns[1:]:
        column[1] = 0
    found = groups(*columns)
    assert found.of_row[0] != found.of_row[1]
    assert len(found.first) == 4096


def test_columns_wider_than_there_are_rows_group_by_the_rank_of_their_values() -> None:
    """Random int64 columns span far more values than 60 rows: each is ranked before it is folded."""
    gen = np.random.default_rng(3)
    columns = [gen.integers(LOWEST, HIGHEST, size=50, dtype=np.int64) for _ in range(4)]
    columns = [np.concatenate((c, c[:10])) for c in columns]  # rows 50-59 repeat rows 0-9
    found = groups(*columns)
    assert len(found.first) == 50
    assert (found.of_row[50:] == found.of_row[:10]).all()
    assert found.sizes.sum() == 60


def test_values_that_are_equal_share_one_code() -> None:
    """Two different raw names can decode to the same text (invalid UTF-8 shows as U+FFFD)."""
    merged = Coded.merged(["\ufffd", "q_proj", "\ufffd"], np.array([0, 1, 2, 2, 0], dtype=np.int64))
    assert merged.values == ["\ufffd", "q_proj"]
    assert merged.codes.tolist() == [0, 1, 0, 0, 0]
    assert merged.taken(np.array([1, 2])) == ["q_proj", "\ufffd"]


def test_text_codes_are_numpy_s_unique_values_whether_the_runs_are_sorted_or_hashed() -> None:
    """A text column is coded on its 8-byte words, without the words no row sets, its runs'
    values sorted when they are few and hashed when the text changes row by row: values that
    differ only in their last byte, or only past the first words, still get codes of their own."""
    names = np.array([b"attn_norm", b"q_proj", b"q_proj_long_name_past_the_first_16_bytes_x", b"q_proj_long_name_past_the_first_16_bytes_y", b""], dtype="S64")
    pick = np.random.default_rng(5)
    for rows in (12, 4 * SORTED_RUNS):
        column = names[pick.integers(0, len(names), rows)]
        values, row_codes = codes(column)
        assert sorted(values.tolist()) == sorted(set(column.tolist())), rows
        assert (values[row_codes] == column).all(), rows
    empty = np.zeros(3 * SORTED_RUNS, dtype="S64")
    values, row_codes = codes(empty)
    assert values.tolist() == [b""] and not row_codes.any(), "a field no row sets is one value"


def test_recorded_positions_near_the_end_of_int64_give_exact_spans() -> None:
    last = HIGHEST - 3
    spans, calls = record_spans(
        np.array([0, 1], dtype=np.int64),
        np.array([0, 1], dtype=np.int64),
        Coded(["prefill", "decode"], np.array([0, 1], dtype=np.int64)),
        np.array([16, 1], dtype=np.int64),
        np.array([last, -1], dtype=np.int64),
    )
    assert spans.by_seq() == {0: (last, last + 16), 1: (last + 16, last + 17)}, "past int64, exactly: the decode step follows the prompt"
    assert [(c.step, c.segment, c.span) for c in calls] == [(0, "prefill", (last, last + 16)), (1, "decode", (last + 16, last + 17))]


def test_spans_derived_from_call_order_end_a_shorter_record_where_its_call_ends() -> None:
    spans, calls = record_spans(
        np.array([0, 2, 3, 4], dtype=np.int64),
        np.array([0, 0, 1, 1], dtype=np.int64),
        Coded(["prefill", "decode"], np.array([0, 0, 1, 1], dtype=np.int64)),
        np.array([5, 1, 1, 1], dtype=np.int64),
        np.full(4, -1, dtype=np.int64),
    )
    assert spans.by_seq() == {0: (0, 5), 2: (4, 5), 3: (5, 6), 4: (5, 6)}
    assert [c.text() for c in calls] == ["prefill 0-4", "decode 5"]


def test_a_negative_stored_row_count_still_spans_and_moves_the_calls_after_it() -> None:
    """A hostile index's negative dimension is a bad row, which is still aligned: its call is as
    long as its longest record, however negative, as record-by-record alignment had it."""
    spans, calls = record_spans(
        np.array([0, 1], dtype=np.int64),
        np.array([0, 1], dtype=np.int64),
        Coded(["prefill", "decode"], np.array([0, 1], dtype=np.int64)),
        np.array([-4, 1], dtype=np.int64),
        np.full(2, -1, dtype=np.int64),
    )
    assert spans.by_seq() == {0: (0, -4), 1: (-4, -3)}
    assert [(c.step, c.segment, c.span) for c in calls] == [(0, "prefill", (0, -4)), (1, "decode", (-4, -3))]


def test_a_seq_given_twice_keeps_the_span_of_its_last_record_in_call_order() -> None:
    """Rows: seq 7 in step 0 (4 rows), seq 7 in step 1 (1 row), seq 7 in step 0 again (2 rows).
    Call by call, step 0's second record is visited before step 1's, so step 1's span holds."""
    spans, _ = record_spans(
        np.array([7, 7, 7], dtype=np.int64),
        np.array([0, 1, 0], dtype=np.int64),
        Coded(["prefill", "decode"], np.array([0, 1, 0], dtype=np.int64)),
        np.array([4, 1, 2], dtype=np.int64),
        np.full(3, -1, dtype=np.int64),
    )
    assert spans.by_seq() == {7: (4, 5)}


def test_a_capture_s_records_align_as_a_list_of_the_same_records_does(demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    for scenario in ("swiglu-order", "post-eos"):
        native_path, oracle_path = demo_pairs[scenario]
        with open_capture(native_path) as native, open_capture(oracle_path) as oracle:
            profiles = resolve_profiles(native, oracle, CompareOptions())
            for mode in ("calls", "positions"):
                from_columns = align(native.records, oracle.records, *profiles, mode=mode)
                from_list = align(list(native.records), list(oracle.records), *profiles, mode=mode)
                assert from_columns.pairs == from_list.pairs
                assert from_columns.unaligned == from_list.unaligned
                assert from_columns.native_calls == from_list.native_calls
                assert len(from_columns.pairs) == (222 if scenario == "post-eos" else 333)
