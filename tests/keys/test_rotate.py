"""Key rotation by rewrapping headers: segments untouched, idempotent, and crash-safe
under SIGKILL of a real `cryptdisk rewrap` process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.format import HEADER_SIZE, read_header
from cryptdisk.keys import iter_files, rewrap_file, rewrap_tree, write_key_file


def _files(root: Path, ring: Keyring, n: int) -> dict[Path, bytes]:
    out = {}
    for i in range(n):
        sub = root / f"d{i % 7}"
        sub.mkdir(exist_ok=True)
        path = sub / f"f{i}.cd"
        data = os.urandom(random.randrange(0, 3000))
        mode = "wb" if i % 3 else "w+b"
        with cryptdisk.open(path, mode, keyring=ring, segment_size=1024) as f:
            f.write(data)
        out[path] = data
    return out


def _key_id(path: Path) -> int:
    with open(path, "rb") as f:
        return read_header(f).key_id


def test_rewrap_changes_only_the_header(tmp_path):
    old, new = Key(1, os.urandom(32)), Key(2, os.urandom(32))
    files = _files(tmp_path, Keyring([old]), 10)
    before = {p: p.read_bytes() for p in files}
    summary = rewrap_tree([tmp_path], Keyring([old, new], current_key_id=2))
    assert summary.rewrapped == 10 and summary.ok
    for p, data in files.items():
        raw = p.read_bytes()
        assert raw[HEADER_SIZE:] == before[p][HEADER_SIZE:]
        assert raw[:HEADER_SIZE] != before[p][:HEADER_SIZE]
        assert _key_id(p) == 2
        with cryptdisk.open(p, "rb", keyring=Keyring([new])) as f:
            assert f.read() == data
    again = rewrap_tree([tmp_path], Keyring([old, new], current_key_id=2))
    assert again.rewrapped == 0 and again.already_current == 10


def test_rewrap_reports_files_it_cannot_open(tmp_path):
    old, new = Key(1, os.urandom(32)), Key(2, os.urandom(32))
    _files(tmp_path, Keyring([old]), 3)
    (tmp_path / "plain.txt").write_text("not encrypted")
    summary = rewrap_tree([tmp_path], Keyring([new]))
    assert not summary.ok and len(summary.failed) == 3
    assert all("no key with id 1" in why for _, why in summary.failed)
    assert summary.skipped_not_encrypted == [str(tmp_path / "plain.txt")]


def test_rewrap_of_a_tampered_header_fails_without_writing(tmp_path):
    old, new = Key(1, os.urandom(32)), Key(2, os.urandom(32))
    files = _files(tmp_path, Keyring([old]), 1)
    path = next(iter(files))
    raw = bytearray(path.read_bytes())
    raw[20] ^= 1
    path.write_bytes(raw)
    with pytest.raises(cryptdisk.HeaderAuthenticationError):
        rewrap_file(path, Keyring([old, new], current_key_id=2))
    assert path.read_bytes() == bytes(raw)


@pytest.mark.slow
def test_sigkill_during_rewrap_leaves_every_file_readable(tmp_path):
    """Kill a real `cryptdisk rewrap` at random moments; every file must stay readable
    with the old or the new key, and a final run completes the rotation."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    old_m, new_m = os.urandom(32), os.urandom(32)
    write_key_file(tmp_path / "old.hex", old_m)
    write_key_file(tmp_path / "new.hex", new_m)
    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text('[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\nfile = "old.hex"\n'
                   '[[keyring.keys]]\nid = 2\nfile = "new.hex"\n')
    both = Keyring([Key(1, old_m), Key(2, new_m)], current_key_id=2)
    files = _files(data_dir, Keyring([Key(1, old_m)]), 1500)
    rng = random.Random(1234)
    argv = [sys.executable, "-m", "cryptdisk", "rewrap", str(data_dir), "--keyring", str(cfg),
            "-q"]
    subprocess.run(argv, check=True, capture_output=True)
    rewrap_tree([data_dir], both.with_current(1))  # back to the old key
    order = [Path(p) for p in iter_files([data_dir])]  # the order rewrap works in
    kills = 0
    for _trial in range(10):
        # The kill point comes from the process's own progress: the header of the n-th
        # file it still has to rewrap turns to key 2 (a header is one pwrite), then SIGKILL.
        pending = [p for p in order if _key_id(p) == 1]
        mark = pending[rng.randrange(1, len(pending) - 1)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and _key_id(mark) == 1:
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        for path, data in files.items():
            with cryptdisk.open(path, "rb", keyring=both) as f:
                assert f.read() == data
        if sum(_key_id(p) == 2 for p in files) > len(files) // 2:
            rewrap_tree([data_dir], both.with_current(1))  # so later kills land mid-run
    assert kills >= 3, f"only {kills} of 10 runs were killed mid-way"
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "rewrap", str(data_dir),
                           "--keyring", str(cfg), "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 failed" in done.stdout
    only_new = Keyring([Key(2, new_m)])
    for path, data in files.items():
        with cryptdisk.open(path, "rb", keyring=only_new) as f:
            assert f.read() == data
