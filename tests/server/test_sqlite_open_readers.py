"""--sqlite: a client's open read transaction and the writers (docs/server-operations.md,
Transactions). With a rollback journal a transaction that has read holds SQLite's shared
lock until it ends, so a writer's COMMIT waits for it (lock_timeout, then 55P03); in WAL
mode readers never hold writers back."""

from __future__ import annotations

import psycopg
import pytest

from cryptdisk.server._engines import SQLiteEngine


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_an_idle_read_transaction_and_a_writer(tmp_path, keyring, start_server, journal):
    engine = SQLiteEngine(tmp_path / "s.db", keyring, busy_timeout_ms=500)
    session = engine.open_session()
    session.run(f"PRAGMA journal_mode={journal}", [])
    session.run("CREATE TABLE acc(id INTEGER PRIMARY KEY, bal INTEGER)", [])
    session.run("INSERT INTO acc VALUES (1, 0)", [])
    session.close()
    srv = start_server(engine)
    reader = psycopg.connect(**srv.dsn)  # psycopg's default: a transaction per statement
    writer = psycopg.connect(**srv.dsn)
    try:
        assert reader.execute("SELECT bal FROM acc").fetchall() == [(0,)]  # left open
        if journal == "wal":
            writer.execute("UPDATE acc SET bal = bal + 1")
            writer.commit()
            assert reader.execute("SELECT bal FROM acc").fetchall() == [(0,)]  # its snapshot
            reader.rollback()
        else:
            writer.execute("UPDATE acc SET bal = bal + 1")
            with pytest.raises(psycopg.errors.LockNotAvailable):  # 55P03 at COMMIT
                writer.commit()
            writer.rollback()
            reader.rollback()  # the reader's transaction ends: the write goes through
            writer.execute("UPDATE acc SET bal = bal + 1")
            writer.commit()
        assert reader.execute("SELECT bal FROM acc").fetchall() == [(1,)]
    finally:
        reader.close()
        writer.close()
