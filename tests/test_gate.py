"""`parity-xray gate` on real Dask clusters over the real demo captures.

A LocalCluster started by the gate itself, and a cluster started here as separate `dask
scheduler` and `dask worker` processes on loopback (as on a real cluster, the gate only gets
its address). Every case's verdict is checked against `report`'s (`iter_compare`, in this
process) and against the scenario's documented verdict. Failures are made for real: a
worker process is SIGKILLed while its case's comparison is held still (SIGSTOP), a comparing
child gets the SIGSEGV a crafted file would give libhdf5, and the gate is interrupted with a
real SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html import escape
from pathlib import Path

import h5py
import pytest
from distributed import Client

from backends.engines.demo_scenarios import SCENARIOS
from sessions.capture.opening import open_capture
from sessions.child_env import child_env
from sessions.commands import cache as cache_command
from sessions.commands import gate as gate_command
from sessions.commands import report as report_command
from sessions.compare.comparison import iter_compare
from sessions.compare.options import CompareOptions
from sessions.compare.verdict import PARITY, UNUSABLE, Verdict
from sessions.gate.cluster import CONNECT_TIMEOUT_S
from sessions.gate.judge import iter_judge_case
from sessions.gate.manifest import GateCase
from sessions.gate.result import CaseResult, GateResult, dumps, load_gate_file, loads
from sessions.machine import WORKERS_PER_CORE, usable_cores
from sessions.progress import run_to_end
from viewer.cli import main as report_main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DASK = Path(sys.executable).with_name("dask")
IN_CHILD = b"sessions.compare.in_child"


@pytest.fixture(scope="module")
def report_verdicts(demo_pairs: dict[str, tuple[Path, Path]]) -> dict[str, Verdict]:
    """What `report` says about each demo scenario: iter_compare's verdict, computed here."""
    verdicts = {}
    for name, (native, oracle) in demo_pairs.items():
        with open_capture(native) as n, open_capture(oracle) as o:
            verdicts[name] = run_to_end(iter_compare(n, o)).verdict
    return verdicts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `dask scheduler` and a `dask worker` (two worker processes, one thread each) on loopback.

    The scheduler's own settings: a task fails the first time a worker dies under it
    (allowed-failures 0), so the worker-kill test needs one kill, not four; and when a gate has
    more cases than twice the threads, the scheduler queues them and a worker holds only the
    task it runs (worker-saturation 1.0), so its death takes no other case with it."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(child_env(), DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0", DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION="1.0")
    scratch = tmp_path_factory.mktemp("dask")
    logs = [open(scratch / name, "wb") for name in ("scheduler.log", "worker.log")]  # noqa: SIM115  (closed at teardown)
    scheduler = subprocess.Popen(
        [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", f"127.0.0.1:{_free_port()}"],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [str(DASK), "worker", address, "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(scratch)],
        env=env, stdout=logs[1], stderr=subprocess.STDOUT,
    )
    try:
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for process in (worker, scheduler):
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def _gate(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    gate_command.add_arguments(parser)
    return gate_command.run(parser.parse_args(list(argv)))


def _cache(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cache_command.add_arguments(parser)
    return cache_command.run(parser.parse_args(list(argv)))


def _runs(tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]) -> None:
    """The demo folder as `runs/` beside the manifest, so the manifest's paths are relative."""
    (tmp_path / "runs").symlink_to(demo_pairs["clean"][0].parent, target_is_directory=True)


def _case(gate: GateResult, name: str) -> CaseResult:
    return next(c for c in gate.cases if c.name == name)


def _matches_report(gate: GateResult, report_verdicts: dict[str, Verdict]) -> None:
    for name, verdict in report_verdicts.items():
        case = _case(gate, name)
        expected = SCENARIOS[name].expected
        assert case.word == verdict.word == expected.word, name
        found = None if case.first is None else (case.first.kind, case.first.key)
        assert found == (None if verdict.first is None else (str(verdict.first.kind), verdict.first.key.text())), name
        assert found == (None if expected.kind is None else (str(expected.kind), expected.key.text() if expected.key else None)), name


GLOB = 'cases = "runs/*.native.h5"\noracle = "runs/*.oracle.h5"\n'
EOS_CASES = """
[[case]]
name = "clean, EOS required within 64"
native = "runs/clean.native.h5"
oracle = "runs/clean.oracle.h5"
token_budget = 64
eos = "require"

[[case]]
name = "post-eos, EOS required within 64"
native = "runs/post-eos.native.h5"
oracle = "runs/post-eos.oracle.h5"
token_budget = 64
eos = "require"
"""


def test_a_gate_with_a_tolerance_policy_judges_each_case_as_report_with_that_policy_does(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    _runs(tmp_path, demo_pairs)
    policy = tmp_path / "policy.toml"
    policy.write_text("[default]\nmax_ulp = 100000\n")
    manifest = tmp_path / "gate.toml"
    manifest.write_text(f'tolerance_policy = "policy.toml"\n{GLOB}')
    _gate(str(manifest), "--workers", "1", "--no-cache", "--json", str(tmp_path / "gate.json"))
    capsys.readouterr()
    gate = load_gate_file(tmp_path / "gate.json")
    for name in ("swiglu-order", "signed-zero", "clean"):
        native, oracle = demo_pairs[name]
        parser = argparse.ArgumentParser()
        report_command.add_arguments(parser)
        code = report_command.run(parser.parse_args([str(native), str(oracle), "--tolerance-policy", str(policy)]))
        headline = capsys.readouterr().out.splitlines()[0]
        case = _case(gate, name)
        assert headline.startswith(f"{case.word}: ") and code == case.exit_code, name
        assert case.tolerance_policy == str(policy.resolve()), name
    assert _case(gate, "swiglu-order").word == "PARITY", "the policy's bounds took the 2-ULP swiglu difference in"


def test_a_local_gate_judges_every_scenario_as_report_does_and_writes_json_and_html(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], report_verdicts: dict[str, Verdict], capsys: pytest.CaptureFixture[str]
) -> None:
    _runs(tmp_path, demo_pairs)
    manifest = tmp_path / "gate.toml"
    manifest.write_text(GLOB + EOS_CASES)
    (tmp_path / "out").mkdir()
    assert _gate(str(manifest), "--workers", "2", "--json", str(tmp_path / "gate.json"), "--html", str(tmp_path / "out" / "gate.html")) == 1
    out = capsys.readouterr().out
    gate = load_gate_file(tmp_path / "gate.json")
    assert out.startswith("judging 8 case(s) on a LocalCluster of 2 worker process(es) at tcp://127.0.0.1:")
    assert [line.split("]")[0] for line in out.splitlines() if line.startswith("[")] == [f"[{i}/8" for i in range(1, 9)]
    _matches_report(gate, report_verdicts)
    assert [c.name for c in gate.cases][:6] == sorted(report_verdicts)
    clean_eos, post_eos = _case(gate, "clean, EOS required within 64"), _case(gate, "post-eos, EOS required within 64")
    assert (clean_eos.word, clean_eos.passed, clean_eos.tokens.compared, clean_eos.tokens.eos_reached) == ("PARITY", False, 7, False)
    assert clean_eos.rule_failures == [
        'no shared EOS within the 7 token steps compared (eos = "require")',
        "short of the token budget: 7 of 64 token steps captured and no shared EOS",
    ]
    assert (post_eos.word, post_eos.passed, post_eos.tokens.compared, post_eos.tokens.eos_step, post_eos.rule_failures) == ("PARITY", True, 4, 3, [])
    assert _case(gate, "swiglu-order").worst_op.key == "0:text-before:1:ffn_down"
    summary = (
        "3/8 pass; 1 contract mismatch at 0:visual:0:sdpa; 1 divergence at 0:text-before:0:ffn_act; "
        "1 signed-zero-only at 0:text-before:0:ffn_act; 1 dispatch-only at 0:text-after:0:sdpa; "
        "1 no shared EOS (clean, EOS required within 64); 1 short of the token budget (clean, EOS required within 64)"
    )
    assert gate.headline == summary and out.endswith(f"\n{summary}\n")
    assert json.loads((tmp_path / "gate.json").read_text())["counts"] == {"cases": 8, "passed": 3, "failed": 5, "unusable": 0, "reused": 0}
    page = (tmp_path / "out" / "gate.html").read_text()
    assert summary in page
    for case in gate.cases:
        assert case.report is not None and f'href="{case.report}"' in page
        report = (tmp_path / "out" / case.report).read_text()
        assert escape(report_verdicts[case.name.split(",")[0]].headline) in report
        assert escape(case.judgment(named=False)) in report, "a case the gate fails by a rule is not read as its comparison's PARITY"
    assert clean_eos.judgment() == (
        'Gate case clean, EOS required within 64: PARITY, FAIL (no shared EOS within the 7 token steps compared (eos = "require"); '
        "short of the token budget: 7 of 64 token steps captured and no shared EOS); judged over the first 64 token steps"
    )


def test_an_output_naming_the_manifest_or_a_case_capture_is_refused_before_anything_is_judged(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    _runs(tmp_path, demo_pairs)
    manifest = tmp_path / "gate.toml"
    manifest.write_text(GLOB)
    assert _gate(str(manifest), "--json", str(manifest)) == 2
    assert f"--json {manifest} is the manifest: an output never replaces an input" in capsys.readouterr().err
    assert manifest.read_text() == GLOB
    oracle = demo_pairs["clean"][1]
    assert _gate(str(manifest), "--html", str(tmp_path / "runs" / oracle.name)) == 2
    assert "is the oracle capture of case 'clean'" in capsys.readouterr().err
    assert _gate(str(manifest), "--json", str(tmp_path / "out.html"), "--html", str(tmp_path / "out.html")) == 2
    assert f"--json and --html both name {tmp_path / 'out.html'}: each output needs a file of its own" in capsys.readouterr().err
    (tmp_path / "y-cases").mkdir()
    capture = tmp_path / "y-cases" / "001-a.html"  # where the report of the first case, 'a', would go
    shutil.copy(demo_pairs["clean"][0], capture)
    one_case = tmp_path / "one.toml"
    one_case.write_text(f'[[case]]\nname = "a"\nnative = "{capture}"\noracle = "{demo_pairs["clean"][1]}"\n')
    assert _gate(str(one_case), "--html", str(tmp_path / "y.html")) == 2
    assert f"the report of case 'a' {capture} is the native capture of case 'a'" in capsys.readouterr().err
    assert capture.read_bytes() == demo_pairs["clean"][0].read_bytes()
    assert _gate(str(manifest), "--html", str(tmp_path / "absent" / "g.html")) == 2, "a folder made where none was"
    assert f"--html {tmp_path / 'absent' / 'g.html'} is in {tmp_path / 'absent'}, which does not exist" in capsys.readouterr().err
    (tmp_path / "s-cases").write_text("a file where the cases' folder goes")
    assert _gate(str(manifest), "--html", str(tmp_path / "s.html")) == 2, "refused after every case was judged"
    said = capsys.readouterr()
    assert "judging" not in said.out and f"its cases' reports go in {tmp_path / 's-cases'}, where something other than a folder is" in said.err
    (tmp_path / "d-cases").symlink_to(tmp_path / "nowhere")
    assert _gate(str(manifest), "--html", str(tmp_path / "d.html")) == 2, "a dangling link where the cases' folder goes: refused after judging"
    said = capsys.readouterr()
    assert "judging" not in said.out and f"its cases' reports go in {tmp_path / 'd-cases'}, where something other than a folder is" in said.err
    for html in (".", "/"):
        assert _gate(str(manifest), "--html", html) == 2, "a folder: a traceback after every case was judged"
        assert capsys.readouterr().err.startswith(f"parity-xray gate: --html {html} ")
    assert _gate(str(manifest), "--html", str(tmp_path / "g.html"), "--json", str(tmp_path / "g-cases")) == 2
    said = capsys.readouterr()
    assert "judging" not in said.out and f"--json {tmp_path / 'g-cases'} is where --html {tmp_path / 'g.html'} puts its cases' reports" in said.err
    policy, profile = tmp_path / "policy.toml", tmp_path / "mine.toml"
    policy.write_text("[default]\nmax_ulp = 2\n")
    profile.write_text("# a profile\n")
    case = demo_pairs["clean"]
    (tmp_path / "own.toml").write_text(f'[[case]]\nname = "c"\nnative = "{case[0]}"\noracle = "{case[1]}"\ntolerance_policy = "policy.toml"\nnative_profile = "mine.toml"\n')
    for option, path, what in (("--json", policy, "tolerance policy"), ("--html", profile, "native profile")):
        assert _gate(str(tmp_path / "own.toml"), option, str(path)) == 2
        assert f"{option} {path} is the {what} of case 'c': an output never replaces an input" in capsys.readouterr().err
    assert policy.read_text() == "[default]\nmax_ulp = 2\n" and profile.read_text() == "# a profile\n"


def test_more_local_workers_than_the_cores_can_run_is_refused_before_a_cluster_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gate.toml").write_text(GLOB)
    cores = usable_cores()
    too_many = WORKERS_PER_CORE * cores + 1
    assert _gate(str(tmp_path / "gate.toml"), "--workers", str(too_many)) == 2
    assert capsys.readouterr().err == (
        f"parity-xray gate: --workers {too_many} is more than {WORKERS_PER_CORE} per core here ({cores} cores): the processes would only take turns on them\n"
    )


@pytest.mark.parametrize(("answer", "problem"), [
    (None, f"TimeoutError: nothing there answered as a Dask scheduler within {CONNECT_TIMEOUT_S} s (is it the dashboard's port?)"),
    (b"SSH-2.0-OpenSSH_9.6p1\r\n", "it answered something other than Dask's protocol"),
])  # fmt: skip
def test_a_scheduler_address_where_something_else_listens_is_one_line_and_exit_2(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str], answer: bytes | None, problem: str
) -> None:
    """The dashboard's port given for the scheduler's held the gate for ever; an SSH server's banner,
    read as a message's length, asked for 2.8 EiB of memory."""
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    peer, _ = listener.accept()
                    if answer is not None:
                        peer.sendall(answer)

        threading.Thread(target=serve, daemon=True).start()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        assert _gate(str(tmp_path / "gate.toml"), "--scheduler", address) == 2
    assert capsys.readouterr().err == f"parity-xray gate: cannot use the scheduler at {address}: {problem}\n"


@pytest.mark.parametrize(("address", "problem"), [("notaurl", "missing port number"), ("foo://127.0.0.1:8786", "unknown address scheme 'foo'")])
def test_a_scheduler_address_dask_cannot_parse_is_one_line_and_exit_2(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str], address: str, problem: str
) -> None:
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    assert _gate(str(tmp_path / "gate.toml"), "--scheduler", address) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"parity-xray gate: cannot use the scheduler at {address}: ValueError: ") and problem in err
    assert "Traceback" not in err


