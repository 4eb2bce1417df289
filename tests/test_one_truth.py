"""Every surface names the same verdict, kind and key for the same pair.

One case per demo scenario plus planted cases (a 1-ULP flip, a signed-zero flip, a contract
change, a dispatch-only change, a missing record, a token difference after the shared EOS, a
bit flipped in runs cut into different calls), and two real llama.cpp runs, flash attention off
and on.
For each, the CLI text, the JSON, the HTML, the tree's first non-exact op, Ctrl+J's target,
the Overview's marker and the window's verdict strip are read and must agree with what the
case documents.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from sessions.commands import report as report_command
from sessions.compare.key import OpKey
from sessions.compare.unaligned import BY_DESIGN
from sessions.compare.verdict import (
    CONTRACT_MISMATCH,
    DISPATCH_ONLY,
    DIVERGENCE,
    NOT_EXACT,
    PARITY,
    SIGNED_ZERO_ONLY,
    Kind,
)
from tests.hand_captures import T, bf16_bits, write_capture
from tests.viewer_windows import window_on
from viewer.settings import ViewerSettings
from viewer.theme import STATUS_COLOURS
from viewer.tree.alignment_tree import PAIR_ROLE, UNALIGNED_ROLE
from viewer.window.main_window import MainWindow

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

WAIT_MS = 120_000
CALL = dict(kv_group=-1, head_start=0, head_count=4, q_heads=4, kv_heads=1, q_rows=4, kv_len=4, head_dim=8, primitive="fallback")


@dataclass(frozen=True)
class Case:
    native: Path
    oracle: Path
    word: str
    kind: Kind | None
    key: str | None


def _planted_cut(tmp_path: Path) -> Case:
    """One prefill of 4 rows against the same rows cut into two calls, one bit flipped at position 3."""
    rng = np.random.default_rng(8)
    norm, out = bf16_bits(rng.standard_normal((4, 8))), bf16_bits(rng.standard_normal((4, 8)))
    flipped = out.copy()
    flipped[3, 5] ^= 1
    native = write_capture(
        tmp_path / "cut.native.h5", "native",
        [T("attn_norm", norm, layer=0, dtype="bfloat16", position=0), T("layer_out", flipped, layer=0, dtype="bfloat16", position=0)],
        [(0, 5, False)],
    )
    oracle = write_capture(
        tmp_path / "cut.oracle.h5", "oracle",
        [T(name, bits[a:b], segment=segment, layer=0, dtype="bfloat16", position=a) for segment, a, b in (("first", 0, 2), ("second", 2, 4)) for name, bits in (("attn_norm", norm), ("layer_out", out))],
        [(0, 5, False)],
    )
    return Case(native, oracle, DIVERGENCE, Kind.DIVERGED, "0:prefill:0:layer_out@2-3")


def _planted(tmp_path: Path, name: str) -> Case:
    """Three ops of one layer and two token steps, with one planted difference on the native side."""
    if name == "cut-position":
        return _planted_cut(tmp_path)
    rng = np.random.default_rng(7)
    norm = bf16_bits(rng.standard_normal((4, 8)))
    attention = bf16_bits(rng.standard_normal((4, 32)))
    out = bf16_bits(rng.standard_normal((4, 8)))
    out[1, 1] = 0x8000
    n_norm, n_out = norm.copy(), out.copy()
    n_contract, n_calls, tokens_native = "attn.f16", [CALL], [(0, 5, False), (1, 2, True)]
    tensors_native = True
    if name == "one-ulp":
        n_norm[2, 3] += 1
    elif name == "signed-zero":
        n_out[1, 1] = 0x0000
    elif name == "contract":
        n_contract = "attn.f32"
    elif name == "dispatch-only":
        n_calls = [dict(CALL, kv_group=0, head_count=2), dict(CALL, kv_group=0, head_start=2, head_count=2)]
    elif name == "missing":
        tensors_native = False
    elif name == "post-eos-token":
        tokens_native = [(0, 5, False), (1, 2, True), (2, 9, False)]

    def tensors(norm_bits: np.ndarray, out_bits: np.ndarray, contract: str, calls: list[dict[str, object]], with_out: bool) -> list[T]:
        ids = dict(kernel_id="sdpa", contract_id=contract, effective_contract_id=contract)
        made = [
            T("attn_norm", norm_bits, layer=0, dtype="bfloat16"),
            T("sdpa", attention, layer=0, dtype="bfloat16", dispatch=calls, **ids),
        ]
        return made + ([T("layer_out", out_bits, layer=0, dtype="bfloat16")] if with_out else [])

    native = write_capture(tmp_path / f"{name}.native.h5", "native", tensors(n_norm, n_out, n_contract, n_calls, tensors_native), tokens_native)
    oracle = write_capture(tmp_path / f"{name}.oracle.h5", "oracle", tensors(norm, out, "attn.f16", [CALL], True), [(0, 5, False), (1, 2, True)])
    expected = {
        "one-ulp": (DIVERGENCE, Kind.DIVERGED, "0:prefill:0:attn_norm"),
        "signed-zero": (SIGNED_ZERO_ONLY, Kind.SIGNED_ZERO_ONLY, "0:prefill:0:layer_out"),
        "contract": (CONTRACT_MISMATCH, Kind.CONTRACT_MISMATCH, "0:prefill:0:sdpa"),
        "dispatch-only": (DISPATCH_ONLY, Kind.DISPATCH_ONLY, "0:prefill:0:sdpa"),
        "missing": (DIVERGENCE, Kind.UNALIGNED, "0:prefill:0:layer_out"),
        "post-eos-token": (PARITY, None, None),
    }[name]
    return Case(native, oracle, *expected)


def _llama_flash_attention(tmp_path: Path) -> Case:
    """Two real llama.cpp runs of one tiny model, flash attention off and on: every op before the
    first layer's attention agrees, its KV-cache cells included, and the attention ran other kernels."""
    pytest.importorskip("llama_cpp")
    from backends.demo.llama_pairs import demo_weights_f32
    from backends.engines.gguf_export import export_gguf
    from backends.recorders.llama_process import iter_record_llama
    from backends.recorders.llama_recorder import LlamaSettings
    from backends.recorders.record_schedule import TokenSchedule
    from sessions.progress import run_to_end
    from tests.test_llama_recorder import TINY

    gguf = export_gguf(TINY.as_dict(), demo_weights_f32(TINY, 3), tmp_path / "tiny.f32.gguf", "f32")
    schedule = TokenSchedule((5, 17, 3, 88, 41), decode_steps=1)
    native, oracle = tmp_path / "llama.h5", tmp_path / "llama.flash.h5"
    run_to_end(iter_record_llama(gguf, schedule, native))
    run_to_end(iter_record_llama(gguf, schedule, oracle, LlamaSettings(flash_attn=True)))
    return Case(native, oracle, CONTRACT_MISMATCH, Kind.CONTRACT_MISMATCH, "0:prefill:0:sdpa")


