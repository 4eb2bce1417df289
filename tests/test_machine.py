"""What the machine lets a command hold (sessions.machine): the memory the system could give, no
more than the memory cgroup it runs in allows, read from hand-written cgroup folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions import machine
from sessions.machine import available_memory, cgroup_available, physical_memory

GIB = 1024**3


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def _v2(tmp_path: Path, path: str) -> tuple[Path, Path]:
    own = tmp_path / "self-cgroup"
    own.write_text(f"0::{path}\n")
    return tmp_path / "cgroup", own


def test_a_v2_cgroup_allows_its_limit_less_what_it_holds_its_page_cache_counted_as_free(tmp_path: Path) -> None:
    root, own = _v2(tmp_path, "/ci/job")
    _write(root / "ci" / "job", {"memory.max": f"{8 * GIB}\n", "memory.current": f"{6 * GIB}\n", "memory.stat": f"anon {GIB}\nfile {5 * GIB}\n"})
    assert cgroup_available(root, own) == 7 * GIB


def test_the_tightest_limit_of_a_v2_cgroup_and_its_ancestors_wins_and_max_is_no_limit(tmp_path: Path) -> None:
    root, own = _v2(tmp_path, "/ci/job")
    _write(root / "ci", {"memory.max": f"{4 * GIB}\n", "memory.current": f"{3 * GIB}\n", "memory.stat": "file 0\n"})
    _write(root / "ci" / "job", {"memory.max": "max\n", "memory.current": f"{3 * GIB}\n", "memory.stat": "file 0\n"})
    assert cgroup_available(root, own) == GIB
    _write(root / "ci", {"memory.max": "max\n"})
    assert cgroup_available(root, own) is None, "no limit anywhere"


def test_inside_a_container_its_cgroup_is_the_mounts_root(tmp_path: Path) -> None:
    root, own = _v2(tmp_path, "/docker/0123abcd")
    _write(root, {"memory.max": f"{2 * GIB}\n", "memory.current": f"{GIB}\n", "memory.stat": "file 0\n"})
    assert cgroup_available(root, own) == GIB


def test_a_v1_memory_controller_gives_its_hierarchical_limit_and_a_hybrid_systems_is_the_one_read(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("9:name=systemd:/\n4:memory:/ci/job\n0::/\n")
    root = tmp_path / "cgroup"
    job = root / "memory" / "ci" / "job"
    _write(job, {"memory.stat": f"cache {GIB}\nhierarchical_memory_limit {3 * GIB}\ntotal_cache {2 * GIB}\n", "memory.usage_in_bytes": f"{4 * GIB}\n"})
    assert cgroup_available(root, own) == GIB
    _write(job, {"memory.stat": "hierarchical_memory_limit 9223372036854771712\ntotal_cache 0\n"})
    assert cgroup_available(root, own) is None, "the kernel's way of saying no limit"


def test_no_cgroup_file_or_an_unreadable_one_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_available(tmp_path, tmp_path / "missing") is None
    root, own = _v2(tmp_path, "/ci/job")
    _write(root / "ci" / "job", {"memory.max": "eight gigabytes\n"})
    assert cgroup_available(root, own) is None


def test_the_memory_a_command_may_use_is_no_more_than_its_cgroup_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cgroup_available", lambda: None)
    system = available_memory()
    assert system > 64 * 1024 * 1024, "a machine that runs these tests has more free"
    monkeypatch.setattr(machine, "cgroup_available", lambda: 1024 * 1024)
    assert available_memory() == 1024 * 1024


def test_the_memory_the_system_could_give_is_what_the_system_says_and_never_more_than_the_machine_has() -> None:
    """The early checks' budget and the page cache's kept share are shares of it: read wrong (kB
    taken as bytes), a real run's bytes would be checked after the pairing instead of during it."""
    import psutil

    available = available_memory()
    assert 0 < available <= physical_memory()
    if Path("/proc/meminfo").exists():  # Linux says; elsewhere half the machine's memory stands in
        allowed = cgroup_available()
        said = psutil.virtual_memory().available if allowed is None else min(psutil.virtual_memory().available, allowed)
        assert abs(available - said) < physical_memory() // 20
