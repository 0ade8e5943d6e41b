"""Encrypted SQLite used as applications use SQLite: threads, sqlite3-style code, an ORM."""

from __future__ import annotations

import sqlite3
import threading
import time

import apsw
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.sqlite import dbapi


@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_threads_each_with_a_connection_commit_every_row(tmp_path, keyring, mode):
    """The common server pattern: a connection per thread, short write transactions
    contending for the one write lock, readers beside them; SQLite's busy timeout
    makes them take turns and every commit lands."""
    path = tmp_path / "threads.db"
    setup = csql.connect(str(path), keyring=keyring)
    setup.execute(f"PRAGMA journal_mode={mode}")
    setup.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, who INTEGER, n INTEGER)")
    setup.close()
    errors: list[BaseException] = []
    seen: list[list[int]] = []

    def writer(who: int) -> None:
        try:
            conn = csql.connect(str(path), keyring=keyring, busy_timeout_ms=60_000)
            for n in range(40):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t(who, n) VALUES (?, ?)", (who, n))
                conn.execute("COMMIT")
            conn.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    def reader() -> None:
        try:
            conn = csql.connect(str(path), keyring=keyring, busy_timeout_ms=60_000)
            counts = []
            for _ in range(40):
                counts.append(conn.execute("SELECT count(*) FROM t").fetchall()[0][0])
            seen.append(counts)
            conn.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(who,)) for who in range(6)]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen and seen[0] == sorted(seen[0])  # a reader never sees a commit undone
    check = csql.connect(str(path), keyring=keyring)
    rows = check.execute("SELECT who, count(*), max(n) FROM t GROUP BY who").fetchall()
    assert rows == [(who, 40, 39) for who in range(6)]
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check.close()


def test_the_python_vfs_sleeps_without_the_gil(keyring):
    """SQLite's busy handler sleeps through the VFS while another connection holds a
    lock; with the Python VFS that holder is usually another thread of this process and
    needs the GIL for each call into the VFS. A sleep that kept the GIL stalled it for
    the whole sleep (eight threads committing in turn took minutes, and busy timeouts
    expired). Here the main thread must run while another thread sleeps there."""
    vfs = csql.vfs_for(keyring, "python")
    asleep = threading.Event()
    started: list[float] = []

    def sleeper() -> None:
        started.append(time.monotonic())
        asleep.set()
        vfs.xSleep(2_000_000)  # microseconds

    thread = threading.Thread(target=sleeper)
    thread.start()
    asleep.wait()
    time.sleep(0.05)  # let the sleeper reach xSleep
    ran_at = time.monotonic()  # needs the GIL: after the sleep if xSleep held it
    thread.join()
    assert ran_at < started[0] + 2.0


def test_isolation_level_as_sqlite3_has_it(tmp_path, keyring):
    path = tmp_path / "iso.db"
    conn = dbapi.connect(path, keyring=keyring)
    assert conn.isolation_level == ""
    conn.execute("CREATE TABLE t(v)")
    conn.commit()

    # None: no implicit transaction, every statement commits on its own
    auto = dbapi.connect(path, keyring=keyring, isolation_level=None)
    auto.execute("INSERT INTO t VALUES (1)")
    assert not auto.in_transaction
    auto.rollback()  # nothing to roll back
    assert conn.execute("SELECT v FROM t").fetchall() == [(1,)]

    # setting None commits the open transaction first, as sqlite3 does
    conn.execute("INSERT INTO t VALUES (2)")
    assert conn.in_transaction
    conn.isolation_level = None
    assert not conn.in_transaction
    assert auto.execute("SELECT count(*) FROM t").fetchall() == [(2,)]

    # EXCLUSIVE: the implicit BEGIN is BEGIN EXCLUSIVE, so other connections cannot
    # even read until it ends (rollback-journal mode); the default lets them read
    conn.isolation_level = "EXCLUSIVE"
    other = dbapi.connect(path, keyring=keyring, busy_timeout_ms=0)
    conn.execute("INSERT INTO t VALUES (3)")
    with pytest.raises(dbapi.OperationalError, match="locked"):
        other.execute("SELECT count(*) FROM t").fetchall()
    conn.commit()
    conn.isolation_level = ""
    conn.execute("INSERT INTO t VALUES (4)")
    assert other.execute("SELECT count(*) FROM t").fetchall() == [(3,)]
    conn.commit()

    for bad, error in (("SOMETIMES", ValueError), (1, TypeError)):
        with pytest.raises(error):
            conn.isolation_level = bad  # type: ignore[assignment]
        with pytest.raises(error):
            dbapi.connect(path, keyring=keyring, isolation_level=bad)
    for each in (conn, auto, other):
        each.close()