PLANTED = ("one-ulp", "signed-zero", "contract", "dispatch-only", "missing", "post-eos-token", "cut-position")
SCENARIOS = ("clean", "head-chunk", "attention-contract", "swiglu-order", "signed-zero", "post-eos")


@pytest.fixture(params=[f"planted:{n}" for n in PLANTED] + [f"demo:{n}" for n in SCENARIOS] + ["llama:flash-attention"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    source, name = request.param.split(":")
    if source == "planted":
        return _planted(tmp_path, name)
    if source == "llama":
        return _llama_flash_attention(tmp_path)
    from backends.engines.demo_scenarios import SCENARIOS as DOCUMENTED

    native, oracle = request.getfixturevalue("demo_pairs")[name]
    expected = DOCUMENTED[name].expected
    return Case(native, oracle, expected.word, expected.kind, None if expected.key is None else expected.key.text())


def _headless(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict, str]:
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code = report_command.run(parser.parse_args([str(case.native), str(case.oracle), "--json", str(out_json), "--html", str(out_html)]))
    return code, capsys.readouterr().out, json.loads(out_json.read_text()), out_html.read_text()


def _first_non_exact_in_tree(win: MainWindow) -> str | None:
    """Walk the tree's op rows in display order; the first whose kind is not bit-exact (or an unaligned row)."""
    model = win.tree.items

    def walk(parent) -> str | None:  # type: ignore[no-untyped-def]
        for row in range(parent.rowCount()):
            item = parent.child(row, 0)
            pair = item.data(PAIR_ROLE)
            if pair is not None and pair.verdict in NOT_EXACT:
                return pair.key.text()
            found = walk(item)
            if found is not None:
                return found
        return None

    return walk(model.invisibleRootItem())


def test_every_surface_names_the_same_verdict_kind_and_key(case: Case, tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]) -> None:
    code, text, document, html = _headless(case, tmp_path, capsys)
    assert code == (0 if case.word == PARITY else 1)
    first_line = text.splitlines()[0]
    assert first_line.startswith(f"{case.word}: ")
    verdict = document["verdict"]
    assert verdict["word"] == case.word
    if case.key is None:
        assert verdict["first"] is None and "First finding: none" in text
    else:
        assert (verdict["first"]["kind"], verdict["first"]["key"]) == (case.kind, case.key)
        assert f"first {case.kind} at {case.key}" in first_line
        assert f"First finding: {case.kind} at {case.key}" in text
        assert f"<code>{case.key}</code>" in html
    assert f">{case.word}: " in html
    (count,) = re.findall(r"^ops .*; (\d[\d,]* unaligned(?: \([^)]*\))?)$", text, re.M)
    (ops,) = re.findall(r"^ops +(.*)$", text, re.M)
    assert f"<p>Ops: {escape(ops)}</p>" in html, "the pairs by kind, as the text counts them"
    assert ("by design" in count) == any(u["reason"] in BY_DESIGN for u in document["unaligned"])

    win = MainWindow(ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(win)
    win.resize(1280, 720)
    win.show()
    win.open_pair(case.native, case.oracle)
    qtbot.waitUntil(lambda: win.model.comparison is not None and not win.tasks.busy, timeout=WAIT_MS)
    assert win.verdict_strip.word.text() == case.word
    assert f"; {count};" in win.tree.summary.text() and win.tree.summary.text().startswith(ops)
    assert ("aligned by position" in win.verdict_strip.detail.text()) == ("@" in (case.key or ""))
    pair_kinds = {Kind.DIVERGED, Kind.SIGNED_ZERO_ONLY, Kind.CONTRACT_MISMATCH, Kind.DISPATCH_ONLY}
    if case.key is None:
        assert not win.verdict_strip.go.isVisible()
        assert win.overview.first_label.scene() is None
    else:
        assert f"first {case.kind} at {case.key}" in win.verdict_strip.detail.text()
        qtbot.keyClick(win, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
        if case.kind in pair_kinds:
            assert win.model.selected is not None and win.model.selected.key == OpKey.parse(case.key)
            assert win.tree.view.currentIndex().data(PAIR_ROLE) is win.model.selected
            assert _first_non_exact_in_tree(win) == case.key
            win.tree.filter.setText("a filter no row matches")
            qtbot.keyClick(win, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
            assert win.tree.filter.text() == "" and win.tree.view.currentIndex().data(PAIR_ROLE) is win.model.selected, "Ctrl+J shows its op under any filter"
            win.show_panel(1)
            qtbot.waitUntil(lambda: win.overview.first_label.toPlainText() == f"first {case.kind}: {case.key}", timeout=WAIT_MS)
            assert win.overview.first_label.color.name() == QColor(STATUS_COLOURS[case.kind]).name(), "the finding's colour, as the strip's"
        else:
            current = win.tree.view.currentIndex()
            record = win.tree.proxy.mapToSource(current.siblingAtColumn(0)).data(UNALIGNED_ROLE)
            assert record is not None and f"{record.step}:{record.segment}:{record.layer}" in case.key
            assert win.model.selected is None, "no pair's tensors stay on show beside a record without a partner"
    win.close()


def _two_steps(tmp_path: Path, name: str, native_contract_at_2: str, native_tokens: list[tuple[int, int, bool]], oracle_tokens: list[tuple[int, int, bool]]) -> tuple[Path, Path]:
    """Three token steps of attn_norm, sdpa and logits, every tensor the same on both sides."""
    rng = np.random.default_rng(11)
    made = [(step, name_, bf16_bits(rng.standard_normal((1, 8)))) for step in range(3) for name_ in ("attn_norm", "sdpa", "logits")]

    def tensors(contract_at_2: str) -> list[T]:
        out = []
        for step, op, bits in made:
            contract = contract_at_2 if step == 2 else "attn.f16"
            ids = dict(kernel_id="sdpa", contract_id=contract, effective_contract_id=contract) if op == "sdpa" else {}
            out.append(T(op, bits, step=step, segment="decode", layer=-1 if op == "logits" else 0, dtype="bfloat16", **ids))
        return out

    native = write_capture(tmp_path / f"{name}.native.h5", "native", tensors(native_contract_at_2), native_tokens)
    oracle = write_capture(tmp_path / f"{name}.oracle.h5", "oracle", tensors("attn.f16"), oracle_tokens)
    return native, oracle


def test_tokens_that_differ_over_bit_exact_tensors_read_as_a_token_divergence_everywhere(tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = _two_steps(tmp_path, "tokens", "attn.f16", [(0, 5, False), (1, 8, False), (2, 3, False)], [(0, 5, False), (1, 7, False), (2, 3, False)])
    code, text, document, html = _headless(Case(native, oracle, DIVERGENCE, Kind.TOKENS, "1:decode:-1:logits"), tmp_path, capsys)
    assert code == 1 and text.startswith("DIVERGENCE: first tokens at 1:decode:-1:logits (native token 8 vs oracle token 7)")
    assert (document["verdict"]["first"]["kind"], document["verdict"]["first"]["key"]) == ("tokens", "1:decode:-1:logits")
    assert "first tokens: 1:decode:-1:logits" in html

    win = window_on(qtbot, tmp_path, native, oracle)
    assert win.verdict_strip.word.text() == DIVERGENCE and "first tokens at 1:decode:-1:logits" in win.verdict_strip.detail.text()
    assert "9 aligned (9 bit-exact); 0 unaligned; tokens differ from step 1;" in win.tree.summary.text()
    steps = {win.tree.items.item(row, 0).text(): win.tree.items.item(row, 1).text() for row in range(win.tree.items.rowCount())}
    assert steps == {"step 0": "bit-exact", "step 1": "tokens", "step 2": "bit-exact"}, "a collapsed tree points at the step whose tokens differ"
    win.show_panel(1)
    qtbot.waitUntil(lambda: win.overview.first_label.toPlainText() == "first tokens: 1:decode:-1:logits", timeout=WAIT_MS)
    win.close()


def test_a_run_that_stops_a_step_early_points_every_surface_at_the_logits_only_the_other_recorded(
    tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]
) -> None:
    logits = [bf16_bits(np.full((1, 8), step + 1.0)) for step in range(3)]

    def run(steps: int) -> list[T]:
        return [T("logits", logits[step], step=step, segment="decode", layer=-1, dtype="bfloat16") for step in range(steps)]

    native = write_capture(tmp_path / "short.native.h5", "native", run(2), [(0, 5, False), (1, 7, False)])
    oracle = write_capture(tmp_path / "short.oracle.h5", "oracle", run(3), [(0, 5, False), (1, 7, False), (2, 8, False)])
    code, text, document, _ = _headless(Case(native, oracle, DIVERGENCE, Kind.TOKENS, "2:decode:-1:logits"), tmp_path, capsys)
    assert code == 1 and text.startswith("DIVERGENCE: first tokens at 2:decode:-1:logits (native token none vs oracle token 8)")
    assert "First finding: tokens at 2:decode:-1:logits\n" in text, "no rerun or diagnose of an op that has no pair"
    assert [(u["side"], u["step"], u["name"]) for u in document["unaligned"]] == [("oracle", 2, "logits")]

    win = window_on(qtbot, tmp_path, native, oracle)
    qtbot.keyClick(win, Qt.Key.Key_J, Qt.KeyboardModifier.ControlModifier)
    current = win.tree.view.currentIndex()
    record = win.tree.proxy.mapToSource(current.siblingAtColumn(0)).data(UNALIGNED_ROLE)
    assert record is not None and (record.side, record.step, record.name) == ("oracle", 2, "logits")
    assert win.model.selected is None
    win.close()


def test_a_divergence_before_a_contract_mismatch_leaves_neither_kind_out_of_the_strip(tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(5)
    norm, attention = bf16_bits(rng.standard_normal((4, 8))), bf16_bits(rng.standard_normal((4, 32)))
    flipped = norm.copy()
    flipped[0, 0] ^= 1

    def run(norm_bits: np.ndarray, contract: str) -> list[T]:
        ids = dict(kernel_id="sdpa", contract_id=contract, effective_contract_id=contract)
        return [T("attn_norm", norm_bits, layer=layer, dtype="bfloat16") for layer in (0, 1)] + [
            T("sdpa", attention, layer=layer, dtype="bfloat16", **ids) for layer in (0, 1)
        ]

    native = write_capture(tmp_path / "n.h5", "native", run(flipped, "attn.f32"))
    oracle = write_capture(tmp_path / "o.h5", "oracle", run(norm, "attn.f16"))
    _, _, document, _ = _headless(Case(native, oracle, CONTRACT_MISMATCH, Kind.DIVERGED, "0:prefill:0:attn_norm"), tmp_path, capsys)
    verdict = document["verdict"]
    assert (verdict["word"], verdict["first"]["kind"], verdict["reason_kinds"]) == (CONTRACT_MISMATCH, "diverged", ["contract-mismatch", "diverged"])
    win = window_on(qtbot, tmp_path, native, oracle)
    detail = win.verdict_strip.detail.text()
    assert detail.startswith("first diverged at 0:prefill:0:attn_norm (of 2): ")
    assert "also: 2 op(s) contract-mismatch, first at 0:prefill:0:sdpa" in detail and "op(s) diverged" not in detail
    win.close()


def test_a_contract_that_changes_after_the_shared_eos_is_no_finding_on_any_surface(tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = [(0, 5, False), (1, 7, True), (2, 3, False)]
    native, oracle = _two_steps(tmp_path, "post-eos-contract", "attn.f32", tokens, tokens)
    code, text, document, html = _headless(Case(native, oracle, PARITY, None, None), tmp_path, capsys)
    assert code == 0 and text.startswith("PARITY: ")
    assert "2:decode:0:sdpa" not in text.split("Execution contracts", 1)[1].split("\n\n", 1)[0]
    assert document["contracts"]["findings"] == [] and "attn.f32" not in html
    assert [p["verdict"] for p in document["pairs"] if p["key"] == "2:decode:0:sdpa"] == ["post-eos"]

    win = window_on(qtbot, tmp_path, native, oracle)
    assert win.verdict_strip.word.text() == PARITY
    assert not [text for text in win.banners.texts("comparison") if "attn.f32" in text], "no contract card for an op after the shared EOS"
    win.close()


def test_pairing_by_position_in_the_window_is_what_report_and_a_saved_session_say(
    tmp_path: Path, qtbot: QtBot, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    from viewer.cli import main

    native, oracle = demo_pairs["head-chunk"]  # both runs made the same calls: auto pairs by calls, and the calls differ
    win = window_on(qtbot, tmp_path, native, oracle)
    qtbot.waitUntil(lambda: len(win.session_file.session.captures) == 2, timeout=WAIT_MS)
    assert win.verdict_strip.word.text() == DISPATCH_ONLY
    [by_position] = [a for a in win.alignment_actions.actions() if a.data() == "positions"]
    assert [a.isChecked() for a in win.alignment_actions.actions()] == [True, False, False]
    assert by_position.toolTip().endswith("attention calls are compared only where the runs were cut alike"), "as this pair's, cut alike, are below"
    by_position.trigger()
    qtbot.waitUntil(lambda: not win.tasks.busy and win.model.comparison is not None and win.model.comparison.comparison.alignment.mode == "positions", timeout=WAIT_MS)
    by_position_headline = "DISPATCH-ONLY: first dispatch-only at 0:text-after:0:sdpa@"
    assert win.verdict_strip.word.text() == DISPATCH_ONLY and by_position.isChecked()
    assert "first dispatch-only at 0:text-after:0:sdpa@" in win.verdict_strip.detail.text(), "runs cut alike compare their calls by position too"
    assert main(["report", str(native), str(oracle), "--align", "positions"]) == 1
    assert capsys.readouterr().out.startswith(by_position_headline)

    saved = tmp_path / "pairing.xray"
    win.session_file.choose_path = lambda _purpose: saved
    assert win.session_file.save_as()
    win.close()
    assert main(["report", "--session", str(saved)]) == 1, "the session's pairing, as the window showed it"
    assert capsys.readouterr().out.startswith(by_position_headline)
    assert main(["report", "--session", str(saved), "--align", "calls"]) == 1, "a mode given on the command line wins"
    assert capsys.readouterr().out.startswith("DISPATCH-ONLY: first dispatch-only at 0:text-after:0:sdpa (")

    reopened = MainWindow(ViewerSettings(tmp_path / "again.ini"))
    qtbot.addWidget(reopened)
    assert reopened.session_file.open_session(saved)
    assert [a.isChecked() for a in reopened.alignment_actions.actions()] == [False, False, True]
    reopened.close()


def test_a_tolerance_never_hides_a_dispatch_difference_and_bits_that_agree_never_judge_worse_than_bits_that_differ() -> None:
    from itertools import product

    from sessions.compare.verdict import SEVERITY, classify_pair

    for post_eos, contract, dispatch, signed_zero, tolerance_set in product((False, True), repeat=5):
        same = dict(post_eos=post_eos, contract_mismatch=contract, dispatch_differs=dispatch, signed_zero_only=signed_zero, tolerance_set=tolerance_set)
        exact = classify_pair(bit_exact=True, within_tolerance=True, **same)
        within = classify_pair(bit_exact=False, within_tolerance=True, **same)
        assert SEVERITY[exact] <= SEVERITY[within], same
        if dispatch and tolerance_set and not post_eos and not contract:
            assert within == Kind.DISPATCH_ONLY, same


def test_a_pair_within_tolerance_whose_attention_calls_differ_is_dispatch_only_on_every_headless_surface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(5)
    attention = bf16_bits(rng.standard_normal((4, 32)))
    flipped = attention.copy()
    flipped[2, 7] ^= 1
    ids = dict(kernel_id="sdpa", contract_id="attn.f16", effective_contract_id="attn.f16")
    split = [dict(CALL, kv_group=0, head_count=2), dict(CALL, kv_group=0, head_start=2, head_count=2)]
    tokens = [(0, 5, False)]
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("sdpa", attention, layer=0, dtype="bfloat16", dispatch=[CALL], **ids)], tokens)
    for name, calls, word, kind in (("split", split, DISPATCH_ONLY, Kind.DISPATCH_ONLY), ("whole", [CALL], PARITY, Kind.WITHIN_TOLERANCE)):
        native = write_capture(tmp_path / f"{name}.h5", "native", [T("sdpa", flipped, layer=0, dtype="bfloat16", dispatch=calls, **ids)], tokens)
        parser = argparse.ArgumentParser()
        report_command.add_arguments(parser)
        out_json, out_html = tmp_path / f"{name}.json", tmp_path / f"{name}.html"
        code = report_command.run(parser.parse_args([str(native), str(oracle), "--max-ulp", "1", "--json", str(out_json), "--html", str(out_html)]))
        text, document, html = capsys.readouterr().out, json.loads(out_json.read_text()), out_html.read_text()
        assert code == (1 if word == DISPATCH_ONLY else 0)
        assert [p["verdict"] for p in document["pairs"]] == [kind] and document["verdict"]["word"] == word
        assert text.startswith(f"{word}: ") and f">{word}: " in html
    split_text = (tmp_path / "split.json").read_text()
    assert '"bits within tolerance (1 of 128 elements differ, max 1 ULP), attention calls differ in' in split_text


def test_runs_cut_differently_but_paired_by_calls_say_so_on_every_surface(tmp_path: Path, qtbot: QtBot, capsys: pytest.CaptureFixture[str]) -> None:
    """No positions recorded and prompts of different lengths: `auto` pairs by calls, and every
    surface said "same calls" above a list of records without partners."""
    rng = np.random.default_rng(9)
    rows = bf16_bits(rng.standard_normal((8, 8)))
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", rows, layer=0, dtype="bfloat16")], [(0, 5, False)])
    cut = [T("layer_out", rows[a:b], segment=segment, layer=0, dtype="bfloat16") for segment, a, b in (("text-before", 0, 3), ("visual", 3, 7))]
    oracle = write_capture(tmp_path / "o.h5", "oracle", cut, [(0, 5, False)])
    code, text, document, html = _headless(Case(native, oracle, DIVERGENCE, Kind.UNALIGNED, None), tmp_path, capsys)
    said = "by calls, cut differently: native prefill 0-7; oracle text-before 0-2, visual 3-6"
    assert code == 1 and f"alignment  {said}" in text.splitlines()
    assert document["alignment"]["mode"] == "calls" and document["alignment"]["cut_alike"] is False
    assert said in html
    win = window_on(qtbot, tmp_path, native, oracle)
    assert "aligned by calls, cut differently" in win.verdict_strip.detail.text()
    win.close()
