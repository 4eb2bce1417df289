"""`parity-xray GATE.json`: the gate's cases in a table, coloured like the verdict strip; a case opens its pair.

The gate result is made for real: each case judged by the same code a Dask worker runs
(sessions.gate.judge.iter_judge_case), on the demo captures and on a missing file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from sessions.compare.options import CompareOptions
from sessions.compare.tolerance_policy import load_policy
from sessions.gate.judge import iter_judge_case
from sessions.gate.manifest import GateCase
from sessions.gate.result import GateResult, dumps, load_gate_file, loads
from sessions.investigation.model import SavedTolerance
from sessions.progress import run_to_end
from sessions.report.word_colours import WORD_COLOURS
from tests.hand_captures import T, write_capture
from tests.side_files import fifo_without_writer
from viewer.app import window_for
from viewer.cli import main
from viewer.gate.gate_window import COLUMNS, GateWindow
from viewer.settings import ViewerSettings

pytestmark = [pytest.mark.slow, pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints", "This plugin does not support raise")]

WAIT_MS = 120_000


@pytest.fixture(scope="module")
def gate_file(demo_pairs: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = [GateCase(name, str(demo_pairs[name][0]), str(demo_pairs[name][1]), CompareOptions(max_steps=64)) for name in ("clean", "swiglu-order")]
    cases.append(GateCase("missing", str(demo_pairs["clean"][0].with_name("gone.h5")), str(demo_pairs["clean"][1]), CompareOptions()))
    results = [run_to_end(iter_judge_case(case)).result for case in cases]
    path = tmp_path_factory.mktemp("gate") / "gate.json"
    path.write_text(dumps(GateResult("gate.toml", "this process", None, "2026-07-15T00:00:00+00:00", 1.0, results)))
    return path


def test_the_table_shows_each_case_with_its_word_in_the_verdict_strips_colour(qtbot: QtBot, gate_file: Path, tmp_path: Path) -> None:
    window = GateWindow(load_gate_file(gate_file), ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    rows = [[window.table.item(r, c).text() for c in range(len(COLUMNS))] for r in range(window.table.rowCount())]
    assert [row[:6] for row in rows] == [
        ["clean", "PARITY", "FAIL", "", "7/64", "not reached"],
        ["swiglu-order", "DIVERGENCE", "FAIL", "0:text-before:0:ffn_act (diverged)", "7/64", "not reached"],
        ["missing", "UNUSABLE", "FAIL", "", "", ""],
    ]
    assert rows[0][7] == "short of the token budget: 7 of 64 token steps captured and no shared EOS"
    assert rows[1][6] == "0:text-before:1:ffn_down"
    assert rows[2][7].endswith("gone.h5: file: does not exist")
    colours = [window.table.item(r, COLUMNS.index("verdict")).background().color().name() for r in range(3)]
    assert colours == [WORD_COLOURS["PARITY"], WORD_COLOURS["DIVERGENCE"], WORD_COLOURS["UNUSABLE"]]
    assert window.headline.text() == "<b>0/3 pass; 1 divergence at 0:text-before:0:ffn_act; 2 short of the token budget (clean, swiglu-order); 1 unusable</b> (exit 2)"


def test_enter_and_double_click_open_the_cases_pair_in_a_main_window(qtbot: QtBot, gate_file: Path, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    window = GateWindow(load_gate_file(gate_file), ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.table.selectRow(1)
    window.table.setFocus()
    qtbot.keyClick(window.table, Qt.Key.Key_Return)
    assert len(window.opened) == 1
    opened = window.opened[0]
    qtbot.waitUntil(lambda: opened.model.comparison is not None and not opened.tasks.busy, timeout=WAIT_MS)
    assert (opened.model.native.path, opened.model.oracle.path) == demo_pairs["swiglu-order"]
    assert opened.model.comparison.comparison.verdict.word == "DIVERGENCE"
    rect = window.table.visualRect(window.table.model().index(0, 0))
    qtbot.mouseClick(window.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # a double-click starts with a press
    qtbot.mouseDClick(window.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert len(window.opened) == 2
    qtbot.waitUntil(lambda: window.opened[1].model.native is not None, timeout=WAIT_MS)
    assert window.opened[1].model.native.path == demo_pairs["clean"][0]
    # Closed only when idle: a main window closed mid-comparison waits out its tasks' 30 s (viewer.workers).
    qtbot.waitUntil(lambda: not window.opened[1].tasks.busy, timeout=WAIT_MS)
    for case_window in list(window.opened):
        case_window.close()


def test_a_case_opens_compared_as_the_gate_judged_it_with_the_gates_judgment_in_a_banner(
    qtbot: QtBot, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Opened with the viewer's defaults, a case the gate passed under a policy read SIGNED-ZERO-ONLY
    beside "tolerance: bit-exact", and one judged over 2 token steps counted every step's diverged ops."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[default]\nmax_ulp = 1\n")
    native, oracle = (str(p) for p in demo_pairs["signed-zero"])
    cases = [
        GateCase("signed-zero", native, oracle, CompareOptions(policy=load_policy(policy))),
        GateCase("attention-2", *(str(p) for p in demo_pairs["attention-contract"]), CompareOptions(max_steps=2)),
    ]
    gate = GateResult("gate.toml", "this process", None, "2026-12-05T00:00:00+00:00", 1.0, [run_to_end(iter_judge_case(case)).result for case in cases])
    window = GateWindow(gate, ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    for row, case in enumerate(gate.cases):
        opened = window.open_case(row)
        assert opened is not None
        qtbot.waitUntil(lambda opened=opened: opened.model.comparison is not None and not opened.tasks.busy, timeout=WAIT_MS)
        shown = opened.model.comparison.comparison
        assert (shown.verdict.word, shown.verdict.reasons, shown.tokens.compared_steps) == (case.word, case.reasons, case.tokens.compared)
        [banner] = opened.banners.banners("gate")
        assert banner.label.text().startswith(f"Gate case {case.name}: {case.word}, {'pass' if case.passed else 'FAIL'}")
    assert gate.cases[0].word == "PARITY" and opened.banners.banners("gate")[0].label.text().endswith("; judged over the first 2 token steps, and compared so here.")
    qtbot.waitUntil(lambda: not any(w.tasks.busy for w in window.opened), timeout=WAIT_MS)
    for case_window in list(window.opened):
        assert not case_window.session_file.worth_keeping(), "the gate's options are no work of the user's to save"
    policy_window = window.opened[0]
    dialog = policy_window.edit_tolerance()
    assert dialog.policy.text() == str(policy.resolve()), "the dialog shows the tolerance in force"
    dialog.close()
    policy_window.session_sync.set_tolerance(SavedTolerance(), None)  # the user chooses bit-exact
    qtbot.waitUntil(lambda: not policy_window.tasks.busy and policy_window.model.comparison.comparison.tolerance_policy == "", timeout=WAIT_MS)
    assert policy_window.model.comparison.comparison.verdict.word == "SIGNED-ZERO-ONLY"
    budget_window = window.opened[1]
    budget_window.open_pair(*demo_pairs["swiglu-order"])
    qtbot.waitUntil(lambda: budget_window.model.native.path == demo_pairs["swiglu-order"][0] and budget_window.model.comparison is not None and not budget_window.tasks.busy, timeout=WAIT_MS)
    assert budget_window.model.comparison.comparison.tokens.compared_steps == 7 and not budget_window.banners.banners("gate"), "another pair is no gate case"
    for case_window in list(window.opened):
        case_window.close()


def test_parity_xray_gate_json_opens_the_gate_window_and_a_report_json_is_refused(
    qtbot: QtBot, gate_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window = window_for([str(gate_file), "--settings", str(tmp_path / "viewer.ini")])
    assert isinstance(window, GateWindow)
    qtbot.addWidget(window)
    assert window.table.rowCount() == len(load_gate_file(gate_file).cases)
    report = tmp_path / "report.json"
    report.write_text('{"format": "parity-xray-report", "version": 4}')
    assert window_for([str(report)]) == 2
    assert capsys.readouterr().err == f"parity-xray: {report}: not a gate result: not a parity-xray-gate version 1 document\n"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d["cases"][0].update(name=5), "malformed gate document (TypeError: gate.cases[0].name is int, not str)"),
        (lambda d: d["cases"][0].update(rule_failures=[1, 2]), "malformed gate document (TypeError: gate.cases[0].rule_failures[0] is int, not str)"),
        (lambda d: d["cases"][0].update(reasons="abc"), "malformed gate document (TypeError: gate.cases[0].reasons is str, not a list)"),
        (lambda d: d["cases"][0].update(word="<b>PWNED</b>"), "malformed gate document (a case's word is '<b>PWNED</b>', not one of PARITY, "),
        # Inside a field that may be null: the message named the union, not the field.
        (
            lambda d: d["cases"][0].update(tokens={"compared": "x", "budget": None, "eos_reached": False, "eos_step": None, "first_divergence_step": None}),
            "malformed gate document (TypeError: gate.cases[0].tokens.compared is str, not int)",
        ),
    ],
)
def test_a_gate_result_of_the_wrong_types_is_refused_by_place_not_shown(
    gate_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, problem: str  # type: ignore[no-untyped-def]
) -> None:
    document = json.loads(gate_file.read_text())
    edit(document)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(document))
    assert window_for([str(forged), "--settings", str(tmp_path / "viewer.ini")]) == 2
    assert capsys.readouterr().err.startswith(f"parity-xray: {forged}: not a gate result: {problem}")


def test_a_gate_result_too_deep_for_a_reader_or_a_fifo_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert window_for([str(deep)]) == 2
    assert capsys.readouterr().err == f"parity-xray: {deep}: not a gate result: not JSON (it nests deeper than a reader follows)\n"
    with fifo_without_writer(tmp_path, "gate.json") as fifo:
        assert window_for([str(fifo)]) == 2
    assert capsys.readouterr().err == f"parity-xray: {fifo}: not a gate result: cannot read it (not a regular file: a FIFO)\n"


def test_a_first_finding_key_holding_markup_shows_as_text_in_the_gate_headline(qtbot: QtBot, gate_file: Path, tmp_path: Path) -> None:
    document = json.loads(gate_file.read_text())
    failing = next(case for case in document["cases"] if case["first"] is not None)
    failing["first"]["key"] = "0:<h1>seg</h1>:0:layer_out"
    forged = tmp_path / "markup.json"
    forged.write_text(json.dumps(document))
    window = window_for([str(forged), "--settings", str(tmp_path / "viewer.ini")])
    assert isinstance(window, GateWindow)
    qtbot.addWidget(window)
    assert "0:&lt;h1&gt;seg&lt;/h1&gt;:0:layer_out" in window.headline.text() and "<h1>" not in window.headline.text()


def _luminance(colour: str) -> float:
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def test_every_verdict_word_has_one_colour_on_every_surface_and_its_white_text_reads_at_4_5_to_1() -> None:
    from sessions.gate.html_summary import GATE_STYLE, word_class

    for word, colour in WORD_COLOURS.items():
        assert f".{word_class(word)} {{ background: {colour}; }}" in GATE_STYLE, word
        assert (1.05 / (_luminance(colour) + 0.05)) >= 4.5, f"{word}: white on {colour}"


def test_a_case_judged_with_its_own_profile_file_opens_compared_with_that_file(qtbot: QtBot, tmp_path: Path) -> None:
    """Only a built-in profile was passed on: a case the gate passed under its own profile (ffn_norm
    one-sided by design) opened as DIVERGENCE, under a banner saying the gate's PARITY."""
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    native = write_capture(tmp_path / "n.h5", "native", [T("attn_norm", x, layer=0), T("ffn_norm", x, layer=0)])
    oracle = write_capture(tmp_path / "o.h5", "oracle", [T("attn_norm", x, layer=0)])
    profile = tmp_path / "mine.toml"
    profile.write_text('name = "mine"\n[[rule]]\nname = "attn_norm"\nop = "attn_norm"\n[[rule]]\nname = "ffn_norm"\nop = "ffn_norm"\none_sided = "the oracle fuses it"\n')
    case = GateCase("mine", str(native), str(oracle), CompareOptions(native_profile=str(profile), oracle_profile=str(profile)))
    judged = GateResult("gate.toml", "this process", None, "2026-12-05T00:00:00+00:00", 1.0, [run_to_end(iter_judge_case(case)).result])
    assert (judged.cases[0].word, judged.cases[0].native_profile_file) == ("PARITY", str(profile))
    window = GateWindow(loads(dumps(judged)), ViewerSettings(tmp_path / "viewer.ini"))  # as opened from its GATE.json
    qtbot.addWidget(window)
    opened = window.open_case(0)
    assert opened is not None
    qtbot.waitUntil(lambda: opened.model.comparison is not None and not opened.tasks.busy, timeout=WAIT_MS)
    assert opened.model.comparison.comparison.verdict.word == "PARITY"
    opened.close()


