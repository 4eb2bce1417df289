"""llama.cpp recordings run in a child process, so llama.cpp never takes the caller down.

A llama-cpp-python build can run an instruction the machine does not grant (an AMX build on a VM
whose OS never enabled AMX: SIGILL), and ggml aborts the whole process on a failed GGML_ASSERT
(a GGUF whose metadata contradicts its tensors). In the viewer, the CLI or a test run, either
would end everything. Here the recording runs in `python -m backends.recorders.llama_process`;
the caller gets its progress and its result, or a `LlamaCrashed` naming the signal, the native
function when known, what ggml said, and what to do (`backends.recorders.llama_crash`).

The child reads one JSON job on stdin and writes, on a private copy of its stdout (fd 1 itself
becomes stderr, so gdb backtraces and native printf output cannot corrupt the protocol):
`system {...}` (llama.cpp's system info, once loaded), `stage TEXT` (what it is about to do),
`progress DONE TOTAL LABEL`, and at the end `result` (the logits are an `.npz` written to the
descriptor `logits_fd`, a file the parent made and unlinked) or `error {"type", "message"}`.
Its core dumps are off and its address space is limited to the machine's memory plus the model
file and some headroom, so a runaway allocation fails inside llama.cpp (a clean error) instead
of swapping the machine.

`PARITY_XRAY_LLAMA_FAULT=SIGILL|SIGSEGV` makes the child fault for real just before its first
`llama_decode` (an illegal instruction; a read through a bad pointer inside ggml), which is how
the tests prove a crash becomes a message.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import platform
import resource
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, TextIO

import numpy as np

from backends.recorders.left_behind import left_at
from backends.recorders.llama_crash import explain_crash
from backends.recorders.llama_nodes import RecorderError
from backends.recorders.llama_process_env import brief_openmp_wait
from backends.recorders.llama_recorder import (
    LlamaSettings,
    iter_plain_here,
    iter_record_here,
    require_gguf_file,
)
from backends.recorders.record_schedule import (
    TokenSchedule,
    check_batch,
)
from sessions.child_env import module_command
from sessions.child_process import ChildProcess, die_with_parent, progress_line
from sessions.file_room import FileUnwritable
from sessions.machine import physical_memory
from sessions.progress import Progress, ProgressGenerator, run_to_end
from sessions.side_file import DiskStamp, disk_stamp

FAULT_ENV = "PARITY_XRAY_LLAMA_FAULT"
POLL_S = 0.1
"""How often the parent yields while the child is quiet, so closing its generator is prompt."""
COMPUTING = "computing step"
"""Stage lines from the first llama_decode on: the capture file exists from then."""
HEADROOM_BYTES = 8 * 1024**3
"""Address space beyond RAM and the model: the interpreter, thread stacks, malloc arenas."""


class LlamaCrashed(RecorderError):
    """llama.cpp ended the recording process by a signal; the message says where and what to do."""


def _schedule_json(schedule: TokenSchedule) -> dict[str, Any]:
    return {
        "prompt": list(schedule.prompt),
        "decode_steps": schedule.decode_steps,
        "ubatch": schedule.ubatch,
        "stop_tokens": sorted(schedule.stop_tokens),
        "cut": [list(c) for c in schedule.cut],
        "feed_last": schedule.feed_last,
    }


def _schedule_from(data: dict[str, Any]) -> TokenSchedule:
    cut = tuple((str(name), int(size)) for name, size in data["cut"])
    return TokenSchedule(tuple(data["prompt"]), data["decode_steps"], data["ubatch"], frozenset(data["stop_tokens"]), cut, data["feed_last"])


def iter_record_llama(
    model_path: Path, schedule: TokenSchedule, out: Path, settings: LlamaSettings = LlamaSettings(),
    *, role: str = "native", extra: dict[str, Any] | None = None, weights_hash: str | None = None, batch: int = 1, batch_row: int = 0,
) -> ProgressGenerator[list[np.ndarray]]:
    """Record `schedule` on the GGUF at `model_path` into `out` in a child process; yields its
    progress, returns llama.cpp's logits per step (the request's, in a batch). Raises RecorderError
    when the run is refused, LlamaCrashed when llama.cpp crashed. Closing the generator kills the child.

    `weights_hash` overrides the capture's weights hash (default: the GGUF file's SHA-256, which
    provenance keeps either way), for pairs whose engines load the same values from different files.
    With `batch` > 1 the prompt is row `batch_row` of a batch of requests (`iter_record_here`)."""
    check_batch(batch, batch_row)
    job = {
        "mode": "record", "out": str(out), "role": role, "extra": extra or {}, "weights_hash": weights_hash,
        "batch": batch, "batch_row": batch_row,
    }  # fmt: skip
    return (yield from _iter_child(Path(model_path), schedule, settings, job))


def plain_logits(model_path: Path, schedule: TokenSchedule, settings: LlamaSettings = LlamaSettings()) -> list[np.ndarray]:
    """The same schedule with no callback installed (in a child too): what capture must not change."""
    return run_to_end(_iter_child(Path(model_path), schedule, settings, {"mode": "plain"}))


def _iter_child(model: Path, schedule: TokenSchedule, settings: LlamaSettings, job: dict[str, Any]) -> ProgressGenerator[list[np.ndarray]]:
    require_gguf_file(model)
    before = disk_stamp(job["out"]) if job["mode"] == "record" else None
    # An unlinked file, not a scratch folder: a `kill -9` of this process left the folder behind,
    # and the kernel frees this file with the last process holding it.
    with tempfile.TemporaryFile(prefix="parity-xray-llama-logits-") as logits:
        # Handed over above the standard streams: run with one of them closed, the file took its
        # number, and the child's own stdin pipe took that number back in the child.
        answer = fcntl.fcntl(logits.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
        try:
            job = {**job, "model": str(model), "schedule": _schedule_json(schedule), "settings": asdict(settings), "logits_fd": answer}
            child = ChildProcess(module_command("backends.recorders.llama_process"), json.dumps(job), pass_fds=(answer,))
        finally:
            os.close(answer)  # the child has its own
        try:
            yield Progress(0, schedule.decode_steps + 1, f"starting llama.cpp on {model.name}")
            while child.reading:
                child.read(POLL_S)
                if child.latest is not None:
                    yield child.latest
            return _outcome(child, child.process.wait(), job, logits, before)
        finally:
            child.close()


def _outcome(child: ChildProcess, returncode: int, job: dict[str, Any], logits: IO[bytes], before: DiskStamp | None) -> list[np.ndarray]:
    """The child's logits, or the error its ending amounts to; `before`: the output's stamp when it started."""
    if returncode < 0:
        systems, stages = child.lines("system"), child.lines("stage")
        raise LlamaCrashed(
            explain_crash(
                -returncode,
                child.stderr_text(),
                stage=stages[-1] if stages else "starting",
                system_info=json.loads(systems[-1])["system_info"] if systems else None,
                left=left_at(Path(job["out"]), before) if job["mode"] == "record" else None,
            )
        )
    errors = child.lines("error")
    if errors:
        error = json.loads(errors[-1])
        if error["type"] == "FileUnwritable":  # "record refused" for llama, "record failed" for MLX, of one full disk
            raise FileUnwritable(error["errno"], error["message"], error["filename"])
        raise RecorderError(error["message"])
    if returncode == 0 and child.lines("result"):
        logits.seek(0)
        with np.load(logits, allow_pickle=False) as stored:
            return [stored[f"step{i}"] for i in range(len(stored.files))]
    tail = child.stderr_text().strip().splitlines()[-1:] or ["no output"]
    raise RecorderError(f"the llama.cpp process failed (exit {returncode}: {tail[0][:300]})")


# The child's side.


def _limit_resources(model: Path) -> None:
    """No core file for an expected crash; no more address space than RAM, the mapped model and headroom."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if sys.platform != "linux":
        return  # macOS does not enforce RLIMIT_AS
    limit = physical_memory() + model.stat().st_size + HEADROOM_BYTES
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _fault(kind: str) -> None:
    """A real fault where llama.cpp would run: an illegal instruction, or a bad read inside ggml."""
    if kind not in ("SIGILL", "SIGSEGV"):
        raise ValueError(f"{FAULT_ENV}={kind!r}: SIGILL or SIGSEGV")
    if kind == "SIGSEGV":
        from backends.recorders.ggml_tensor_struct import GgmlLibrary

        GgmlLibrary.load().lib.ggml_nbytes(ctypes.c_void_p(8))
    else:
        code = b"\x0f\x0b" if platform.machine() in ("x86_64", "AMD64") else b"\x00\x00\x00\x00"  # ud2 / udf #0
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()


