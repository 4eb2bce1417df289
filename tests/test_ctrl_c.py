"""Ctrl-C (and SIGTERM) in a headless command: one line, exit 130 (143), no traceback, no child left, and never lost.

Python loses a KeyboardInterrupt that is raised while a weakref callback or finalizer runs
(it prints "Exception ignored in ..." and goes on): `record mlx` runs interrupted so went on to
the end and said they had recorded the run. These tests send real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from sessions.capture.spare_checker import CHECKER_MODULE
from sessions.child_env import PROJECT_ROOT, child_env
from sessions.ctrl_c import ctrl_c_kept
from sessions.progress import Progress, ProgressGenerator, run_to_end
from tests.child_processes import children_of_this_process


class _Held:
    """An object whose weakref callback runs Python code when it is dropped."""


def _steps_dropping_an_object_whose_callback_is_interrupted(reached: list[int]) -> ProgressGenerator[str]:
    held = _Held()

    def interrupted_callback(_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the signal is handled here, inside the callback, which loses its exception
            pass

    ref = weakref.ref(held, interrupted_callback)
    for step in range(100):
        reached.append(step)
        if step == 3:
            del held
        yield Progress(step, 100)
    assert ref() is None
    return "ran to the end"


def test_a_ctrl_c_whose_exception_a_callback_lost_still_stops_the_run_at_its_next_step(python_ctrl_c: None) -> None:
    reached: list[int] = []
    with ctrl_c_kept(), pytest.raises(KeyboardInterrupt):
        run_to_end(_steps_dropping_an_object_whose_callback_is_interrupted(reached))
    assert reached == [0, 1, 2, 3]


def test_outside_a_command_a_lost_ctrl_c_is_lost_as_python_loses_it(python_ctrl_c: None) -> None:
    """The hazard the kept flag is for, shown with the same run: without it the run goes to its end."""
    reached: list[int] = []
    unraisable: list[BaseException | None] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda hook_args: unraisable.append(hook_args.exc_value)
    try:
        assert run_to_end(_steps_dropping_an_object_whose_callback_is_interrupted(reached)) == "ran to the end"
    finally:
        sys.unraisablehook = previous_hook
    assert len(reached) == 100 and len(unraisable) == 1 and isinstance(unraisable[0], KeyboardInterrupt)


def test_a_command_started_with_ctrl_c_ignored_keeps_ignoring_it() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ctrl_c_kept():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _checker_of(pid: int, timeout_s: float = 30.0) -> int:
    """The checking child `pid` keeps ready, stopped as soon as it is there: a check that never ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child, cmdline in children_of_this_process(pid).items():
            if CHECKER_MODULE.encode() in b" ".join(cmdline):
                os.kill(child, signal.SIGSTOP)
                return child
        time.sleep(0.005)
    raise AssertionError(f"process {pid} started no checking child in {timeout_s} s")


@pytest.mark.parametrize(
    ("command", "stop", "code", "said", "background"),
    [
        ("report", signal.SIGINT, 130, "interrupted by Ctrl-C", False),
        ("validate", signal.SIGINT, 130, "interrupted by Ctrl-C", False),
        ("report", signal.SIGTERM, 143, "stopped by SIGTERM", False),
        ("report", signal.SIGTERM, 143, "stopped by SIGTERM", True),
    ],
)
def test_ctrl_c_or_sigterm_ends_a_command_with_one_line_its_exit_code_and_no_child_left(
    command: str, stop: int, code: int, said: str, background: bool, demo_pairs: dict[str, tuple[Path, Path]], tmp_path: Path, python_ctrl_c: None
) -> None:
    """`background`: started as a shell's background job is, with Ctrl-C ignored (`trap "" INT`).
    The JSON and HTML a report's earlier run left are removed: an interrupted run makes no claim,
    and CI read the last run's PARITY as this one's."""
    native, oracle = demo_pairs["clean"]
    copies = []
    for source in (native, oracle):  # files no check has passed yet (the check cache knows the demo's)
        copies.append(tmp_path / source.name)
        copies[-1].write_bytes(source.read_bytes())
    earlier = [tmp_path / "earlier.json", tmp_path / "earlier.html"]
    earlier[0].write_text('{"format": "parity-xray-report", "verdict": {"word": "PARITY"}}')
    earlier[1].write_text("<!doctype html><title>Parity X-ray: PARITY</title>")
    documents = ["--json", str(earlier[0]), "--html", str(earlier[1])] if command == "report" else []
    argv = [sys.executable, "-m", "viewer.cli", command, *map(str, copies), *documents]
    running = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *argv] if background else argv,
        cwd=PROJECT_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    checker = _checker_of(running.pid)
    try:
        time.sleep(1.0)  # the command has handed the first file to the stopped checker and waits
        running.send_signal(stop)
        out, err = running.communicate(timeout=60)
        checker_left = _alive(checker)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
        if _alive(checker):
            os.kill(checker, signal.SIGKILL)
    assert running.returncode == code, err
    assert err == f"parity-xray {command}: {said}\n"
    assert out == ""
    assert not checker_left
    assert [document.exists() for document in earlier] == [command != "report"] * 2


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pressed_twice_or_failed(seen: list[str], second: bool, fail: bool) -> None:
    """What a block under `ctrl_c_deferred` did after one Ctrl-C (two with `second`), failing afterwards with `fail`."""
    from sessions.ctrl_c import ctrl_c_deferred

    # Inside ctrl_c_kept, as in a command: it forgets the press on leaving, which a later test's
    # progress loop (`raise_if_pressed`) would otherwise take for its own Ctrl-C.
    with ctrl_c_kept(), ctrl_c_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        seen.append("went on after the first")
        if second:
            os.kill(os.getpid(), signal.SIGINT)
            seen.append("went on after the second")
        if fail:
            raise OSError("a child the Ctrl-C also reached died")
    seen.append("left the block")


def test_a_ctrl_c_while_third_party_start_up_runs_is_raised_when_it_ends_and_a_second_one_at_once(python_ctrl_c: None) -> None:
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _pressed_twice_or_failed(seen, second=False, fail=False)
    assert seen == ["went on after the first"], "the start-up finished, then the interrupt came"
    seen.clear()
    with pytest.raises(KeyboardInterrupt) as stopped:
        _pressed_twice_or_failed(seen, second=False, fail=True)
    assert isinstance(stopped.value.__context__, OSError), "the error the interrupt caused is its context, not what is said"
    seen.clear()
    with pytest.raises(KeyboardInterrupt):
        _pressed_twice_or_failed(seen, second=True, fail=False)
    assert seen == ["went on after the first"], "a second Ctrl-C stops a start that hangs"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_deferred_ctrl_c_leaves_an_ignored_one_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: list[str] = []
    try:
        _pressed_twice_or_failed(seen, second=True, fail=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == ["went on after the first", "went on after the second", "left the block"]