def test_a_session_saved_from_a_case_window_keeps_the_gates_tolerance_and_says_it_drops_the_token_budget(
    qtbot: QtBot, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saved without them, the session of a case the gate passed under max_ulp = 1 said
    SIGNED-ZERO-ONLY when reopened or given to `report --session`."""
    native, oracle = (str(p) for p in demo_pairs["signed-zero"])
    cases = [GateCase("ulp", native, oracle, CompareOptions(max_ulp=1)), GateCase("budget", native, oracle, CompareOptions(max_ulp=1, max_steps=2))]
    gate = GateResult("gate.toml", "this process", None, "2026-12-05T00:00:00+00:00", 1.0, [run_to_end(iter_judge_case(case)).result for case in cases])
    assert [case.word for case in gate.cases] == ["PARITY", "PARITY"]
    window = GateWindow(gate, ViewerSettings(tmp_path / "viewer.ini"))
    qtbot.addWidget(window)
    for row in range(2):
        opened = window.open_case(row)
        assert opened is not None
        qtbot.waitUntil(lambda opened=opened: opened.model.comparison is not None and not opened.tasks.busy, timeout=WAIT_MS)
        saved = tmp_path / f"case{row}.xray"
        opened.session_file.choose_path = lambda _purpose, saved=saved: saved
        assert opened.session_file.save_as()
        assert main(["report", "--session", str(saved)]) == 0, "the tolerance the gate judged the case by"
        assert capsys.readouterr().out.startswith("PARITY")
        said = "The session keeps the gate's tolerance and pairing, not its token budget: reopened, it compares every step, not the first 2."
        if row == 1:
            qtbot.waitUntil(lambda opened=opened: said in opened.banners.texts("gate"))
        assert [b.text for b in opened.banners.banners("gate")][1:] == ([] if row == 0 else [said])
        opened.close()
