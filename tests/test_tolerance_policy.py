"""A tolerance policy file gives each op its own bounds; every surface reads the same judgement."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sessions.capture.opening import open_capture
from sessions.commands import report as report_command
from sessions.compare.comparison import iter_compare
from sessions.compare.in_child import options_from_json, options_to_json
from sessions.compare.key import OpKey
from sessions.compare.options import CompareOptions
from sessions.compare.tensor_diff import Tolerance
from sessions.compare.tolerance_policy import (
    MAX_POLICY_BYTES,
    PolicyError,
    ToleranceRule,
    load_policy,
)
from sessions.compare.verdict import DIVERGENCE, PARITY, SIGNED_ZERO_ONLY, Kind
from sessions.progress import run_to_end
from tests.hand_captures import T, bf16_bits, one_ulp_pair, policy_file, write_capture
from tests.side_files import fifo_without_writer, sparse_file


def test_a_rule_for_the_logits_passes_them_and_leaves_other_ops_bit_exact(tmp_path: Path) -> None:
    native, oracle = one_ulp_pair(tmp_path)
    policy = load_policy(policy_file(tmp_path, '[[rule]]\nop = "logits"\nmax_ulp = 1\n'))
    with open_capture(native) as n, open_capture(oracle) as o:
        comparison = run_to_end(iter_compare(n, o, CompareOptions(policy=policy)))
    kinds = {p.key.op: p.verdict for p in comparison.pairs}
    assert kinds == {"layer_out": Kind.DIVERGED, "logits": Kind.WITHIN_TOLERANCE}
    assert comparison.verdict.word == DIVERGENCE and comparison.verdict.first.key == OpKey(0, "prefill", 0, "layer_out")
    assert comparison.tolerance_policy == str((tmp_path / "policy.toml").resolve())


def test_a_key_regex_and_a_dtype_select_the_ops_a_rule_covers(tmp_path: Path) -> None:
    native, oracle = one_ulp_pair(tmp_path)
    covering = load_policy(policy_file(tmp_path, '[[rule]]\nmatch = "^0:prefill:"\ndtype = "bfloat16"\nmax_ulp = 1\n'))
    other_dtype = load_policy(policy_file(tmp_path, '[[rule]]\nmatch = "^0:prefill:"\ndtype = "float16"\nmax_ulp = 1\n'))
    with open_capture(native) as n, open_capture(oracle) as o:
        assert run_to_end(iter_compare(n, o, CompareOptions(policy=covering))).verdict.word == PARITY
        assert run_to_end(iter_compare(n, o, CompareOptions(policy=other_dtype))).verdict.word == DIVERGENCE


def test_rules_win_over_the_command_line_bounds_which_win_over_the_policy_default(tmp_path: Path) -> None:
    policy = load_policy(policy_file(tmp_path, '[default]\nmax_ulp = 9\n[[rule]]\nop = "logits"\natol = 0.5\n'))
    options = CompareOptions(max_ulp=2, policy=policy)
    assert options.tolerance_for(OpKey(0, "prefill", -1, "logits"), "bfloat16") == Tolerance(atol=0.5)
    assert options.tolerance_for(OpKey(0, "prefill", 0, "sdpa"), "bfloat16") == Tolerance(max_ulp=2)
    assert CompareOptions(policy=policy).tolerance_for(OpKey(0, "prefill", 0, "sdpa"), "bfloat16") == Tolerance(max_ulp=9)
    assert options_from_json(options_to_json(options)) == options, "the policy crosses to the comparing child intact"


@pytest.mark.parametrize("policy", ['[[rule]]\nop = "layer_out"\natol = 0\n', "[default]\natol = 0\n", '[[rule]]\nop = "layer_out"\natol = 0\nrtol = 0\nmax_ulp = 0\n'])
def test_a_bound_of_0_in_a_policy_is_no_bound_as_on_the_command_line_so_a_signed_zero_swap_still_fails(tmp_path: Path, policy: str) -> None:
    out = bf16_bits([[1.0, 0.0, 3.0, 4.0]])
    swapped = out.copy()
    swapped[0, 1] = 0x8000
    native = write_capture(tmp_path / "n.h5", "native", [T("layer_out", swapped, layer=0, dtype="bfloat16")])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("layer_out", out, layer=0, dtype="bfloat16")])
    loaded = load_policy(policy_file(tmp_path, policy))
    with open_capture(native) as n, open_capture(oracle) as o:
        by_policy = run_to_end(iter_compare(n, o, CompareOptions(policy=loaded)))
        by_command_line = run_to_end(iter_compare(n, o, CompareOptions(atol=0.0)))
    assert [p.verdict for p in by_policy.pairs] == [p.verdict for p in by_command_line.pairs] == [Kind.SIGNED_ZERO_ONLY]
    assert by_policy.verdict.word == by_command_line.verdict.word == SIGNED_ZERO_ONLY
    assert loaded.rule_for(OpKey(0, "prefill", 0, "layer_out"), "bfloat16") in (None, ToleranceRule(op="layer_out"))


def test_report_takes_the_policy_and_every_output_says_which_ops_passed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = one_ulp_pair(tmp_path)
    path = policy_file(tmp_path, '[[rule]]\nop = "logits"\nmax_ulp = 1\n[[rule]]\nop = "layer_out"\nmax_ulp = 1\n')
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code = report_command.run(parser.parse_args([str(native), str(oracle), "--tolerance-policy", str(path), "--json", str(out_json), "--html", str(out_html)]))
    text = capsys.readouterr().out
    assert code == 0 and text.startswith("PARITY: ")
    assert f"tolerance  per-op rules from {path.resolve()}; bit-exact where none applies (bit differences are still counted)" in text
    document = json.loads(out_json.read_text())
    assert [p["verdict"] for p in document["pairs"]] == ["within-tolerance", "within-tolerance"]
    assert document["tolerance_policy"] == str(path.resolve()) and str(path.resolve()) in out_html.read_text()


def test_the_tolerance_line_of_a_policy_with_a_default_names_the_defaults_bounds_not_bit_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native, oracle = one_ulp_pair(tmp_path)
    path = policy_file(tmp_path, "[default]\nmax_ulp = 1\n")
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    out_json = tmp_path / "r.json"
    assert report_command.run(parser.parse_args([str(native), str(oracle), "--tolerance-policy", str(path), "--json", str(out_json)])) == 0
    assert f"tolerance  per-op rules from {path.resolve()}; max_ulp=1 where none applies (bit differences are still counted)" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["tolerance"] == {"atol": None, "rtol": None, "max_ulp": 1}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[rule]]\nmax_ulp = 1\n', "rule 1: a rule needs `op`"),
        ('[[rule]]\nop = "logits"\nmax_ulps = 1\n', "rule 1: unknown key(s) max_ulps"),
        ('[[rule]]\nop = "ffn_actt"\nmax_ulp = 1000\n', "rule 1: op 'ffn_actt' is not a canonical op (attn_norm, attn_probs,"),
        ('[[rule]]\nop = "ffn_act"\ndtype = "bf16"\nmax_ulp = 1\n', "rule 1: dtype 'bf16' is not a capture dtype (bfloat16, bool,"),
        ('[[rule]]\nmatch = "(unclosed"\n', "rule 1: match '(unclosed' is not a regular expression"),
        ('[[rule]]\nop = "logits"\nmax_ulp = -1\n', f"rule 1: max_ulp must be a whole number from 0 to {2**63 - 1}, not -1"),
        ('[[rule]]\nop = "logits"\nmax_ulp = 18446744073709551616\n', f"rule 1: max_ulp must be a whole number from 0 to {2**63 - 1}, not 18446744073709551616"),
        ('[default]\natol = "small"\n', "[default]: atol must be a finite number >= 0, not 'small'"),
        ('[default]\natol = nan\n', "[default]: atol must be a finite number >= 0, not nan"),
        ("[[rule]]\nmatch = '^(sdpa)\\1$'\n", "rule 1: match '^(sdpa)\\\\1$' is not a regular expression (invalid escape sequence: \\1: keys are matched by RE2, which has no back references"),
        ('[tolerances]\n', "unknown table(s) tolerances"),
        ('rule = 3\n', "`rule` must be an array of tables"),
        ('[[rule]\n', "not TOML"),
        ("x = " + "[" * 50_000 + "]" * 50_000 + "\n", "not TOML (it nests deeper than a reader follows)"),
        ("[default]\nmax_ulp = " + "9" * 5000 + "\n", "not TOML (Exceeds the limit (4300 digits) for integer string conversion"),
        ('[[rule]]\nmatch = "a{4294967296}"\n', "rule 1: match 'a{4294967296}' is not a regular expression (the repetition number is too large)"),
    ],
)
def test_a_bad_policy_names_the_file_the_place_and_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = policy_file(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(str(path)) and problem in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "fitting"),
    [("^(.|.|.|.)*Z$", "Z"), ("^(a+)+$", None), (".*.*.*.*.*.*.*.*.*.*.*.*x", "x"), ("(.*){20}x", "x"), (r"^\d+:decode:(\d+:)*sdpa$", "sdpa")],
)
def test_a_pattern_pythons_matcher_backtracks_on_for_hours_fits_a_run_of_keys_at_once(tmp_path: Path, pattern: str, fitting: str | None) -> None:
    """Such patterns were refused by a check of their shape, which let `.*.*...x` and `(.*){20}x`
    through to hold `report` on one key for good: they are now matched in linear time."""
    rule = load_policy(policy_file(tmp_path, f"[[rule]]\nmatch = '{pattern}'\nmax_ulp = 1\n")).rules[0]
    keys = [OpKey(step, "decode", layer, "attn_norm") for step in range(300) for layer in range(36)]
    assert sum(rule.fits(key, "bfloat16") for key in keys) == 0, "at once: Python's matcher took hours on one key"
    if fitting is not None:
        assert rule.fits(OpKey(3, "decode", 5, fitting), "bfloat16")


def test_a_policy_that_is_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    with fifo_without_writer(tmp_path, "policy.toml") as path, pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value) == f"{path}: cannot be read (not a regular file: a FIFO)"


def test_a_policy_that_is_a_device_is_refused_instead_of_read_without_end() -> None:
    with pytest.raises(PolicyError, match=r"^/dev/zero: cannot be read \(not a regular file: a character device\)$"):
        load_policy("/dev/zero")


def test_a_policy_over_its_size_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    path = sparse_file(tmp_path / "policy.toml", MAX_POLICY_BYTES + 1)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value) == f"{path}: cannot be read ({MAX_POLICY_BYTES + 1} bytes, over the {MAX_POLICY_BYTES}-byte limit for this kind of file)"