def test_a_gate_on_a_separately_started_cluster_judges_as_report_does(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], report_verdicts: dict[str, Verdict], cluster: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))  # judged on the cluster, not reused from another test's gate of these captures
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    assert _gate(str(tmp_path / "gate.toml"), "--scheduler", cluster, "--json", str(tmp_path / "gate.json")) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"judging 6 case(s) on the cluster at {cluster} (2 worker(s))\nDask dashboard: http://127.0.0.1:")
    gate = load_gate_file(tmp_path / "gate.json")
    _matches_report(gate, report_verdicts)
    with Client(cluster, timeout=30) as client:
        assert {c.worker for c in gate.cases} <= set(client.scheduler_info(n_workers=-1)["workers"])
    assert not any(c.reused for c in gate.cases)


def _flip_a_tensor_in_place(path: Path) -> None:
    """Change the first record's bytes, and nothing else: the file's size, root attributes and index stay."""
    with open_capture(path) as capture:
        record = capture.records[0]
    assert record.packed
    with h5py.File(path, "r+") as f:
        pack = f[record.path]
        pack[record.offset : record.offset + record.nbytes] = pack[record.offset : record.offset + record.nbytes] ^ 1


def test_a_rerun_reuses_unchanged_cases_and_judges_a_changed_capture_again(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], cluster: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("clean", "swiglu-order"):
        (tmp_path / name).mkdir()
        for side, path in zip(("native", "oracle"), demo_pairs[name], strict=True):
            shutil.copy(path, tmp_path / name / f"{side}.h5")
    (tmp_path / "gate.toml").write_text('cases = "*/native.h5"\noracle = "*/oracle.h5"\n')

    def gate() -> GateResult:
        _gate(str(tmp_path / "gate.toml"), "--scheduler", cluster, "--json", str(tmp_path / "gate.json"))
        capsys.readouterr()
        return load_gate_file(tmp_path / "gate.json")

    first = gate()
    assert [(c.name, c.word, c.reused) for c in first.cases] == [("clean", "PARITY", False), ("swiglu-order", "DIVERGENCE", False)]
    again = gate()
    assert [(c.word, c.reused, c.seconds) for c in again.cases] == [(c.word, True, c.seconds) for c in first.cases]
    size = (tmp_path / "clean" / "native.h5").stat().st_size
    _flip_a_tensor_in_place(tmp_path / "clean" / "native.h5")
    assert (tmp_path / "clean" / "native.h5").stat().st_size == size
    os.utime(tmp_path / "swiglu-order" / "native.h5")  # a touch: new mtime and ctime, the same content
    changed = gate()
    assert [(c.name, c.word, c.reused) for c in changed.cases] == [("clean", "DIVERGENCE", False), ("swiglu-order", "DIVERGENCE", False)]
    assert [c.reused for c in gate().cases] == [True, True]
    assert _cache() == 0
    assert "  judged gate cases: 2 entries, " in capsys.readouterr().out.splitlines()[4]
    assert _cache("--clear") == 0
    assert capsys.readouterr().out.splitlines()[4].startswith("  judged gate cases: removed 2 entries (")
    assert [c.reused for c in gate().cases] == [False, False]


