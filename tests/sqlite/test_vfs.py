"""The Python VFS (``implementation="python"``): the codes SQLite gets when a file
operation fails, and the errors the caller gets."""

from __future__ import annotations

import errno
import os

import apsw
import pytest

import cryptdisk.sqlite as csql
from cryptdisk.errors import KeyProviderError
from cryptdisk.sqlite import _vfs


@pytest.fixture(autouse=True)
def vfs_implementation() -> None:
    """These tests are of the Python VFS (overrides conftest's run-under-both)."""


def _fail_new_headers(monkeypatch, allowed: int, error: Exception) -> None:
    """New files' headers cannot be made once ``allowed`` were (a key provider that
    went away); existing files' headers are still read."""
    made = [0]
    real = _vfs.header_and_key

    def header_and_key(keyring, path, read, *args):
        if read is None:
            made[0] += 1
            if made[0] > allowed:
                raise error
        return real(keyring, path, read, *args)

    monkeypatch.setattr(_vfs, "header_and_key", header_and_key)


def _rows(conn) -> list:
    return conn.execute("SELECT s FROM f ORDER BY id").fetchall()


def test_a_rollback_whose_journal_cannot_be_made_leaves_no_change_behind(
        tmp_path, keyring, monkeypatch):
    """A statement failing in a function is rolled back, which writes its journal: when
    the journal's header cannot be made then, SQLite gets an I/O error, which makes the
    connection drop its changed pages (with the generic error apsw answers for a Python
    exception, it kept them: the connection saw 'ax', then 'axx', never committed)."""
    path = str(tmp_path / "f.db")
    conn = csql.connect(path, keyring=keyring, implementation="python")
    other = csql.connect(path, keyring=keyring, implementation="python")
    conn.execute("CREATE TABLE f(id INTEGER PRIMARY KEY, s TEXT)")
    conn.execute("INSERT INTO f VALUES (1, 'a'), (2, 'b'), (3, 'c')")

    def boom(value):
        if value == "b":
            raise ValueError("refused")
        return value + "x"

    conn.create_scalar_function("boom", boom)
    _fail_new_headers(monkeypatch, 2, OSError("the key provider is unreachable"))
    for _ in range(5):
        with pytest.raises((ValueError, OSError), match=r"refused|unreachable"):
            conn.execute("UPDATE f SET s = boom(s)")
        assert _rows(conn) == [("a",), ("b",), ("c",)]
        assert _rows(other) == [("a",), ("b",), ("c",)]
    with pytest.raises(OSError, match="unreachable"):  # a write that needs a journal says why
        conn.execute("UPDATE f SET s = 'z' WHERE id = 1")
    assert _rows(conn) == _rows(other) == [("a",), ("b",), ("c",)]
    monkeypatch.undo()
    conn.execute("UPDATE f SET s = 'y' WHERE id = 1")  # and the connection writes again
    assert _rows(other) == [("y",), ("b",), ("c",)]
    assert not os.path.exists(path + "-journal")
    conn.close()
    other.close()


@pytest.mark.parametrize("error", [
    OSError(errno.EACCES, "Permission denied", "/run/keys/db.key"),
    OSError(errno.ENOSPC, "No space left on device", "/run/keys/db.key"),
    KeyProviderError("kms: key ref 7: timed out", hint="retry later", transient=True),
], ids=["os", "full", "cryptdisk"])
def test_a_failed_write_is_an_io_error_to_sqlite_and_the_same_error_to_the_caller(
        tmp_path, keyring, monkeypatch, error):
    conn = csql.connect(str(tmp_path / "e.db"), keyring=keyring, implementation="python")
    _fail_new_headers(monkeypatch, 0, error)
    with pytest.raises(type(error)) as raised:
        conn.execute("CREATE TABLE f(id INTEGER PRIMARY KEY, s TEXT)")
    got = raised.value
    if getattr(error, "errno", None) == errno.ENOSPC:  # SQLITE_FULL, as the C VFS answers
        assert isinstance(got, apsw.FullError) and got.extendedresult == apsw.SQLITE_FULL
    else:  # what made SQLite see SQLITE_IOERR
        assert isinstance(got, apsw.IOError) and got.extendedresult & 0xFF == apsw.SQLITE_IOERR
    assert type(got).__name__ == type(error).__name__
    assert str(got) == str(error) and got.args == error.args
    if isinstance(error, OSError):
        assert (got.errno, got.strerror, got.filename) == (
            error.errno, error.strerror, "/run/keys/db.key")
    else:
        assert (got.hint, got.transient) == ("retry later", True)
    monkeypatch.undo()
    conn.execute("CREATE TABLE f(id INTEGER PRIMARY KEY, s TEXT)")  # nothing was left behind
    conn.close()


@pytest.mark.parametrize("original", [
    KeyProviderError("the key provider is unreachable"),
    OSError(errno.ENOSPC, "No space left on device", "/tmp/x.db-journal"),
    OSError(errno.EIO, "Input/output error"),
], ids=["provider", "enospc", "eio"])
def test_the_io_error_copy_pickles_as_the_original_error(original):
    """The copy that answers SQLite an I/O error pickles (a process pool, a Dask worker
    sending it back) as the original class, with its message and attributes."""
    import pickle

    made = _vfs._io_error(original, int(apsw.mapping_extended_result_codes["SQLITE_IOERR_WRITE"]))
    assert isinstance(made, apsw.Error)
    back = pickle.loads(pickle.dumps(made))
    assert type(back) is type(original)
    assert str(back) == str(original) and back.args == original.args
    assert getattr(back, "filename", None) == getattr(original, "filename", None)
    assert not hasattr(back, "extendedresult")
