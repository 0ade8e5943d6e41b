"""TailSave, the side file of a segment rewritten in place: a short write is finished, and
a write that fails is an OSError naming the side file."""

from __future__ import annotations

import errno
import os

import pytest

from cryptdisk.format import TailSave, remove_tail


def test_a_short_write_is_finished(tmp_path, monkeypatch):
    real = os.pwritev
    calls = []

    def short(fd: int, buffers: list, offset: int) -> int:  # as a nearly full disk does
        calls.append(offset)
        return real(fd, [b"".join(bytes(b) for b in buffers)[:10]], offset)

    monkeypatch.setattr(os, "pwritev", short)
    saved = TailSave(str(tmp_path / "f"))
    record = os.urandom(544)
    saved.save(3, memoryview(record))
    into = bytearray(600)
    assert calls == [0]
    assert saved.load(3, memoryview(into)) == 544 and bytes(into[:544]) == record
    saved.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_an_error_naming_the_side_file(tmp_path):
    os.symlink("/dev/full", tmp_path / "f-cdtail")  # every write fails with ENOSPC
    saved = TailSave(str(tmp_path / "f"))
    with pytest.raises(OSError, match="f-cdtail") as e:
        saved.save(0, memoryview(b"r" * 64))
    assert e.value.errno == errno.ENOSPC
    saved.close()


def test_a_directory_is_an_error_naming_it(tmp_path):
    (tmp_path / "f-cdtail").mkdir()
    with pytest.raises(IsADirectoryError, match="f-cdtail"):
        TailSave(str(tmp_path / "f")).save(0, memoryview(b"r" * 64))


def test_removing_a_side_file_that_cannot_be_removed_is_not_an_error(tmp_path):
    (tmp_path / "f-cdtail").mkdir()  # unlink fails with EISDIR
    remove_tail(str(tmp_path / "f"))
    assert (tmp_path / "f-cdtail").is_dir()
