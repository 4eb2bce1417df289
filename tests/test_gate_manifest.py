"""The gate manifest: explicit and globbed cases, options per case, and bad manifests refused with a location."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from sessions.commands import gate as gate_command
from sessions.compare.options import CompareOptions
from sessions.compare.tensor_diff import Tolerance
from sessions.compare.tolerance_policy import load_policy
from sessions.gate.cache import case_key
from sessions.gate.manifest import (
    EOS_REQUIRE,
    EOS_STOP,
    MAX_MANIFEST_BYTES,
    GateCase,
    ManifestError,
    load_manifest,
)
from sessions.gate.result import (
    CaseFinding,
    CaseResult,
    CaseTokens,
    summary_line,
    unusable,
)
from tests.side_files import fifo_without_writer, sparse_file


def _write(folder: Path, text: str) -> Path:
    path = folder / "gate.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _cases(*folders: str) -> str:
    """Explicit [[case]] tables, one per folder's native.h5 and oracle.h5; text after it belongs to the last."""
    return "".join(f'\n[[case]]\nnative = "{f}/native.h5"\noracle = "{f}/oracle.h5"\n' for f in folders)


def _runs(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / "runs" / name).mkdir(parents=True)
        for side in ("native", "oracle"):
            (folder / "runs" / name / f"{side}.h5").write_bytes(b"")


def test_a_glob_names_each_case_by_what_its_wildcard_matched_and_pairs_the_oracle_pattern(tmp_path: Path) -> None:
    _runs(tmp_path, ["img02", "img01"])
    manifest = load_manifest(_write(tmp_path, 'token_budget = 64\nmax_ulp = 2\ncases = "runs/*/native.h5"\noracle = "runs/*/oracle.h5"\n'))
    assert manifest.cases == (
        GateCase("img01", str(tmp_path / "runs/img01/native.h5"), str(tmp_path / "runs/img01/oracle.h5"), CompareOptions(max_ulp=2, max_steps=64, workers=1)),
        GateCase("img02", str(tmp_path / "runs/img02/native.h5"), str(tmp_path / "runs/img02/oracle.h5"), CompareOptions(max_ulp=2, max_steps=64, workers=1)),
    )


def test_a_glob_or_a_path_spelled_with_dot_segments_finds_the_same_cases_and_shares_their_cached_result(tmp_path: Path) -> None:
    """`./runs/*/native.h5` matched nothing (glob drops the "./" the pattern was matched with), and
    `../a/native.h5` from another folder was judged again instead of sharing the result."""
    _runs(tmp_path, ["img01"])
    plain = load_manifest(_write(tmp_path, 'cases = "runs/*/native.h5"\noracle = "runs/*/oracle.h5"\n')).cases
    for spelled in ("./runs/*/native.h5", "runs//*/native.h5", "runs/*/./native.h5"):
        assert load_manifest(_write(tmp_path, f'cases = "{spelled}"\noracle = "./runs/*/oracle.h5"\n')).cases == plain
    (tmp_path / "other").mkdir()
    elsewhere = load_manifest(_write(tmp_path / "other", _cases("../runs/img01"))).cases
    assert elsewhere[0].native == str(tmp_path / "other/../runs/img01/native.h5")
    assert case_key(elsewhere[0]) == case_key(plain[0])


def test_a_dot_dot_after_a_linked_folder_names_the_file_the_os_opens(tmp_path: Path) -> None:
    """Collapsed as text, `link/../runs/...` named the manifest folder's runs, not the runs beside
    the folder the link points to, and `runs/*/../x` lost its wildcard."""
    _runs(tmp_path / "deep", ["img01"])
    (tmp_path / "deep" / "inner").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "deep" / "inner")
    (case,) = load_manifest(_write(tmp_path, _cases("link/../runs/img01"))).cases
    assert os.path.realpath(case.native) == str(tmp_path / "deep/runs/img01/native.h5")
    globbed = load_manifest(_write(tmp_path, 'cases = "deep/runs/*/../img01/native.h5"\noracle = "deep/runs/*/../img01/oracle.h5"\n')).cases
    assert [c.name for c in globbed] == ["img01"]


def test_a_name_a_glob_match_and_a_table_both_take_is_refused_at_the_tables_line_naming_both(tmp_path: Path) -> None:
    """It said "cases 2 and 7", numbers no other message uses, and gave no line."""
    _runs(tmp_path, ["clean", "other"])
    text = 'cases = "runs/*/native.h5"\noracle = "runs/*/oracle.h5"\n\n[[case]]\nname = "clean"\nnative = "runs/other/native.h5"\noracle = "runs/other/oracle.h5"\n'
    with pytest.raises(ManifestError) as refused:
        load_manifest(_write(tmp_path, text))
    assert (refused.value.line, refused.value.problem) == (5, f"the name is used twice (the cases glob's match {tmp_path / 'runs/clean/native.h5'} and case 1); names must be unique")


