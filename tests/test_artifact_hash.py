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


def test_the_digest_covers_the_files_bytes_alone_whatever_they_are_called_or_listed_in(tmp_path: Path, reads: list[list[str]]) -> None:
    """Names were mixed in: a renamed copy of the same GGUF read as DIFFERENT WEIGHTS, and the
    weights hash of one file was not the SHA-256 `sha256sum` prints."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    each = sorted(hashlib.sha256(data).hexdigest() for data in (b"first", b"second"))
    assert artifact_sha256([a, b]) == artifact_sha256([b, a]) == hashlib.sha256(f"{each[0]}\n{each[1]}\n".encode()).hexdigest()
    renamed = tmp_path / "copy" / "model.gguf"
    renamed.parent.mkdir()
    renamed.write_bytes(b"first")
    assert artifact_sha256([renamed]) == artifact_sha256([a]) == hashlib.sha256(b"first").hexdigest()


def test_an_unchanged_file_is_not_read_again_and_a_rewritten_one_is(tmp_path: Path, reads: list[list[str]]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights v1")
    first = artifact_sha256([model])
    assert artifact_sha256([model]) == first
    assert reads == [["m.gguf"]]
    before = model.stat()
    model.write_bytes(b"weights v2")
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size and mtime: only ctime tells
    assert artifact_sha256([model]) == hashlib.sha256(b"weights v2").hexdigest() != first
    assert reads == [["m.gguf"], ["m.gguf"]]
    assert len(list(hashes_dir().glob("*.json"))) == 1


def test_a_cache_that_cannot_be_written_only_means_hashing_again(tmp_path: Path, reads: list[list[str]]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    hashes_dir().parent.mkdir(parents=True)
    hashes_dir().write_text("a file where the folder should be")
    assert artifact_sha256([model]) == artifact_sha256([model]) == hashlib.sha256(b"weights").hexdigest()
    assert reads == [["m.gguf"], ["m.gguf"]]