class _Protocol:
    """The child's lines to the parent, on a private copy of the original stdout."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, kind: str, text: str = "") -> None:
        self.stream.write(f"{kind} {text}\n" if text else f"{kind}\n")
        self.stream.flush()


def _run_job(job: dict[str, Any], protocol: _Protocol) -> list[np.ndarray]:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    protocol.write("system", json.dumps({"system_info": info, "llama_cpp_python": llama_cpp.__version__}))
    model, fault = Path(job["model"]), os.environ.get(FAULT_ENV)

    def before_decode(step: int) -> None:
        protocol.write("stage", f"{COMPUTING} {step} of {model.name}" + (" (prefill)" if step == 0 else ""))
        if fault and step == 0:
            _fault(fault)

    schedule, settings = _schedule_from(job["schedule"]), LlamaSettings(**job["settings"])
    protocol.write("stage", f"loading {model.name}")
    if job["mode"] == "record":
        work = iter_record_here(model, schedule, Path(job["out"]), settings, role=job["role"], extra=job["extra"],
                                weights_hash=job["weights_hash"], before_decode=before_decode,
                                batch=job["batch"], batch_row=job["batch_row"])  # fmt: skip
    else:
        work = iter_plain_here(model, schedule, settings, before_decode=before_decode)
    while True:
        try:
            protocol.write(progress_line(next(work)))
        except StopIteration as done:
            return done.value


def main() -> int:
    die_with_parent()
    brief_openmp_wait()
    protocol = _Protocol(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)
    from sessions import crash_point

    crash_point.enable()
    job = json.loads(sys.stdin.read())
    _limit_resources(Path(job["model"]))
    try:
        logits = _run_job(job, protocol)
    except FileUnwritable as exc:  # a full disk: the parent says so as a recording in its own process does
        protocol.write("error", json.dumps({"type": "FileUnwritable", "message": exc.strerror, "errno": exc.errno, "filename": exc.filename}))
        return 1
    except Exception as exc:  # noqa: BLE001  (every failure reaches the parent as a message, not a traceback)
        protocol.write("error", json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        return 1
    with os.fdopen(job["logits_fd"], "wb") as answer:
        np.savez(answer, **{f"step{i}": values for i, values in enumerate(logits)})
    protocol.write("result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