def test_explicit_cases_take_the_top_level_options_and_override_them_one_by_one(tmp_path: Path) -> None:
    (tmp_path / "my.toml").write_text("")
    manifest = load_manifest(_write(tmp_path, """
token_budget = 64
native_profile = "llama.cpp"

[[case]]
name = "canonical"
native = "a/native.h5"
oracle = "/data/a/oracle.h5"
token_budget = 384
eos = "require"
atol = 0.5
oracle_profile = "my.toml"
align = "positions"

[[case]]
native = "b/native.h5"
oracle = "b/oracle.h5"
"""))
    first, second = manifest.cases
    assert first == GateCase(
        "canonical", str(tmp_path / "a/native.h5"), "/data/a/oracle.h5",
        CompareOptions(atol=0.5, native_profile="llama.cpp", oracle_profile=str(tmp_path / "my.toml"), max_steps=384, alignment="positions", workers=1), EOS_REQUIRE,
    )
    assert second == GateCase("b/native.h5", str(tmp_path / "b/native.h5"), str(tmp_path / "b/oracle.h5"), CompareOptions(native_profile="llama.cpp", max_steps=64, workers=1), EOS_STOP)
    assert second.token_budget == 64


def test_a_tolerance_policy_is_read_from_beside_the_manifest_once_and_a_case_may_name_its_own(tmp_path: Path) -> None:
    (tmp_path / "logits.toml").write_text('[[rule]]\nop = "logits"\nmax_ulp = 1\n')
    (tmp_path / "loose.toml").write_text('[default]\natol = 0.5\n')
    manifest = load_manifest(_write(tmp_path, 'tolerance_policy = "logits.toml"\n' + _cases("a", "b", "c") + 'tolerance_policy = "loose.toml"\n'))
    first, second, third = (case.options.policy for case in manifest.cases)
    assert first is second and first == load_policy(tmp_path / "logits.toml") and first.source == str(tmp_path / "logits.toml")
    assert third == load_policy(tmp_path / "loose.toml")