def test_a_case_whose_capture_became_unusable_since_the_last_gate_links_to_no_report(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], cluster: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page cached from the run before stayed: the UNUSABLE row linked to "Gate: PARITY, pass"."""
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))
    for side, path in zip(("native", "oracle"), demo_pairs["clean"], strict=True):
        shutil.copy(path, tmp_path / f"{side}.h5")
    (tmp_path / "gate.toml").write_text('[[case]]\nname = "t"\nnative = "native.h5"\noracle = "oracle.h5"\n')

    def gate() -> GateResult:
        _gate(str(tmp_path / "gate.toml"), "--scheduler", cluster, "--json", str(tmp_path / "g.json"), "--html", str(tmp_path / "g.html"))
        capsys.readouterr()
        return load_gate_file(tmp_path / "g.json")

    assert [(c.word, c.report) for c in gate().cases] == [("PARITY", "g-cases/001-t.html")]
    (tmp_path / "native.h5").write_bytes((tmp_path / "native.h5").read_bytes()[:3000])
    assert [(c.word, c.report) for c in gate().cases] == [(UNUSABLE, None)]
    assert "g-cases/001-t.html" not in (tmp_path / "g.html").read_text()


def _process_with(*parts: bytes) -> int | None:
    """A live process whose command line names all of `parts`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if all(p in cmdline for p in parts):
                return int(entry.name)
    return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _wait_for_child(path: Path, timeout_s: float = 60.0) -> int:
    """The comparing child of the case whose native capture is `path`, as soon as it starts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _process_with(IN_CHILD, str(path).encode())
        if pid is not None:
            return pid
        time.sleep(0.01)
    raise AssertionError(f"no comparison of {path} started")


def test_a_killed_worker_and_a_crashing_reader_make_their_cases_unusable_and_the_gate_goes_on(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = (("doomed", "clean"), ("crashing", "swiglu-order"), ("head-chunk", "head-chunk"), ("signed-zero", "signed-zero"), ("post-eos", "post-eos"))
    for name, source in cases:  # five cases on two threads: queued on the scheduler (see the cluster fixture)
        (tmp_path / name).mkdir()
        for side, path in zip(("native", "oracle"), demo_pairs[source], strict=True):
            (tmp_path / name / f"{side}.h5").symlink_to(path)  # a path naming the case, for finding its comparing child
    (tmp_path / "gate.toml").write_text('cases = "*/native.h5"\noracle = "*/oracle.h5"\n')
    held: list[int] = []

    def kill_the_worker() -> None:
        child = _wait_for_child(tmp_path / "doomed" / "native.h5")
        os.kill(child, signal.SIGSTOP)  # hold the comparison still, so the worker dies mid-case
        held.append(child)
        os.kill(_parent(child), signal.SIGKILL)

    def crash_the_reader() -> None:
        os.kill(_wait_for_child(tmp_path / "crashing" / "native.h5"), signal.SIGSEGV)

    saboteurs = [threading.Thread(target=kill_the_worker), threading.Thread(target=crash_the_reader)]
    for thread in saboteurs:
        thread.start()
    try:
        # Not from the cache: the links name the demo captures, whose verdicts earlier tests keep there.
        code = _gate(str(tmp_path / "gate.toml"), "--scheduler", cluster, "--json", str(tmp_path / "gate.json"), "--no-cache")
    finally:
        for thread in saboteurs:
            thread.join()
        for pid in held:
            os.kill(pid, signal.SIGKILL)  # the dead worker's orphan, still stopped
    out = capsys.readouterr().out
    gate = load_gate_file(tmp_path / "gate.json")
    assert code == 2 and gate.exit_code == 2
    doomed, crashing = _case(gate, "doomed"), _case(gate, "crashing")
    assert doomed.word == UNUSABLE and doomed.reasons[0].startswith("the Dask worker judging it died (")
    assert crashing.word == UNUSABLE and "crashed the comparing process (SIGSEGV)" in crashing.reasons[0]
    assert [(c.name, c.word) for c in gate.cases if c.word != UNUSABLE] == [("head-chunk", "DISPATCH-ONLY"), ("post-eos", "PARITY"), ("signed-zero", "SIGNED-ZERO-ONLY")]
    assert out.endswith("\n1/5 pass; 1 signed-zero-only at 0:text-before:0:ffn_act; 1 dispatch-only at 0:text-after:0:sdpa; 2 unusable\n")
    with Client(cluster, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)  # the killed worker's nanny starts a new one


@pytest.mark.parametrize(
    ("profile", "problem"),
    [("missing.toml", "profile file does not exist"), ("broken.toml", "not valid TOML (Expected ']' at the end of a table declaration")],
)
def test_an_unusable_profile_makes_the_case_unusable_with_the_reason_report_gives(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str], profile: str, problem: str
) -> None:
    (tmp_path / "broken.toml").write_text("[profile\n")
    native, oracle = demo_pairs["signed-zero"]
    case = GateCase("signed-zero", str(native), str(oracle), CompareOptions(native_profile=str(tmp_path / profile)))
    result = run_to_end(iter_judge_case(case)).result
    assert result.word == UNUSABLE and len(result.reasons) == 1 and result.reasons[0].startswith(f"{tmp_path / profile}: {problem}")
    assert report_main(["report", str(native), str(oracle), "--native-profile", str(tmp_path / profile)]) == 2
    assert capsys.readouterr().err.strip() == f"parity-xray report: unusable input: {result.reasons[0]}"


@pytest.mark.parametrize(("stop", "code", "said"), [(signal.SIGINT, 130, "cancelled"), (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_or_sigterm_stops_the_running_comparisons_and_leaves_nothing_on_the_cluster(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], cluster: str, python_ctrl_c: None, stop: int, code: int, said: str
) -> None:
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    (tmp_path / "gate.json").write_text('{"format": "parity-xray-gate", "version": 1, "cases": []}')  # an earlier gate's, which a CI step must not take for this one's
    gate = subprocess.Popen(
        [sys.executable, "-m", "viewer.cli", "gate", str(tmp_path / "gate.toml"), "--scheduler", cluster, "--no-cache", "--json", str(tmp_path / "gate.json")],
        cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    child = _wait_for_child(tmp_path / "runs" / "attention-contract.native.h5")
    os.kill(child, signal.SIGSTOP)  # a comparison that will not finish by itself
    gate.send_signal(stop)
    try:
        out, err = gate.communicate(timeout=60)
    finally:
        if gate.poll() is None:  # a hung gate must not outlive this test and fail the next
            gate.kill()
            gate.communicate()
    assert gate.returncode == code, err
    assert f"parity-xray gate: {said};" in err and "nothing written" in err
    assert "leaked" not in err and "Traceback" not in err
    assert not (tmp_path / "gate.json").exists()
    deadline = time.monotonic() + 10
    while (_process_with(IN_CHILD, str(tmp_path).encode()) is not None or Path(f"/proc/{child}").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the held comparison outlived the cancelled gate"
    assert _process_with(IN_CHILD, str(tmp_path).encode()) is None
    with Client(cluster, timeout=30) as client:
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0


def test_a_case_name_from_the_manifest_is_printed_with_its_control_characters_escaped() -> None:
    from sessions.compare.tensor_diff import Tolerance

    case = CaseResult("evil\x1b[2J\nPARITY", "n.h5", "o.h5", UNUSABLE, None, ["unreadable"], [], None, None, "stop", Tolerance(), None, None)
    gate = GateResult("gate.toml", "local", None, "2026-12-03T00:00:00", 1.0, [case])
    for text in (gate_command.progress_line(case), gate_command.render_text(gate)):
        assert "evil\\x1b[2J\\nPARITY" in text and "\x1b" not in text


def test_the_gate_table_says_why_an_unusable_case_is_unusable_in_its_first_finding_column() -> None:
    from sessions.compare.tensor_diff import Tolerance

    reason = "/runs/missing.native.h5: file: does not exist, so this case cannot be judged at all by anyone"
    case = CaseResult("gone", "n.h5", "o.h5", UNUSABLE, None, [reason], [], None, None, "stop", Tolerance(), None, None)
    gate = GateResult("gate.toml", "local", None, "2026-12-03T00:00:00", 1.0, [case])
    row = gate_command.render_text(gate).splitlines()[2]
    assert row.split("  ")[:3] == ["gone", "UNUSABLE", "FAIL"] and row.endswith(reason[: gate_command.REASON_SHOWN - 1] + "…")


def test_a_missing_capture_is_unusable_in_the_words_report_uses_for_it(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "gone.native.h5"
    result = run_to_end(iter_judge_case(GateCase("gone", str(missing), str(demo_pairs["clean"][1]), CompareOptions()))).result
    assert report_main(["report", str(missing), str(demo_pairs["clean"][1])]) == 2
    assert result.word == UNUSABLE and capsys.readouterr().err == f"parity-xray report: unusable input: {result.reasons[0]}\n"
    assert result.reasons == [f"{missing}: file: does not exist"]


def test_a_terminals_ctrl_c_to_a_local_gates_whole_process_group_prints_the_gates_one_line_and_no_worker_traceback(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], python_ctrl_c: None
) -> None:
    # A terminal sends Ctrl-C to every process of its foreground group: the gate, and the
    # LocalCluster's worker processes, which printed a KeyboardInterrupt traceback each.
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    gate = subprocess.Popen(
        [sys.executable, "-m", "viewer.cli", "gate", str(tmp_path / "gate.toml"), "--workers", "2", "--no-cache"],
        cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        _wait_for_child(tmp_path / "runs" / "attention-contract.native.h5")
        os.killpg(gate.pid, signal.SIGINT)
        _, err = gate.communicate(timeout=60)
    finally:
        if gate.poll() is None:
            os.killpg(gate.pid, signal.SIGKILL)
            gate.communicate()
    assert gate.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("parity-xray gate: cancelled;") and lines[0].endswith("nothing written"), err


STARTING_GATE = """
import os, signal, threading, time
import psutil
from sessions.gate.cluster import DaskGate


