"""The demo's memory files: paths the libraries open like any file, swapped atomically, nothing on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from discovery.file_source import stat_identity
from router.demo.memory_files import PROC_FD, MemoryFiles
from router.demo.pki import make_pki


def test_a_memory_file_is_opened_by_its_path_and_lives_in_memory() -> None:
    with MemoryFiles() as files:
        path = files.write("endpoints.json", b"{}")
        assert path.parent == PROC_FD and path.read_bytes() == b"{}"
        assert os.readlink(path).startswith("/memfd:endpoints.json")  # memory, not a file system


def test_replacing_a_memory_file_changes_its_bytes_and_identity_as_a_configmap_swap_does() -> None:
    with MemoryFiles() as files:
        path = files.write("endpoints.json", b"old")
        before = stat_identity(path)
        files.replace(path, b"new, longer")
        assert path.read_bytes() == b"new, longer"
        after = stat_identity(path)
        assert after is not None and before is not None and after.inode != before.inode


def test_only_its_own_files_can_be_replaced(tmp_path: Path) -> None:
    with MemoryFiles() as files, pytest.raises(ValueError, match="not one of these memory files"):
        files.replace(tmp_path / "3", b"x")


def test_the_demo_pki_in_memory_loads_like_the_one_on_disk() -> None:
    from aioquic.quic.configuration import QuicConfiguration

    with MemoryFiles() as files:
        pki = make_pki(files)
        assert pki.ca_path.read_bytes() == pki.ca_pem
        config = QuicConfiguration(is_client=False)
        config.load_cert_chain(str(pki.cert_path), str(pki.key_path))  # aioquic opens the paths
        assert config.certificate is not None
