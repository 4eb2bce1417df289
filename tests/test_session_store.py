"""Saving never loses work: atomic replaces, rotating backups, damaged files, full disks, killed savers."""

from __future__ import annotations

import errno
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sessions.atomic_write import STALE_TEMP_AGE_S, atomic_write_bytes
from sessions.capture.identity import CaptureIdentity
from sessions.compare.key import OpKey
from sessions.investigation.model import Investigation
from sessions.investigation.store import (
    MAX_SESSION_BYTES,
    SessionChangedError,
    SessionDocument,
    SessionOpenError,
    SessionSaveError,
    describe_os_error,
    save_session,
)
from tests.side_files import UNBLOCK_AFTER_S, fifo_without_writer, sparse_file

ROOT = Path(__file__).resolve().parent.parent


def titled(title: str) -> Investigation:
    session = Investigation(title=title)
    session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), f"note of {title}")
    return session


def temps(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


def test_saves_rotate_backups_newest_first_and_keep_at_most_n(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    for n in range(1, 6):
        SessionDocument(titled(f"save {n}"), backups=3).save_as(path)
    titles = [SessionDocument.open(p).session.title for p in (path, *(tmp_path / f"s.xray.{i}" for i in (1, 2, 3)))]
    assert titles == ["save 5", "save 4", "save 3", "save 2"]
    assert not (tmp_path / "s.xray.4").exists()
    assert temps(tmp_path) == []


def damaged_after_two_saves(path: Path) -> bytes:
    """Saves "save 1" then "save 2" at `path` (so "save 1" is its backup), cuts the file short, and returns what is left."""
    for n in (1, 2):
        SessionDocument(titled(f"save {n}")).save_as(path)
    damaged = path.read_bytes()[:-40]
    path.write_bytes(damaged)
    return damaged


def test_a_corrupt_session_is_kept_aside_and_the_newest_good_backup_loads(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    damaged = damaged_after_two_saves(path)

    document = SessionDocument.open(path)

    assert document.session.title == "save 1"
    assert document.dirty
    [aside] = tmp_path.glob("s.xray.corrupt-*")
    assert aside.read_bytes() == damaged
    assert not path.exists()
    [notice] = document.notices
    assert "s.xray could not be read" in notice and "not valid JSON" in notice
    assert "backup s.xray.1" in notice and aside.name in notice

    document.save()
    assert SessionDocument.open(path).session.title == "save 1"
    assert SessionDocument.open(tmp_path / "s.xray.1").session.title == "save 1"


def test_a_damaged_session_that_cannot_be_renamed_aside_still_loads_its_backup_and_is_kept(tmp_path: Path) -> None:
    path = tmp_path / f"{'s' * 230}.xray"  # the ".corrupt-<time>" suffix takes the name past 255 bytes
    damaged = damaged_after_two_saves(path)

    document = SessionDocument.open(path)

    assert document.session.title == "save 1"
    [notice] = document.notices
    assert notice.endswith("; the damaged file stays as it is (the file name is too long (File name too long)), and the next save keeps it as a backup. "
                           f"The backup was saved {notice.split('The backup was saved ')[1]}")
    assert path.read_bytes() == damaged
    document.save()
    assert (tmp_path / f"{path.name}.1").read_bytes() == damaged


def test_a_backup_that_is_itself_damaged_is_skipped_for_an_older_one(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    for n in (1, 2, 3):
        SessionDocument(titled(f"save {n}")).save_as(path)
    path.write_bytes(b"\0" * 100)
    (tmp_path / "s.xray.1").write_text('{"format": "parity-xray-session", "schema_version": 2}')
    document = SessionDocument.open(path)
    assert document.session.title == "save 1"
    assert "s.xray.2" in document.notices[0]


def test_a_damaged_session_without_any_good_backup_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    path.write_bytes(b'{"format": "parity-xray-session", "schema_ver')
    with pytest.raises(SessionOpenError, match="no backup can be read") as caught:
        SessionDocument.open(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == b'{"format": "parity-xray-session", "schema_ver'
    assert list(tmp_path.iterdir()) == [path]


def test_a_missing_session_file_with_a_backup_loads_the_backup(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    for n in (1, 2):
        SessionDocument(titled(f"save {n}")).save_as(path)
    path.unlink()
    document = SessionDocument.open(path)
    assert document.session.title == "save 1"
    assert "does not exist" in document.notices[0]


@pytest.fixture
def file_size_limit():
    """Lower this process's file-size limit for one block: writes past it fail like a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit(size: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


def test_a_save_that_runs_out_of_space_reports_it_and_loses_nothing(tmp_path: Path, file_size_limit) -> None:
    path = tmp_path / "s.xray"
    document = SessionDocument(titled("saved"))
    document.save_as(path)
    on_disk = path.read_bytes()
    document.session.add_bookmark(OpKey(0, "visual", 1, "sdpa"), "a long note " * 2000)
    in_memory = dict(vars(document.session))

    file_size_limit(len(on_disk) + 512)
    with pytest.raises(SessionSaveError) as caught:
        document.save()
    file_size_limit(resource.RLIM_INFINITY)

    assert str(path) in str(caught.value) and "Nothing was lost" in str(caught.value)
    assert caught.value.__cause__.errno == errno.EFBIG
    assert path.read_bytes() == on_disk
    assert temps(tmp_path) == []
    assert not (tmp_path / "s.xray.1").exists() or SessionDocument.open(tmp_path / "s.xray.1").session.title == "saved"
    assert vars(document.session) == in_memory and document.dirty
    document.save()
    assert len(SessionDocument.open(path).session.bookmarks) == 2


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.ENOSPC, "the disk is full"),
        (errno.EROFS, "the folder is on a read-only file system"),
        (errno.EACCES, "there is no permission to write"),
    ],
)
def test_save_errors_are_described_in_words(code: int, words: str) -> None:
    text = describe_os_error(OSError(code, os.strerror(code)))
    assert text.startswith(words) and os.strerror(code) in text


@contextmanager
def write_protected(folder: Path) -> Iterator[None]:
    """A folder nobody may write into: mode 0500 for a user; root ignores modes, so for root the
    folder is made immutable (chattr +i), which refuses root's writes too."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        try:
            yield
        finally:
            folder.chmod(0o700)
        return
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_saving_into_a_read_only_folder_reports_it_and_keeps_the_session(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    document = SessionDocument(titled("unsaved"))
    with write_protected(folder):
        with pytest.raises(SessionSaveError, match="no permission to write"):
            document.save_as(folder / "s.xray")
    assert document.path is None and document.dirty and list(folder.iterdir()) == []


def test_a_leftover_temp_file_from_a_dead_saver_is_removed_by_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    leftover = tmp_path / ".s.xray.0123456789ab.tmp"
    leftover.write_bytes(b"half a session")
    recent = tmp_path / ".s.xray.cdef01234567.tmp"
    recent.write_bytes(b"a save in flight")
    old = time.time() - STALE_TEMP_AGE_S - 1
    os.utime(leftover, (old, old))
    atomic_write_bytes(path, b"{}")
    assert temps(tmp_path) == [recent]


SAVER = """
import sys
from pathlib import Path
from sessions.capture.identity import CaptureIdentity
from sessions.investigation.model import Investigation
from sessions.compare.key import OpKey
from sessions.investigation.store import save_session

path, generation = Path(sys.argv[1]), int(sys.argv[2])
session = Investigation()
session.add_capture("native", "/data/native.h5", CaptureIdentity(1, 2, "0" * 64))
for layer in range(300):
    session.add_bookmark(OpKey(0, "visual", layer, "sdpa"), "note " * 40)
n = 0
while True:
    n += 1
    session.set_title(f"generation {generation} save {n}")
    save_session(session, path, backups=3)
    if n == 1:
        print("saved", flush=True)
"""


def test_a_saver_killed_mid_save_thirty_times_always_leaves_a_readable_session(tmp_path: Path) -> None:
    path = tmp_path / "killed.xray"
    SessionDocument(titled("before any kill")).save_as(path)
    rng = random.Random(6)
    titles = []
    landed = 0
    for generation in range(30):
        saver = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path), str(generation)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        # Killed only once it has saved: on a loaded machine a first save can take longer than
        # the wait, which made whether this generation's title landed a matter of timing.
        assert saver.stdout is not None and saver.stdout.readline() == "saved\n"
        time.sleep(rng.uniform(0.0, 0.05))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        landed += bool(temps(tmp_path))  # the next saver's save clears a killed save's leftovers

        document = SessionDocument.open(path)

        assert document.notices == []
        titles.append(document.session.title)
        if document.session.title != "before any kill":
            assert len(document.session.bookmarks) == 300
    for backup in tmp_path.glob("killed.xray.[0-9]"):
        assert SessionDocument.open(backup).notices == []
    assert all(t.startswith("generation") for t in titles), "every generation's saves landed whole"
    assert landed, "no kill landed inside a save; the test did not exercise what it claims"


@pytest.mark.parametrize("recover", [False, True])
def test_a_session_that_is_a_fifo_is_refused_at_once_and_left_in_place(tmp_path: Path, recover: bool) -> None:
    with fifo_without_writer(tmp_path, "s.xray") as path:
        with pytest.raises(SessionOpenError) as caught:
            SessionDocument.open(path, recover=recover)
        assert str(caught.value) == f"{path} cannot be read: not a regular file: a FIFO"
        assert list(tmp_path.iterdir()) == [path]


def test_a_session_that_is_a_device_is_refused_instead_of_read_without_end() -> None:
    with pytest.raises(SessionOpenError, match=r"^/dev/zero cannot be read: not a regular file: a character device$"):
        SessionDocument.open("/dev/zero", recover=False)


def test_a_session_over_its_size_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    path = sparse_file(tmp_path / "s.xray", MAX_SESSION_BYTES + 1)
    with pytest.raises(SessionOpenError) as caught:
        SessionDocument.open(path, recover=False)
    assert str(caught.value) == f"{path} cannot be read: {MAX_SESSION_BYTES + 1} bytes, over the {MAX_SESSION_BYTES}-byte limit for this kind of file"


def test_saving_over_a_fifo_does_not_wait_to_read_it_first(tmp_path: Path) -> None:
    """Saving reads the file it replaces (to protect a newer schema); a FIFO there is not one."""
    with fifo_without_writer(tmp_path, "s.xray") as path:
        started = time.monotonic()
        save_session(titled("saved"), path, backups=0)
        assert time.monotonic() - started < UNBLOCK_AFTER_S
        assert SessionDocument.open(path).session.title == "saved"


def test_a_save_over_a_file_another_window_saved_since_is_refused_until_asked_to_replace_it(tmp_path: Path) -> None:
    path = tmp_path / "s.xray"
    save_session(titled("first"), path)
    mine, theirs = SessionDocument.open(path), SessionDocument.open(path)
    theirs.session.add_bookmark(OpKey(0, "visual", 0, "sdpa"), "their finding")
    theirs.save()
    mine.session.add_bookmark(OpKey(0, "visual", 0, "ffn_act"), "my finding")
    with pytest.raises(SessionChangedError, match="changed on disk since this window opened or saved it"):
        mine.save()
    assert [b.note for b in SessionDocument.open(path).session.bookmarks] == ["note of first", "their finding"], "their work is still there"
    mine.save(replace_changed=True)
    mine.session.set_title("again")
    mine.save()
    assert SessionDocument.open(path).session.title == "again", "a file this window wrote last saves without a question"


def test_a_session_is_never_saved_over_one_of_its_captures(tmp_path: Path) -> None:
    capture = tmp_path / "native.h5"
    capture.write_bytes(b"not really a capture")
    session = Investigation()
    session.add_capture("native", capture, CaptureIdentity(20, 0, "0" * 64))
    document = SessionDocument(session)
    with pytest.raises(SessionSaveError, match="it is the session's native capture, which a session file never replaces"):
        document.save_as(capture)
    assert capture.read_bytes() == b"not really a capture" and not capture.with_name("native.h5.1").exists()