def interrupt_while_starting():
    # Once the cluster has a worker process, it is starting: LocalCluster waits for the worker
    # to register, which takes the worker's start-up (a fixed 0.2 s timer would miss it on a
    # machine that starts a cluster faster).
    while not psutil.Process().children():
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    # Ctrl-C as a terminal delivers it: a test run in a background job (`make test &`) starts this
    # script with SIGINT ignored, which the gate rightly keeps, and the cluster then started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_while_starting, daemon=True).start()
    try:
        with DaskGate(workers=1):
            print("started")
    except KeyboardInterrupt:
        print("interrupted")
"""


def test_ctrl_c_while_the_local_cluster_starts_stops_the_gate_without_dasks_exit_traceback(tmp_path: Path) -> None:
    (tmp_path / "starting_gate.py").write_text(STARTING_GATE)
    env = {**child_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(tmp_path / "starting_gate.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "interrupted\n")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


@pytest.mark.parametrize("align", ["calls", "positions"])
def test_a_case_says_how_its_records_were_paired_as_reports_json_does(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], align: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sessions.gate.result import gate_to_dict

    native, oracle = demo_pairs["head-chunk"]
    result = run_to_end(iter_judge_case(GateCase("head-chunk", str(native), str(oracle), CompareOptions(alignment=align)))).result
    gate = GateResult("gate.toml", "local", None, "2026-12-03T00:00:00", 1.0, [result])
    assert report_main(["report", str(native), str(oracle), "--align", align, "--json", str(tmp_path / "r.json")]) == 1
    capsys.readouterr()
    assert gate_to_dict(gate)["cases"][0]["alignment"] == json.loads((tmp_path / "r.json").read_text())["alignment"]["mode"] == align


def test_a_capture_whose_writer_did_not_finish_is_refused_by_gate_report_diagnose_and_rerun_alike(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A gate passed such a case as PARITY, and diagnose and rerun judged it without a word."""
    native, oracle = (Path(shutil.copy(path, tmp_path)) for path in demo_pairs["clean"])
    with h5py.File(native, "r+") as f:
        f.attrs["complete"] = 0
    reason = f"{native}: / attribute 'complete': incomplete: the writer did not finish; it holds 333 records, 7 token steps, 7 tokens, 24 dispatch events"
    result = run_to_end(iter_judge_case(GateCase("cut-short", str(native), str(oracle), CompareOptions()))).result
    assert (result.word, result.reasons) == (UNUSABLE, [reason])
    said = {}
    for command, extra in (("report", []), ("diagnose", []), ("rerun", ["--op", "0:text-before:0:sdpa"])):
        assert report_main([command, str(native), str(oracle), *extra]) == 2, command
        said[command] = capsys.readouterr().err
    assert said == {
        "report": f"parity-xray report: unusable input: {reason}\n",
        "diagnose": f"parity-xray diagnose: {reason}\n",
        "rerun": f"parity-xray rerun: {reason}\n",
    }


