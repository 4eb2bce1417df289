"""A capture's weights hash is SHA-256 over the artifact files, hashed again only when a file changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sessions import artifact_hash
from sessions.artifact_hash import artifact_sha256, hashes_dir


@pytest.fixture
def reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The file lists actually read, in a private cache folder."""
    monkeypatch.setenv("PARITY_XRAY_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[list[str]] = []
    digest = artifact_hash._digest

    def counting(paths: list[Path]) -> str:
        seen.append([p.name for p in paths])
        return digest(paths)

    monkeypatch.setattr(artifact_hash, "_digest", counting)
    return seen


def test_the_digest_covers_each_files_name_and_bytes_in_order(tmp_path: Path, reads: list[list[str]]) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    assert artifact_sha256([a, b]) == hashlib.sha256(b"a.safetensors|first" + b"b.safetensors|second").hexdigest()
    assert artifact_sha256([b, a]) != artifact_sha256([a, b])


def test_an_unchanged_file_is_not_read_again_and_a_rewritten_one_is(tmp_path: Path, reads: list[list[str]]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights v1")
    first = artifact_sha256([model])
    assert artifact_sha256([model]) == first
    assert reads == [["m.gguf"]]
    before = model.stat()
    model.write_bytes(b"weights v2")
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size and mtime: only ctime tells
    assert artifact_sha256([model]) == hashlib.sha256(b"m.gguf|weights v2").hexdigest() != first
    assert reads == [["m.gguf"], ["m.gguf"]]
    assert len(list(hashes_dir().glob("*.json"))) == 1


def test_a_cache_that_cannot_be_written_only_means_hashing_again(tmp_path: Path, reads: list[list[str]]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    hashes_dir().parent.mkdir(parents=True)
    hashes_dir().write_text("a file where the folder should be")
    assert artifact_sha256([model]) == artifact_sha256([model]) == hashlib.sha256(b"m.gguf|weights").hexdigest()
    assert reads == [["m.gguf"], ["m.gguf"]]
