"""A Ctrl-C in the insert's cleanup steps: no part thread is lost, and a part being
discarded is discarded, then the KeyboardInterrupt is raised (not swallowed)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from cryptdisk.db import _blocks, _parts, _waits
from cryptdisk.disks import LocalDisk


def _part_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "cryptdisk-insert-part"}


def test_a_ctrl_c_as_a_part_thread_starts_loses_no_thread(monkeypatch) -> None:
    before = _part_threads()
    start = _waits.Worker.start

    def start_then_ctrl_c(self: _waits.Worker) -> None:
        start(self)
        raise KeyboardInterrupt  # (as if handled just as start() returned)

    monkeypatch.setattr(_waits.Worker, "start", start_then_ctrl_c)
    pool = _blocks._Pool(2)
    with pytest.raises(KeyboardInterrupt):
        pool.submit(_blocks._Next(iter([])))
    monkeypatch.undo()
    started = _part_threads() - before
    assert len(started) == 1
    pool.close()  # ends it (before: it was not listed, and waited for a job for good)
    for t in started:
        t.join(30)
        assert not t.is_alive()


class _Interrupting:
    """A pyarrow writer whose close() is interrupted by a Ctrl-C."""

    def __init__(self, writer: object) -> None:
        self._writer = writer

    def close(self) -> None:
        self._writer.close()  # type: ignore[attr-defined]
        raise KeyboardInterrupt


def test_a_ctrl_c_while_a_part_is_discarded_is_raised_once_it_is_gone(tmp_path: Path) -> None:
    disk = LocalDisk("d", str(tmp_path))
    schema = pa.schema([("a", pa.int64())])
    w = _parts._PartWriter(disk, "t", schema, version=1, compression="zstd",
                           dictionary=False, key=None)
    w.write(pa.table({"a": list(range(1000))}))
    w._writer = _Interrupting(w._writer)
    with pytest.raises(KeyboardInterrupt):
        w.abort()
    # before: the Ctrl-C left abort() before the disk's temporary file was discarded
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_ctrl_c_while_the_disk_thread_ends_is_not_swallowed(tmp_path: Path) -> None:
    disk = LocalDisk("d", str(tmp_path))
    schema = pa.schema([("a", pa.int64())])
    w = _parts._PartWriter(disk, "t", schema, version=1, compression="zstd",
                           dictionary=False, key=None)
    w.write(pa.table({"a": list(range(1000))}))
    finish = w._sink.finish

    def finish_then_ctrl_c() -> None:
        finish()
        raise KeyboardInterrupt

    w._sink.finish = finish_then_ctrl_c  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):  # before: suppressed, the insert went on
        w.abort()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