def test_functions_aggregates_and_collations_as_sqlite3_registers_them(tmp_path, keyring):
    conn = dbapi.connect(tmp_path / "fn.db", keyring=keyring)
    conn.execute("CREATE TABLE t(name TEXT, n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [("b", 2), ("A", 3), ("c", 4)])
    conn.create_function("twice", 1, lambda x: 2 * x, deterministic=True)

    class Product:
        def __init__(self) -> None:
            self.value = 1

        def step(self, n: int) -> None:
            self.value *= n

        def finalize(self) -> int:
            return self.value

    conn.create_aggregate("product", 1, Product)
    conn.create_collation("nocase_rev",
                          lambda a, b: (b.lower() > a.lower()) - (b.lower() < a.lower()))
    assert conn.execute("SELECT twice(n) FROM t ORDER BY n").fetchall() == [(4,), (6,), (8,)]
    assert conn.execute("SELECT product(n) FROM t").fetchall() == [(24,)]
    assert conn.execute("SELECT name FROM t ORDER BY name COLLATE nocase_rev").fetchall() == [
        ("c",), ("b",), ("A",)]
    conn.create_function("twice", 1, None)
    with pytest.raises(dbapi.OperationalError, match="no such function"):
        conn.execute("SELECT twice(1)")
    conn.close()


def test_sqlalchemy_orm_on_an_encrypted_file(tmp_path, keyring):
    """SQLAlchemy's sqlite dialect over cryptdisk's DB-API module: a file URL (so the
    pool is a QueuePool of connections, one per thread at a time) and ``creator``."""
    path = tmp_path / "orm.db"
    engine = sa.create_engine(f"sqlite:///{path}",
                              creator=lambda: dbapi.connect(path, keyring=keyring))

    class Base(DeclarativeBase):
        pass

    class User(Base):
        __tablename__ = "users"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str]

    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([User(name="ada lovelace"), User(name="bob")])
        session.commit()
    with Session(engine) as session, pytest.raises(ZeroDivisionError):
        session.add(User(name="eve"))
        session.flush()
        raise ZeroDivisionError  # the session rolls back
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.insert(User.__table__).values(name="cy"))  # no commit() needed
    with Session(engine) as session:
        names = session.scalars(sa.select(User.name).where(User.name.regexp_match("^[a-c]"))
                                .order_by(User.id)).all()
    assert names == ["ada lovelace", "bob", "cy"]
    engine.dispose()
    raw = path.read_bytes()
    assert raw[:8] == b"CRYPTDSK" and b"ada lovelace" not in raw


def test_a_backup_writes_plaintext_only_when_asked_to(tmp_path, keyring):
    """conn.backup into a plain apsw connection would copy the rows to disk unencrypted:
    refused unless plaintext=True. Encrypted and in-memory targets need nothing."""
    src = dbapi.connect(tmp_path / "src.db", keyring=keyring)
    src.execute("CREATE TABLE t(v)")
    src.executemany("INSERT INTO t VALUES (?)", [(f"MARKER-{i}",) for i in range(100)])
    src.commit()

    plain_path = tmp_path / "plain.db"
    plain = apsw.Connection(str(plain_path))
    with pytest.raises(ValueError, match="plaintext=True"):
        src.backup(plain)
    assert not plain_path.exists() or b"MARKER-" not in plain_path.read_bytes()
    src.backup(plain, plaintext=True)  # on purpose, as `cryptdisk sqlite decrypt` does
    plain.close()
    assert b"MARKER-" in plain_path.read_bytes()

    for target in (csql.connect(str(tmp_path / "enc.db"), keyring=keyring),
                   apsw.Connection(":memory:")):
        src.backup(target)
        assert target.execute("SELECT count(*) FROM t").fetchall() == [(100,)]
        target.close()
    assert b"MARKER-" not in (tmp_path / "enc.db").read_bytes()

    with pytest.raises(TypeError, match="sqlite3"):
        src.backup(sqlite3.connect(tmp_path / "s3.db"))  # type: ignore[arg-type]
    src.close()


def test_a_plain_sqlite_database_is_named_as_one(tmp_path, keyring):
    """Opening a plain SQLite file through the encrypted VFS (connect, or ATTACH) says it
    is a plain SQLite database and how to encrypt it, not only "no CRYPTDSK header"."""
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE t(v)")
    conn.commit()
    conn.close()
    with pytest.raises(cryptdisk.NotEncryptedError, match="unencrypted") as info:
        csql.connect(str(plain), keyring=keyring)
    assert "cryptdisk sqlite encrypt" in (info.value.hint or "")
    enc = csql.connect(str(tmp_path / "enc.db"), keyring=keyring)
    with pytest.raises(cryptdisk.NotEncryptedError, match="unencrypted"):
        enc.execute(f"ATTACH '{plain}' AS p")
    enc.close()
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 8192)  # not SQLite either: the format's message
    with pytest.raises(cryptdisk.NotEncryptedError, match="no CRYPTDSK header"):
        csql.connect(str(other), keyring=keyring)