def test_a_case_of_one_file_fails_the_gate_and_every_surface_carries_what_report_warns_of(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest pointing both sides at one file passed for ever, and a swapped pair passed
    without the warning `report` prints above its verdict."""
    from sessions.gate.html_summary import render_gate_html

    native, oracle = (str(p) for p in demo_pairs["clean"])
    results = [
        run_to_end(iter_judge_case(GateCase(name, n, o, CompareOptions()))).result
        for name, n, o in (("itself", native, native), ("swapped", oracle, native), ("clean", native, oracle))
    ]
    same = "same file: the native and the oracle are one file, so every op is bit-exact whatever it holds"
    swapped = (
        "the captures look swapped: the native one was recorded as the oracle and the oracle one as the native "
        "(give the engine under test first); every 'native' and 'oracle' here follows the order given"
    )
    assert [(r.word, r.passed, r.rule_failures, r.warnings) for r in results] == [
        (PARITY, False, [same], []),
        (PARITY, True, [], [swapped]),
        (PARITY, True, [], []),
    ]
    for command, argv, warning in (("itself", [native, native], "SAME FILE: " + same.removeprefix("same file: ")), ("swapped", [oracle, native], swapped)):
        report_main(["report", *argv])
        assert capsys.readouterr().out.splitlines()[0] == f"WARNING: {warning}", command
    gate = GateResult("gate.toml", "local", None, "2026-12-04T00:00:00", 1.0, results)
    table = gate_command.render_text(gate)
    assert table.splitlines()[2].split()[:3] == ["itself", "PARITY", "FAIL"] and same[: gate_command.REASON_SHOWN - 1] + "…" in table.splitlines()[2]
    assert f"WARNING: swapped: {swapped}" in table and gate.headline == "2/3 pass; 1 same file (itself)"
    assert f"WARNING: {swapped}" in gate_command.progress_line(results[1])
    assert escape(f"WARNING: {swapped}") in render_gate_html(gate)
    assert loads(dumps(gate)).cases[1].warnings == [swapped], "the JSON document carries them"


def test_a_gate_whose_output_pipe_closes_ends_without_a_traceback_and_leaves_no_earlier_gates_document(
    tmp_path: Path, demo_pairs: dict[str, tuple[Path, Path]]
) -> None:
    """`gate ... --json g.json | head -0`: its first progress line met the closed pipe, and the
    last gate's document stayed at g.json for CI to read as this gate's."""
    _runs(tmp_path, demo_pairs)
    (tmp_path / "gate.toml").write_text(GLOB)
    earlier = tmp_path / "g.json"
    earlier.write_text('{"format": "parity-xray-gate", "passed": true}')
    gate = subprocess.Popen(
        [sys.executable, "-m", "viewer.cli", "gate", str(tmp_path / "gate.toml"), "--workers", "1", "--json", str(earlier)],
        cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert gate.stdout is not None
    gate.stdout.close()
    _, err = gate.communicate(timeout=120)
    assert (b"Traceback" in err, gate.returncode) == (False, 141), err.decode()
    assert not earlier.exists()
