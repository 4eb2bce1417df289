"""A gate's cases judged on dask.distributed: a LocalCluster on this machine, or an existing cluster.

At 10+ GB per pair and 40+ cases a gate outgrows one machine, so it runs on an existing
distributed engine rather than a home-made one. Each case is one Dask task
(`judge_on_worker`) that reads its captures where the worker sees them (a shared file system
for a remote cluster) and sends back only its small outcome (sessions.gate.judge): the
client never pulls tensors.

Failure and cancellation, as the gate needs them:
- A capture that crashes libhdf5 kills only the comparing child of its task
  (sessions.compare.in_child): the case is UNUSABLE with the reason, the worker goes on.
- A worker that dies takes its task with it; the scheduler retries the task elsewhere up to
  its `distributed.scheduler.allowed-failures` and then fails it with KilledWorker, which
  makes that case UNUSABLE with the reason while the other cases are judged.
- Ctrl-C: Dask cannot interrupt a running task, so every task polls a gate-wide
  `distributed.Event`; setting it makes running tasks close their judgment (which kills
  their child processes) and queued ones return at once. Whatever has not ended after
  CANCEL_WAIT_S is cancelled through Dask. A local cluster's processes are started with
  SIGINT blocked (`started_out_of_ctrl_c_reach`): the terminal's Ctrl-C reaches the gate alone,
  which stops them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from functools import partial
from types import TracebackType

import dask
from distributed import (
    Client,
    Event,
    KilledWorker,
    LocalCluster,
    as_completed,
    get_worker,
    wait,
)
from distributed.client import Future
from distributed.comm import connect

from sessions.ctrl_c import ctrl_c_deferred, started_out_of_ctrl_c_reach
from sessions.gate.judge import CachedCase, CaseOutcome, case_unusable, iter_judge_case
from sessions.gate.manifest import GateCase
from sessions.machine import usable_cores

CANCEL_POLL_S = 0.5
"""How often a running task asks whether the gate was cancelled: one small scheduler call."""
CANCEL_WAIT_S = 10.0
"""How long a cancelled gate waits for its running tasks to stop their children before Dask cancels them."""
CONNECT_TIMEOUT_S = 10
WORKER_WAIT_S = 60.0
"""How long a gate waits for a cluster with no worker yet (an adaptive one may be scaling up)."""
WORKER_SATURATION = 1.0
"""A local gate's scheduler gives each worker only the case it runs (Dask's default, 1.1, gives a
one-thread worker two): a case never waits behind another while a worker is idle, and a worker
that dies takes only its own case with it. Dask applies it when a gate has more cases than
twice its threads; an existing cluster keeps its own setting."""
LOCAL_HOST = "127.0.0.1"
"""A LocalCluster listens on loopback only: its scheduler, workers and dashboard serve this machine."""


class ClusterError(Exception):
    """The cluster could not be started or reached: the gate judged nothing."""


def judge_on_worker(case: GateCase, previous: CachedCase | None, want_html: bool, cancel_event: str) -> CaseOutcome | None:
    """The Dask task of one case: its judgment, with the worker's address; None when the gate was cancelled."""
    cancel = Event(cancel_event)
    if cancel.is_set():
        return None
    work = iter_judge_case(case, previous, want_html)
    polled = time.monotonic()
    try:
        while True:
            try:
                next(work)
            except StopIteration as done:
                outcome: CaseOutcome = done.value
                break
            if time.monotonic() - polled >= CANCEL_POLL_S:
                polled = time.monotonic()
                if cancel.is_set():
                    return None
    finally:
        work.close()
    outcome.result.worker = get_worker().address
    return outcome


def _check_answers(scheduler: str) -> None:
    """Raise unless something at `scheduler` completes Dask's handshake in CONNECT_TIMEOUT_S.
    Client's own timeout does not bound the handshake: a listener that accepts and never answers
    (an HTTP server: the dashboard's port given for the scheduler's) held `gate` for ever. A
    listener that answers something else (an SSH banner, read as a frame count) ends in
    MemoryError. Made on a private event loop, apart from the one the client then uses."""

    async def handshake() -> None:
        comm = await connect(scheduler, timeout=CONNECT_TIMEOUT_S)
        await comm.close()

    try:
        asyncio.run(asyncio.wait_for(handshake(), CONNECT_TIMEOUT_S))
    except TimeoutError:
        raise TimeoutError(f"nothing there answered as a Dask scheduler within {CONNECT_TIMEOUT_S} s (is it the dashboard's port?)") from None


