"""Append-only logs (``open_log``): a torn last write is undone from ``-cdlogtail``, only then.

A torn ``pwrite`` is made by hand here: the first pages of the new record over the old
one (what a process killed between two pages of the write leaves).
"""

from __future__ import annotations

import os
import shutil

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.errors import SegmentAuthenticationError
from cryptdisk.format import open_log

KEYRING = Keyring([Key(1, bytes(range(32)))])
LINE = b"x" * 199 + b"\n"


def _read(path) -> bytes:
    with cryptdisk.open(path, "rb", keyring=KEYRING) as f:
        return f.read()


def _torn_append(path, lines: int, tear: int = 8192) -> tuple[bytes, bytes]:
    """Append ``lines`` lines, then one more whose write is cut ``tear`` bytes after the
    start of the last segment; the log before that line, and the file the complete write
    left."""
    with open_log(path, keys=KEYRING, durable=False) as log:
        for _ in range(lines):
            log.write(LINE)
    before = _read(path)
    old = path.read_bytes()
    with open_log(path, keys=KEYRING, durable=False) as log:
        log.write(b"y" * 199 + b"\n")
    new = path.read_bytes()
    cut = len(old) - (len(old) - 128) % (65536 + 32)  # where the last segment starts
    assert cut + tear < len(new)
    path.write_bytes(new[: cut + tear] + old[cut + tear :])
    return before, new


@pytest.mark.parametrize(("lines", "tear"), [
    (1, 300),  # the only segment
    (300, 8192),  # the second segment
    (326, 4096),  # a write that crosses into a fresh segment, torn in the first
    (327, 65568 + 50),  # torn in the fresh one
    (655, 50),  # a line that begins a fresh segment
])
def test_a_torn_append_reads_as_before_and_the_writer_puts_it_back(tmp_path, lines,
                                                                   tear) -> None:
    path = tmp_path / "a.log"
    before, _ = _torn_append(path, lines, tear)
    with pytest.raises(SegmentAuthenticationError):  # torn: without the copy, unreadable
        shutil.copy(path, tmp_path / "copy.log")
        _read(tmp_path / "copy.log")
    assert _read(path) == before  # a reader: the log as it was before the torn line
    with open_log(path, keys=KEYRING) as log:  # a writer: puts the saved record back
        log.write(b"z\n")
    assert _read(path) == before + b"z\n"
    assert _read(path) == before + b"z\n"


def test_a_torn_end_without_an_authentic_copy_still_fails(tmp_path) -> None:
    path = tmp_path / "a.log"
    _torn_append(path, 300)
    saved = str(path) + "-cdlogtail"
    with open(saved, "r+b") as f:  # the saved record no longer authenticates
        byte = f.read(41)[40]
        f.seek(40)
        f.write(bytes([byte ^ 1]))
    with pytest.raises(SegmentAuthenticationError):
        _read(path)
    other = tmp_path / "b.log"  # a copy from another log (another file id) proves nothing
    _torn_append(other, 300)
    shutil.copy(str(other) + "-cdlogtail", saved)
    with pytest.raises(SegmentAuthenticationError):
        _read(path)
    os.unlink(saved)
    with pytest.raises(SegmentAuthenticationError):
        _read(path)


def test_a_complete_write_ignores_the_copy(tmp_path) -> None:
    path = tmp_path / "a.log"
    with open_log(path, keys=KEYRING) as log:
        for _ in range(400):
            log.write(LINE)
    assert os.path.exists(str(path) + "-cdlogtail")
    assert _read(path) == LINE * 400
    with open_log(path, keys=KEYRING) as log:
        log.write(b"end\n")
    assert _read(path) == LINE * 400 + b"end\n"


def test_a_plain_writer_drops_the_copy_it_would_not_keep(tmp_path) -> None:
    path = tmp_path / "a.log"
    with open_log(path, keys=KEYRING) as log:
        log.write(LINE)
    with cryptdisk.open(path, "ab", keyring=KEYRING) as f:  # not a log writer
        f.write(LINE * 400)
    assert not os.path.exists(str(path) + "-cdlogtail")
    assert _read(path) == LINE * 401


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("later", [1, 2])
def test_an_append_into_fresh_segments_cut_between_them_reads_as_before(tmp_path, durable,
                                                                        later) -> None:
    """An append that fills the log's last segment and goes on into ``later`` fresh ones
    is several writes: a process killed between them (here: ``os._exit`` in the child as
    the second write starts) leaves the log as it was, never the first part of the
    append (a cut line) alone; the next writer appends after it."""
    path = tmp_path / "a.log"
    with open_log(path, keys=KEYRING, durable=durable) as log:
        for _ in range(100):  # 20,000 bytes: the first segment partly full
            log.write(LINE)
    before = _read(path)
    big = b"z" * (65536 * later) + b"\n"
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            log = open_log(path, keys=KEYRING, durable=durable)
            store = log._r
            write_run, calls = store._write_run, []

            def cut(run):
                calls.append(run[0][0])
                if len(calls) == 2:
                    os._exit(9)  # killed between the append's two writes
                write_run(run)

            store._write_run = cut
            log.write(big)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 9  # the append was cut between its writes
    assert _read(path) == before
    with open_log(path, keys=KEYRING, durable=durable) as log:
        log.write(b"y" * 199 + b"\n")
    assert _read(path) == before + b"y" * 199 + b"\n"
    with open_log(path, keys=KEYRING, durable=durable) as log:  # and an uncut one
        log.write(big)
    assert _read(path) == before + b"y" * 199 + b"\n" + big
