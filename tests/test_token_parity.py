"""Token parity stops at the first shared EOS; what follows is invalid, never a failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hand_captures import T, bf16_bits, write_capture

from sessions.capture.opening import open_capture
from sessions.compare.comparison import iter_compare
from sessions.compare.options import CompareOptions
from sessions.compare.token_parity import DIFFER, MATCH, POST_EOS, step_word
from sessions.compare.verdict import DIVERGENCE, PARITY
from sessions.progress import run_to_end
from sessions.report.html_page import render_html
from sessions.report.text import render


def _logits(step: int, favourite: int) -> T:
    row = np.zeros((1, 12), dtype=np.float32)
    row[0, favourite] = 2.0
    row[0, (favourite + 1) % 12] = 1.0
    return T("logits", bf16_bits(row), step=step, segment="decode" if step else "prefill", dtype="bfloat16")


def _compare(tmp_path: Path, native: tuple[list[T], list[tuple[int, int, bool]]], oracle: tuple[list[T], list[tuple[int, int, bool]]]):  # type: ignore[no-untyped-def]
    n = write_capture(tmp_path / "n.h5", "native", *native)
    o = write_capture(tmp_path / "o.h5", "oracle", *oracle)
    with open_capture(n) as a, open_capture(o) as b:
        return run_to_end(iter_compare(a, b))


def test_differences_after_the_shared_eos_are_post_eos_not_failures(tmp_path: Path) -> None:
    tokens = [(0, 3, False), (1, 4, False), (2, 9, True)]
    native = ([_logits(0, 3), _logits(1, 4), _logits(2, 9), _logits(3, 5)], tokens + [(3, 5, False)])
    oracle = ([_logits(0, 3), _logits(1, 4), _logits(2, 9), _logits(3, 6)], tokens + [(3, 6, False)])
    comparison = _compare(tmp_path, native, oracle)
    parity = comparison.tokens
    assert parity.shared_eos_step == 2 and parity.first_divergence_step is None and parity.compared_steps == 3
    assert [s.status for s in parity.steps] == [MATCH, MATCH, MATCH, POST_EOS]
    assert parity.steps[3].differs
    step3 = [p for p in comparison.pairs if p.key.step == 3]
    assert len(step3) == 1 and step3[0].post_eos and not step3[0].metrics.bit_exact
    assert comparison.first_divergence is None and comparison.verdict.word == PARITY


def test_a_token_difference_before_any_eos_is_a_divergence(tmp_path: Path) -> None:
    native = ([_logits(0, 3), _logits(1, 4)], [(0, 3, False), (1, 4, False)])
    oracle = ([_logits(0, 3), _logits(1, 5)], [(0, 3, False), (1, 5, False)])
    comparison = _compare(tmp_path, native, oracle)
    assert comparison.tokens.first_divergence_step == 1
    assert [s.status for s in comparison.tokens.steps] == [MATCH, DIFFER]
    assert comparison.verdict.word == DIVERGENCE


def test_the_same_token_that_only_one_run_takes_as_its_stop_is_a_finding_that_says_so(tmp_path: Path) -> None:
    native = ([_logits(0, 3), _logits(1, 4)], [(0, 3, False), (1, 4, False)])
    oracle = ([_logits(0, 3), _logits(1, 4)], [(0, 3, False), (1, 4, True)])
    comparison = _compare(tmp_path, native, oracle)
    first = comparison.verdict.first
    assert comparison.verdict.word == DIVERGENCE and first is not None
    assert first.detail == "token 4 on both sides, a stop only in the oracle run", "an equal token id must not read as agreement"
    assert comparison.verdict.reasons == ["the token steps differ from step 1 (token 4 on both sides, a stop only in the oracle run)"]


def test_top_k_logits_are_shown_side_by_side_with_bits(tmp_path: Path) -> None:
    native = ([_logits(0, 3)], [(0, 3, False)])
    oracle = ([_logits(0, 6)], [(0, 6, False)])
    step = _compare(tmp_path, native, oracle).tokens.steps[0]
    assert [(e.token_id, e.decimal, e.hex) for e in step.logits.native_top[:2]] == [(3, "2.0", "0x4000"), (4, "1.0", "0x3f80")]
    assert [e.token_id for e in step.logits.oracle_top[:2]] == [6, 7]


def test_equal_tokens_over_different_logits_are_a_near_miss_with_kl_and_delta_logit(tmp_path: Path) -> None:
    native_row = _logits(0, 3)
    native_row.data[0, 4] = bf16_bits([1.5])[0]
    native = ([native_row], [(0, 3, False)])
    oracle = ([_logits(0, 3)], [(0, 3, False)])
    comparison = _compare(tmp_path, native, oracle)
    step = comparison.tokens.steps[0]
    assert step.status == MATCH and step_word(step) == "match, logits differ"
    p_logits = np.zeros(12)
    p_logits[3], p_logits[4] = 2.0, 1.0
    q_logits = p_logits.copy()
    q_logits[4] = 1.5
    p, q = np.exp(p_logits) / np.exp(p_logits).sum(), np.exp(q_logits) / np.exp(q_logits).sum()
    assert step.logits is not None and not step.logits.identical
    assert step.logits.kl_divergence == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-12)
    assert step.logits.delta_logit == 0.0 and step.logits.top_overlap == 1.0
    assert comparison.verdict.word == DIVERGENCE and comparison.tokens.first_divergence_step is None


def test_identical_logits_read_as_a_plain_match(tmp_path: Path) -> None:
    step = _compare(tmp_path, ([_logits(0, 3)], [(0, 3, False)]), ([_logits(0, 3)], [(0, 3, False)])).tokens.steps[0]
    assert step_word(step) == "match" and step.logits is not None and step.logits.summary() == "logits bit-identical"


def test_a_token_budget_compares_only_the_steps_before_it_and_reads_nothing_after(tmp_path: Path) -> None:
    tokens = [(0, 3, False), (1, 4, False), (2, 9, False)]
    native = write_capture(tmp_path / "n.h5", "native", [_logits(0, 3), _logits(1, 4), _logits(2, 9), _logits(3, 5)], tokens + [(3, 5, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [_logits(0, 3), _logits(1, 4), _logits(2, 9)], tokens)
    with open_capture(native) as n, open_capture(oracle) as o:
        whole = run_to_end(iter_compare(n, o))
        budget = run_to_end(iter_compare(n, o, CompareOptions(max_steps=3)))
    assert whole.verdict.word == DIVERGENCE and whole.tokens.first_divergence_step == 3
    assert [u.step for u in whole.unaligned] == [3]
    assert budget.verdict.word == PARITY and budget.verdict.first is None
    assert budget.tokens.compared_steps == 3 and [s.step for s in budget.tokens.steps] == [0, 1, 2]
    assert budget.unaligned == [] and budget.post_eos_unaligned == []
    assert sorted(p.key.step for p in budget.pairs) == [0, 1, 2]


def test_the_text_report_says_how_many_differing_token_steps_it_did_not_list(tmp_path: Path) -> None:
    native = ([_logits(step, 3) for step in range(7)], [(step, 3, False) for step in range(7)])
    oracle = ([_logits(step, 5) for step in range(7)], [(step, 5, False) for step in range(7)])
    text = render(_compare(tmp_path, native, oracle), 10)
    listed = [line for line in text.splitlines() if line.startswith("  step ")]
    assert [line.split(":")[0] for line in listed] == [f"  step {step}" for step in range(5)]
    assert "  ... 2 more (all are in the JSON report and with --full)" in text


def test_the_html_token_table_says_none_for_a_step_a_run_never_made_and_post_eos_for_one_after_the_stop(tmp_path: Path) -> None:
    tokens = [(0, 3, False), (1, 9, True)]
    native = ([_logits(0, 3), _logits(1, 9), _logits(2, 5)], tokens + [(2, 5, False)])
    oracle = ([_logits(0, 3), _logits(1, 9)], tokens)
    html = render_html(_compare(tmp_path, native, oracle))
    row = html[html.index("<td>2</td>") :].split("</tr>")[0]
    assert "<td>5</td><td>none</td>" in row and "not compared (post-EOS)" in row
    assert "<td>None</td>" not in html and "<td>9 (stop)</td>" in html


def test_a_logits_row_holding_a_nan_has_an_undefined_kl_divergence_in_words(tmp_path: Path) -> None:
    """Every surface wrote "KL nan nats"."""
    row = np.linspace(-1, 1, 16, dtype=np.float32)[None]
    broken = row.copy()
    broken[0, 3] = np.nan
    native = write_capture(tmp_path / "n.h5", "native", [T("logits", broken)], [(0, 15, False)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("logits", row)], [(0, 15, False)])
    with open_capture(native) as n, open_capture(oracle) as o:
        (step,) = run_to_end(iter_compare(n, o)).tokens.steps
    assert step.logits is not None and step.logits.kl_text() == "undefined (a NaN or an infinity in the logits)"
    assert "KL undefined (a NaN or an infinity in the logits)" in step.logits.summary() and step.logits.kl_text(short=True) == "undefined"