def test_a_bound_of_0_is_no_bound_as_on_reports_command_line(tmp_path: Path) -> None:
    manifest = load_manifest(_write(tmp_path, "atol = 1.0\nmax_ulp = 0\n" + _cases("a", "b") + "atol = 0.0\nrtol = 0\n"))
    first, second = (case.options for case in manifest.cases)
    assert first.tolerance == CompareOptions(atol=1.0, max_ulp=0).tolerance == Tolerance(atol=1.0)  # what `report --atol 1 --max-ulp 0` builds
    assert second.tolerance == Tolerance() and second.tolerance.is_bit_exact


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("token_budget = 64\nmax_ulp = = 1\n", 2, "not valid TOML: Invalid value"),
        ('max_ulps = 1\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\n', 1, "the top level: unknown key 'max_ulps'; known: cases, oracle, case"),
        ('[[case]]\nnative = "n.h5"\noracle = "o.h5"\n\n[[case]]\nname = "two"\nnative = "n.h5"\n\noracle = "o.h5"\ntoken_budget = -1\n', 10,
         "case 2 ('two'): 'token_budget' must be an integer >= 1, got -1"),
        ('token_budget = 0\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\n', 1, "the top level: 'token_budget' must be an integer >= 1, got 0"),
        ('[[case]]\nname = "x"\nnative = "n.h5"\n', 1, "case 1 ('x'): needs 'oracle', the path of its oracle capture"),
        ('[[case]]\nnative = "n.h5"\noracle = "o.h5"\neos = "always"\n', 4, "'eos' must be one of 'stop', 'require', got 'always'"),
        ('align = "tokens"\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\n', 1, "the top level: 'align' must be one of 'auto', 'calls', 'positions', got 'tokens'"),
        ('[[case]]\nnative = "n.h5"\noracle = "o.h5"\noracle_profile = "llama"\n', 4, "'oracle_profile' is neither a built-in profile"),
        ('cases = "runs/*/native.h5"\noracle = "runs/oracle.h5"\n', 2, "must have the same wildcards in the same order"),
        ('cases = "runs/*/native.h5"\noracle = "runs/*/oracle.h5"\n', 1, "'runs/*/native.h5' matches no file under"),
        ('[[case]]\nname = "a"\nnative = "n.h5"\noracle = "o.h5"\n[[case]]\nname = "a"\nnative = "m.h5"\noracle = "o.h5"\n', 6,
         "case 'a': the name is used twice (case 1 and case 2)"),
        ('tolerance_policy = "missing.toml"\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\n', 1,
         "the top level: 'tolerance_policy' cannot be used ("),
        ('[[case]]\nnative = "n.h5"\noracle = "o.h5"\ntolerance_policy = 3\n', 4, "'tolerance_policy' must be the path of a policy file, got 3"),
        ("token_budget = 4\n", None, "no cases"),
        ('max_ulp = -2\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\nmax_ulp = 1\n', 1, "the top level: 'max_ulp' "),
        ('align = "tokens"\n[[case]]\nnative = "n.h5"\noracle = "o.h5"\nalign = "calls"\n', 1, "the top level: 'align' must be one of"),
        ("x = " + "[" * 50_000 + "]" * 50_000 + "\n", None, "not valid TOML: it nests deeper than a reader follows"),
        ("token_budget = " + "9" * 5000 + "\n", None, "not valid TOML: Exceeds the limit (4300 digits) for integer string conversion"),
    ],
)
def test_a_bad_manifest_is_refused_with_its_file_line_and_what_is_wrong(tmp_path: Path, text: str, line: int | None, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: " if line else f"{path}: ")
    assert message in str(info.value)


def test_the_command_exits_2_on_a_bad_manifest_before_starting_any_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    gate_command.add_arguments(parser)
    path = _write(tmp_path, '[[case]]\nnative = "n.h5"\n')
    assert gate_command.run(parser.parse_args([str(path)])) == 2
    assert capsys.readouterr().err == f"parity-xray gate: bad manifest: {path}:1: case 1: needs 'oracle', the path of its oracle capture\n"


def _case(name: str, word: str, key: str | None = None, rules: tuple[str, ...] = (), kind: str = "diverged") -> CaseResult:
    first = None if key is None else CaseFinding(kind, key, "")
    return CaseResult(name, "n.h5", "o.h5", word, first, [], list(rules), CaseTokens(64, 64, False, None, None), None, EOS_STOP, Tolerance(), None, None)


def test_the_summary_line_counts_passes_then_each_failing_word_with_its_first_keys_then_rules_then_unusable() -> None:
    cases = [_case(f"p{i}", "PARITY") for i in range(38)]
    cases += [_case("d", "DIVERGENCE", "0:visual:17:sdpa"), unusable("u", "n.h5", "o.h5", EOS_STOP, Tolerance(), "gone")]
    assert summary_line(cases) == "38/40 pass; 1 divergence at 0:visual:17:sdpa; 1 unusable"
    cases = [_case(f"d{i}", "DIVERGENCE", f"0:visual:{i % 4}:sdpa") for i in range(6)] + [_case("e", "PARITY", rules=("no shared EOS within 64 token steps",))]
    assert summary_line(cases) == "0/7 pass; 6 divergence at 0:visual:0:sdpa ×2, 0:visual:1:sdpa ×2, 0:visual:2:sdpa and 1 more; 1 no shared EOS (e)"


def test_the_summary_line_names_a_first_findings_kind_where_that_kind_is_not_what_made_the_word() -> None:
    cases = [_case("tokens", "DIVERGENCE", "0:prefill:0:sdpa", kind="dispatch-only"), _case("bits", "DIVERGENCE", "0:prefill:0:ffn_act")]
    cases += [_case("unaligned", "DIVERGENCE", "1:decode:-1:logits", kind="unaligned"), _case("zeros", "SIGNED-ZERO-ONLY", "0:prefill:0:l_out", kind="signed-zero-only")]
    assert summary_line(cases) == (
        "0/4 pass; 3 divergence at 0:prefill:0:sdpa (dispatch-only), 0:prefill:0:ffn_act, 1:decode:-1:logits; 1 signed-zero-only at 0:prefill:0:l_out"
    )


def test_a_manifest_that_is_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    with fifo_without_writer(tmp_path, "gate.toml") as path, pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value) == f"{path}: cannot read the manifest (not a regular file: a FIFO)"


def test_a_manifest_over_its_size_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    path = sparse_file(tmp_path / "gate.toml", MAX_MANIFEST_BYTES + 1)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value) == f"{path}: cannot read the manifest ({MAX_MANIFEST_BYTES + 1} bytes, over the {MAX_MANIFEST_BYTES}-byte limit for this kind of file)"


def test_the_gate_page_links_each_case_page_by_its_url_and_writes_control_characters_as_escapes() -> None:
    from sessions.gate.html_summary import render_gate_html
    from sessions.gate.result import GateResult

    case = _case("evil\x1b[2J", "DIVERGENCE", "0:prefill:0:sdpa")
    case.report = "r#1 cases/evil.html"
    page = render_gate_html(GateResult("gate.toml", "a LocalCluster", None, "2026-12-03T00:00:00", 1.0, [case]))
    assert '<a href="r%231%20cases/evil.html">evil\\x1b[2J</a>' in page and "\x1b" not in page


def test_a_case_page_is_named_by_its_number_and_at_most_120_characters_of_its_name(tmp_path: Path) -> None:
    from sessions.commands.gate import case_pages

    pages = case_pages(str(tmp_path / "out.html"), [_case("x" * 5000, "PARITY"), _case("a b/c", "PARITY")])
    assert [page.name for page in pages] == [f"001-{'x' * 120}.html", "002-a_b_c.html"]
    assert pages[0].parent == tmp_path / "out-cases"

