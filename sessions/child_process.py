"""The parent's side of a child process that does risky work and reports by lines.

Native libraries (libhdf5 on a crafted file, llama.cpp on a CPU it was not built for) can end a
process by a signal; a child process turns that into an exit status the parent explains. A child
prints `progress DONE TOTAL LABEL` lines on stdout as it goes and whatever else its protocol
needs; the parent reads both pipes without blocking, so a generator around it can yield between
reads and closing that generator (cancel) kills and reaps the child.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys

from sessions.child_env import child_env
from sessions.progress import Progress

PROGRESS = "progress"
READ_BYTES = 1024 * 1024
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child: be killed when the process that started it dies (Linux). A parent killed with
    -9 cannot stop its children: a recording's llama.cpp child went on writing for seconds, and a
    comparison's workers finished their shards unseen."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def signal_name(number: int) -> str:
    """`SIGSEGV` for 11; a number the platform does not name stays a number."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def progress_line(progress: Progress) -> str:
    """The child's side: one progress report as the line the parent parses (no newline inside)."""
    return f"{PROGRESS} {progress.done} {progress.total} {progress.label.replace(chr(10), ' ')}"


class ChildProcess:
    """One child, what it has printed so far, and its latest progress; `close` kills and reaps it."""

    def __init__(self, command: list[str], stdin_text: str | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        """`pass_fds`: descriptors the child inherits under the same numbers (an answer too large for a pipe line)."""
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
            pass_fds=pass_fds,
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        if stdin_text is not None:
            assert self.process.stdin is not None
            try:
                # On stdin, not argv: a long job (many alignment overrides) would pass the kernel's 128 KiB limit of one argument.
                with self.process.stdin as stdin:
                    stdin.write(stdin_text.encode("utf-8"))
            except BrokenPipeError:
                pass  # the child ended before reading its input; its exit status says why
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ, "out")
        self.selector.register(self.process.stderr, selectors.EVENT_READ, "err")
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._parsed = 0
        self.latest: Progress | None = None

    @property
    def reading(self) -> bool:
        """Whether either pipe is still open (the child has not ended, or its output is not all read)."""
        return bool(self.selector.get_map())

    def read(self, timeout_s: float) -> None:
        """Take what the child printed within `timeout_s`."""
        for key, _ in self.selector.select(timeout_s):
            chunk = os.read(key.fd, READ_BYTES)
            if not chunk:
                self.selector.unregister(key.fileobj)
            elif key.data == "out":
                self.stdout += chunk
                self._parse_progress(len(self.stdout) - len(chunk))
            else:
                self.stderr += chunk

    def _parse_progress(self, new_from: int) -> None:
        """Only whole lines; other lines are the caller's to read from `stdout`. A line break is
        looked for in the bytes from `new_from` only: looked for in all of them, a document
        printed as one 130 MB line (two 60 MB prompts) was searched again for each 64 KiB read."""
        last = self.stdout.rfind(b"\n", new_from)
        if last < 0:
            return
        end = last + 1
        prefix = PROGRESS.encode() + b" "
        for line in bytes(self.stdout[self._parsed : end]).splitlines():
            if line.startswith(prefix):
                parts = line[len(prefix) :].decode("utf-8", errors="replace").split(" ", 2)
                if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                    self.latest = Progress(int(parts[0]), int(parts[1]), parts[2] if len(parts) == 3 else "")
        self._parsed = end

    def lines(self, kind: str) -> list[str]:
        """The text after `KIND ` of every whole stdout line of that kind, in order (`""` for a bare `KIND`)."""
        marker = kind.encode()
        end = self.stdout.rfind(b"\n") + 1
        return [
            line[len(marker) + 1 :].decode("utf-8", errors="replace")
            for line in bytes(self.stdout[:end]).splitlines()
            if line == marker or line.startswith(marker + b" ")
        ]

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def close(self) -> None:
        """Kill the child if it still runs and reap it, so none outlives its caller."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        self.selector.close()