class DaskGate:
    """A Dask client for one gate: `with DaskGate(workers=N) as gate: for i, outcome in gate.judge(...)`.

    `scheduler` given: connect to that existing cluster; else start a LocalCluster of
    `workers` processes (default: every core here), one thread each, on loopback. Leaving the
    `with` block while cases are still running (Ctrl-C, an error) cancels them first.
    """

    def __init__(self, workers: int | None = None, scheduler: str | None = None) -> None:
        self.workers = workers
        self.scheduler = scheduler
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None
        self.cancel_event = f"parity-xray-gate-cancel-{uuid.uuid4().hex}"
        self._pending: set[Future] = set()

    def __enter__(self) -> DaskGate:
        try:
            if self.scheduler is not None:
                _check_answers(self.scheduler)
                self.client = Client(self.scheduler, timeout=CONNECT_TIMEOUT_S)
            else:
                with ctrl_c_deferred(), dask.config.set({"distributed.scheduler.worker-saturation": WORKER_SATURATION}):
                    self.cluster = started_out_of_ctrl_c_reach(
                        partial(
                            LocalCluster,
                            n_workers=self.workers or usable_cores(),
                            threads_per_worker=1,
                            processes=True,
                            host=LOCAL_HOST,
                            dashboard_address=f"{LOCAL_HOST}:0",
                            silence_logs=logging.ERROR,
                        )
                    )
                self.client = Client(self.cluster)
            self.client.wait_for_workers(1, timeout=WORKER_WAIT_S)
        except (OSError, TimeoutError, ValueError, MemoryError) as exc:  # ValueError: an address Dask cannot parse
            self.close()
            where = f"the scheduler at {self.scheduler}" if self.scheduler else "a local Dask cluster"
            why = "it answered something other than Dask's protocol" if isinstance(exc, MemoryError) else f"{type(exc).__name__}: {exc}"
            raise ClusterError(f"cannot use {where}: {why}") from None
        except BaseException:  # Ctrl-C once the cluster has started (`ctrl_c_deferred`): `with` will not call __exit__
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            # Stopped inside Dask's wait for a result, Dask's event loop logs its own tracebacks
            # (a NameError in distributed.utils.sync's cancel, "Couldn't gather keys") under the
            # gate's one line: a stopped gate says only that.
            for name in QUIET_WHEN_STOPPED:
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        try:
            if self._pending:
                self.cancel()
        finally:
            self.close()

    @property
    def description(self) -> str:
        """Where the cases are judged, in words."""
        assert self.client is not None
        workers = len(self.client.scheduler_info(n_workers=-1)["workers"])
        if self.cluster is not None:
            return f"a LocalCluster of {workers} worker process(es) at {self.cluster.scheduler_address}"
        return f"the cluster at {self.scheduler} ({workers} worker(s))"

    @property
    def dashboard(self) -> str | None:
        """The Dask dashboard's link, when the scheduler serves one."""
        assert self.client is not None
        return self.client.dashboard_link if "dashboard" in self.client.scheduler_info(n_workers=0).get("services", {}) else None

    def judge(self, cases: list[GateCase], previous: list[CachedCase | None], want_html: bool) -> Iterator[tuple[int, CaseOutcome]]:
        """Submit every case; yield (index, outcome) as each finishes, in the order they finish."""
        assert self.client is not None
        batch = uuid.uuid4().hex[:8]
        # One map, not a submit per case: the scheduler sees the whole gate at once, so it can
        # queue the cases (WORKER_SATURATION) instead of handing them out as they arrive.
        submitted = self.client.map(
            judge_on_worker, cases, previous, [want_html] * len(cases), [self.cancel_event] * len(cases),
            key=[f"gate-{batch}-{index}-{case.name}" for index, case in enumerate(cases)], pure=False,
        )
        futures = {future: index for index, future in enumerate(submitted)}
        self._pending = set(futures)
        for future in as_completed(futures):
            self._pending.discard(future)
            index = futures[future]
            outcome = _outcome(future, cases[index])
            future.release()
            if outcome is not None:
                yield index, outcome

    def cancel(self) -> None:
        """Stop every case still running or queued, and their children; see the module docstring."""
        assert self.client is not None
        cancel = Event(self.cancel_event, client=self.client)
        cancel.set()
        try:
            wait(list(self._pending), timeout=CANCEL_WAIT_S)
        except TimeoutError:
            self.client.cancel(list(self._pending), force=True)  # the event stays set for the stragglers
        else:
            cancel.clear()  # every task has ended: this removes the event from a long-lived scheduler
        self._pending = set()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


QUIET_WHEN_STOPPED = ("tornado.application", "distributed")
"""The loggers a gate stopped by Ctrl-C or SIGTERM silences (`DaskGate.__exit__`)."""


def _outcome(future: Future, case: GateCase) -> CaseOutcome | None:
    """The finished task's outcome; a task that failed (its worker died) is the case UNUSABLE with why."""
    if future.status == "finished":
        result: CaseOutcome | None = future.result()
        return result
    if future.status == "error":
        error = future.exception()
        if isinstance(error, KilledWorker):
            reason = f"the Dask worker judging it died ({error})"
        else:
            reason = f"judging it failed on its worker: {type(error).__name__}: {error}"
    else:
        reason = f"its Dask task ended as {future.status!r} before it was judged"
    return CaseOutcome(case_unusable(case, reason), None)
