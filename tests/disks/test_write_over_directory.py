"""A file written where a directory is, or below a file, on the disks over a directory.

(Object stores keep ``d`` and ``d/f`` as two independent keys: not checked there.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cryptdisk.errors import DiskError, DiskIsADirectoryError

from .conftest import DISK_KINDS

OVER_A_DIRECTORY = ["local", "fsspec-file", "encrypted-local", "encrypted-names-local",
                    "clickhouse-local"]


@pytest.mark.parametrize("kind", OVER_A_DIRECTORY)
def test_a_file_is_not_written_over_a_directory_or_below_a_file(kind: str,
                                                                tmp_path: Path) -> None:
    disk = DISK_KINDS[kind](tmp_path, lambda: "")
    disk.write_bytes("d/f", b"x")
    # Refused when opened: the caller writes nothing that could only be lost.
    with pytest.raises(DiskIsADirectoryError) as exc:
        disk.open_write("d")
    assert str(exc.value).startswith("d: ") and repr(disk.name) in str(exc.value)
    with pytest.raises(DiskError) as exc2:
        disk.write_bytes("d/f/g", b"z")
    assert str(exc2.value).startswith("d/f/g: ") and repr(disk.name) in str(exc2.value)
    assert disk.list() == ["d/f"] and disk.read_bytes("d/f") == b"x"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".cdtmp")]


@pytest.mark.parametrize("kind", OVER_A_DIRECTORY)
def test_a_file_is_not_renamed_over_a_directory_or_below_a_file(kind: str,
                                                                tmp_path: Path) -> None:
    # The errors name the destination on the disk called, never a backing path.
    disk = DISK_KINDS[kind](tmp_path, lambda: "")
    disk.write_bytes("d/f", b"x")
    disk.write_bytes("a", b"a")
    with pytest.raises(DiskIsADirectoryError) as exc:
        disk.rename("a", "d")
    assert str(exc.value).startswith("d: ") and repr(disk.name) in str(exc.value)
    assert str(tmp_path) not in str(exc.value)
    for dst in ("a/b", "d/f/g"):
        with pytest.raises(DiskError) as exc2:
            disk.rename("a", dst)
        assert str(exc2.value).startswith(f"{dst}: ") and repr(disk.name) in str(exc2.value)
        assert "a parent directory of it is a file" in str(exc2.value)
        assert str(tmp_path) not in str(exc2.value)
    assert disk.list() == ["a", "d/f"]
    assert disk.read_bytes("a") == b"a" and disk.read_bytes("d/f") == b"x"
