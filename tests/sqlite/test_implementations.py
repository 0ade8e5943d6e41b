"""The C and Python VFSes write the same files: each reads what the other wrote."""

from __future__ import annotations

import os
import random
import re

import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.errors import ConfigError
from cryptdisk.format import Algorithm, Header
from cryptdisk.sqlite import _connect, _native


@pytest.fixture(autouse=True)
def vfs_implementation() -> None:
    """These tests name their implementations (overrides conftest's run-under-both)."""


def test_the_c_vfs_was_built():
    # CI installs with a compiler and libssl-dev; a missing C VFS is a build failure.
    assert _native.available()
    assert csql.implementation("c") == "c"


def test_the_c_vfs_names_the_library_of_its_cipher():
    # CI installs libgcrypt20-dev, so the build takes libgcrypt's AES-GCM (setup.py);
    # CRYPTDISK_CIPHER=openssl is the documented way to build the OpenSSL variant.
    name = _native.cipher_library()
    want = "OpenSSL" if os.environ.get("CRYPTDISK_CIPHER") == "openssl" else "libgcrypt"
    assert re.fullmatch(rf"{want} \d+\.\d+\.\d+.*", name), name


@pytest.mark.parametrize(("writer", "reader"), [("c", "python"), ("python", "c")])
def test_aes_128_files_are_read_by_the_other(tmp_path, writer, reader):
    """A 16-byte key gives AES-128-GCM data keys; the C cipher takes those too."""
    keyring = cryptdisk.Keyring([cryptdisk.Key(7, os.urandom(16))])
    path = tmp_path / "x.db"
    conn = csql.connect(str(path), keyring=keyring, implementation=writer)
    conn.execute("PRAGMA journal_mode=WAL")
    _write(conn, 4, 300)
    expected = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    other = csql.connect(str(path), keyring=keyring, implementation=reader)  # WAL still there
    assert other.execute("SELECT id, v FROM t ORDER BY id").fetchall() == expected
    other.close()
    conn.close()
    assert Header.parse(path.read_bytes()[:128]).algorithm == Algorithm.AES_128_GCM
    with cryptdisk.open(str(path), "rb", keyring=keyring) as f:  # the format's own reader
        assert f.read(16) == b"SQLite format 3\0"


def test_default_follows_the_environment(monkeypatch, keyring, tmp_path):
    monkeypatch.delenv("CRYPTDISK_SQLITE_VFS", raising=False)
    assert csql.implementation() == "c"
    monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", "python")
    assert csql.implementation() == "python"
    assert isinstance(csql.vfs_for(keyring), csql.EncryptedVFS)
    assert isinstance(csql.vfs_for(keyring, "c"), csql.NativeVFS)
    assert csql.vfs_for(keyring, "c") is csql.vfs_for(keyring, "c")


def test_unknown_implementation_is_a_clear_error(monkeypatch, keyring, tmp_path):
    with pytest.raises(ConfigError, match="implementation must be one of c, python, not 'rust'"):
        csql.connect(str(tmp_path / "x.db"), keyring=keyring, implementation="rust")
    monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", "fast")
    with pytest.raises(ConfigError, match="CRYPTDISK_SQLITE_VFS must be one of"):
        csql.connect(str(tmp_path / "x.db"), keyring=keyring)


def test_asking_for_c_when_it_was_not_built(monkeypatch, keyring, tmp_path):
    monkeypatch.setattr(_native, "_cvfs", None)
    monkeypatch.delenv("CRYPTDISK_SQLITE_VFS", raising=False)
    monkeypatch.setattr(_connect, "_fallback_warned", False)
    with pytest.warns(RuntimeWarning, match="C VFS was not built"):
        assert csql.implementation() == "python"  # the fallback, said once
    with pytest.raises(ConfigError, match=r"C VFS of cryptdisk\.sqlite was not built") as info:
        csql.connect(str(tmp_path / "x.db"), keyring=keyring, implementation="c")
    assert "libssl-dev" in (info.value.hint or "")
    assert "libgcrypt20-dev" in (info.value.hint or "")


def _write(conn, seed: int, rows: int) -> None:
    rnd = random.Random(seed)
    conn.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
    for start in range(0, rows, 50):
        with conn:
            for i in range(start, min(start + 50, rows)):
                conn.execute("INSERT OR REPLACE INTO t VALUES(?, ?)",
                             (rnd.randrange(rows), rnd.randbytes(rnd.randrange(1, 3000))))


@pytest.mark.parametrize("journal", ["delete", "wal", "truncate", "persist"])
@pytest.mark.parametrize("page_size", [512, 4096, 65536])
@pytest.mark.parametrize(("writer", "reader"), [("c", "python"), ("python", "c")])
def test_one_writes_the_other_reads(tmp_path, keyring, journal, page_size, writer, reader):
    path = str(tmp_path / "x.db")
    conn = csql.connect(path, keyring=keyring, implementation=writer)
    conn.execute(f"PRAGMA page_size={page_size}")
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA cache_size=5")  # spill pages mid-transaction
    _write(conn, 1, 600)
    expected = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    conn.close()
    other = csql.connect(path, keyring=keyring, implementation=reader)
    assert other.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert other.execute("SELECT id, v FROM t ORDER BY id").fetchall() == expected
    _write(other, 2, 300)  # and writes on where the first left off
    expected = other.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    other.close()
    back = csql.connect(path, keyring=keyring, implementation=writer)
    assert back.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert back.execute("SELECT id, v FROM t ORDER BY id").fetchall() == expected
    back.close()


def test_a_wal_left_by_one_is_recovered_by_the_other(tmp_path, keyring):
    """Committed frames still in the WAL (no checkpoint) are read by the other VFS."""
    path = str(tmp_path / "w.db")
    conn = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    _write(conn, 3, 400)
    expected = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    reader = csql.connect(path, keyring=keyring, implementation="python")  # while open
    assert reader.execute("SELECT id, v FROM t ORDER BY id").fetchall() == expected
    reader.close()
    conn.close()


def test_a_sealed_file_is_not_taken_for_a_database(tmp_path, keyring):
    path = tmp_path / "sealed.db"
    with cryptdisk.open(path, "wb", keyring=keyring) as f:
        f.write(b"SQLite format 3\0" + bytes(4080))
    for impl in csql.IMPLEMENTATIONS:
        with pytest.raises(cryptdisk.errors.MalformedHeaderError, match="sealed cryptdisk file"):
            csql.connect(str(path), keyring=keyring, implementation=impl).close()
