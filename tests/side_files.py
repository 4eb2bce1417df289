"""Hostile side files for tests: a FIFO nobody writes to, a file past a reader's size limit."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

UNBLOCK_AFTER_S = 5.0


def _unblock(path: Path) -> None:
    """Open and close the FIFO's write end if a reader is waiting on it (it then reads end of file)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: nobody is reading, nothing to unblock
            raise


@contextlib.contextmanager
def fifo_without_writer(folder: Path, name: str) -> Iterator[Path]:
    """A FIFO at `folder/name` that no one writes to. A reader that opens it blocking would wait
    forever; every few seconds a watcher lets such a reader go (with end of file), so that a test
    of a reader that does wait fails on its assertion instead of hanging the suite."""
    path = folder / name
    os.mkfifo(path)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(UNBLOCK_AFTER_S):
            _unblock(path)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield path
    finally:
        done.set()
        watcher.join()


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes (zeros) that takes no disk space, to go past a reader's size limit."""
    path.write_bytes(b"")
    os.truncate(path, size)
    return path
