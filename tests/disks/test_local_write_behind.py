"""A local disk starts writing a file back while it is written, so publishing waits less."""

import os

from cryptdisk.disks import _local
from cryptdisk.disks._local import LocalDisk


def test_writeback_starts_every_step_over_the_bytes_written_so_far(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(_local, "WRITE_BEHIND_BYTES", 1000)
    monkeypatch.setattr(_local, "_START_WRITEBACK",
                        lambda fd, offset, length: started.append((os.fstat(fd).st_size,
                                                                   offset, length)))
    disk = LocalDisk("d", str(tmp_path))
    data = os.urandom(4500)
    with disk.open_write("a/f.bin") as f:
        for i in range(0, len(data), 300):
            f.write(data[i : i + 300])
    # consecutive ranges from 0, each started once its bytes had reached the file
    assert [(o, n) for _s, o, n in started] == [(0, 1200), (1200, 1200), (2400, 1200)]
    assert all(size >= o + n for size, o, n in started)
    assert disk.read_bytes("a/f.bin") == data


def test_writes_work_where_writeback_cannot_be_started(tmp_path, monkeypatch):
    monkeypatch.setattr(_local, "WRITE_BEHIND_BYTES", 10)
    monkeypatch.setattr(_local, "_START_WRITEBACK", None)
    disk = LocalDisk("d", str(tmp_path))
    disk.write_bytes("f", b"x" * 100)
    assert disk.read_bytes("f") == b"x" * 100


def test_this_linux_has_sync_file_range():
    import sys

    if sys.platform.startswith("linux"):
        assert _local._START_WRITEBACK is not None
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            _local._START_WRITEBACK(fd, 0, 0)  # callable with the C types it declares
        finally:
            os.close(fd)
