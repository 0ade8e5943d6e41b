"""An error or interrupt after a commit's catalog is published: the commit stands.

Injected at each step after the rename of the catalog (inside the publish, the pins, the
collection of the commit's garbage, the removal of the parts it replaced): a
KeyboardInterrupt propagates and an OSError is logged; either way the statement's
change is the published version, its files are kept (the connection goes on with it), and
a new connection reads every row, passes ``check()`` and, opening as a writer (garbage
collection), loses nothing."""

from __future__ import annotations

import logging
import os

import pytest

import cryptdisk
import cryptdisk.db._database as database_module
import cryptdisk.format._open as open_module
from cryptdisk.db._maintenance import MaintenanceMixin
from cryptdisk.keys import Key

#: statement -> (what it runs on a connection, the steps after the publish it reaches)
ALL = ("rename", "pins", "collect", "remove")
ADDS = ("rename", "pins", "collect")  # replaces no parts


def _insert(db):
    db.sql("INSERT INTO t SELECT i, 'n' FROM range(1000, 1100) r(i)")


def _delete(db):
    db.sql("DELETE FROM t WHERE id < 10")


def _update(db):
    db.sql("UPDATE t SET v = 'x' WHERE id < 10")


def _drop(db):
    db.sql("DROP TABLE t")


def _optimize(db):
    db.sql("OPTIMIZE TABLE t FINAL")


def _alter(db):
    db.sql("ALTER TABLE t ADD COLUMN z INTEGER DEFAULT 7")


def _alter_not_null(db):
    db.sql("ALTER TABLE t ALTER COLUMN v SET NOT NULL")


def _view(db):
    db.sql("CREATE VIEW w AS SELECT id FROM t WHERE id < 5")


def _rotate(db):
    db.rotate_keys(new_key=Key(2, os.urandom(32)))


def _rows(db, sql):
    return [tuple(r.values()) for r in db.sql(sql).to_pylist()]


def _ids(db):
    return [r[0] for r in _rows(db, "SELECT id FROM t ORDER BY id")]


BEFORE = list(range(1000))

#: name -> (run, points, check of the state after it on a connection)
OPS = {
    "insert": (_insert, ADDS, lambda db: _ids(db) == BEFORE + list(range(1000, 1100))),
    "delete": (_delete, ALL, lambda db: _ids(db) == BEFORE[10:]),
    "update": (_update, ALL, lambda db: _rows(db, "SELECT count(*) FROM t WHERE v = 'x'")
               == [(10,)] and _ids(db) == BEFORE),
    "drop": (_drop, ALL, lambda db: "t" not in db.catalog.tables),
    "optimize": (_optimize, ALL, lambda db: _ids(db) == BEFORE
                 and len(db.table("t").parts) == 1),
    "alter": (_alter, ALL, lambda db: _rows(db, "SELECT DISTINCT z FROM t") == [(7,)]
              and _ids(db) == BEFORE),
    "alter_not_null": (_alter_not_null, ADDS, lambda db: "v" in db.table("t").not_null),
    "view": (_view, ADDS, lambda db: _rows(db, "SELECT count(*) FROM w") == [(5,)]),
    "rotate": (_rotate, ("rename", "pins", "collect"),
               lambda db: db.keyring.current_key_id == 2 and _ids(db) == BEFORE),
}


class _Armed:
    """Raises ``exc`` once, at the first call after the statement starts."""

    def __init__(self, exc):
        self.exc, self.armed, self.fired = exc, False, False

    def fire(self):
        if self.armed and not self.fired:
            self.fired = True
            raise self.exc


def _inject(monkeypatch, point, trap):
    if point == "rename":  # right after os.replace of the catalog, inside publish()
        real = open_module._fsync_dir

        def fsync_dir(path):
            if os.path.basename(path) == "catalog":
                trap.fire()
            real(path)
        monkeypatch.setattr(open_module, "_fsync_dir", fsync_dir)
    elif point == "pins":
        real_pin = database_module.write_pin

        def write_pin(*a, **k):
            trap.fire()
            return real_pin(*a, **k)
        monkeypatch.setattr(database_module, "write_pin", write_pin)
    else:
        name = "_collect_pending" if point == "collect" else "_remove_parts"
        real_method = getattr(MaintenanceMixin, name)

        def method(self, *a, **k):
            trap.fire()
            return real_method(self, *a, **k)
        monkeypatch.setattr(MaintenanceMixin, name, method)


def _cases():
    for op, (_run, points, _check) in OPS.items():
        for point in points:
            for exc in ("interrupt", "error"):
                yield pytest.param(op, point, exc, id=f"{op}-{point}-{exc}")


@pytest.mark.parametrize(("op", "point", "exc"), list(_cases()))
def test_failure_after_publish_keeps_the_commit(tmp_path, monkeypatch, caplog, op, point, exc):
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (id BIGINT, v VARCHAR) ORDER BY id")
        db.sql("CREATE TABLE u (id BIGINT)")
        db.sql("INSERT INTO u VALUES (1), (2)")
        for lo in range(0, 1000, 250):  # 4 parts
            db.sql(f"INSERT INTO t SELECT i, 's' FROM range({lo}, {lo + 250}) r(i)")
    run, _points, check = OPS[op]
    trap = _Armed(KeyboardInterrupt() if exc == "interrupt" else OSError(5, "injected"))
    _inject(monkeypatch, point, trap)
    db = cryptdisk.connect(path)
    try:
        version = db.catalog.version
        trap.armed = True
        with caplog.at_level(logging.WARNING, logger="cryptdisk.db"):
            if exc == "interrupt":
                with pytest.raises(KeyboardInterrupt):
                    run(db)
            else:
                run(db)  # committed: the statement reports its success
                assert "is committed" in caplog.text or "is published" in caplog.text
        assert trap.fired
        trap.armed = False
        assert db.catalog.version == version + 1  # the published version, in memory too
        assert check(db)
        db.sql("INSERT INTO u VALUES (3)")  # the next commit of this connection keeps it
        assert check(db)
    finally:
        db.close()
    monkeypatch.undo()
    for _round in range(2):  # the second open collects what the first one's garbage left
        with cryptdisk.connect(path) as again:  # a writer: collects garbage
            assert again.catalog.version == version + 2
            assert check(again)
            assert _rows(again, "SELECT id FROM u ORDER BY id") == [(1,), (2,), (3,)]
            assert again.check() > 0
    with cryptdisk.connect(path, read_only=True) as reader:
        assert check(reader)
        assert reader.check() > 0


@pytest.mark.parametrize("exc", ["interrupt", "error"])
@pytest.mark.parametrize("op", [op for op in OPS if op != "rotate"])
def test_failure_before_publish_undoes_the_change(tmp_path, monkeypatch, op, exc):
    """The counterpart: a commit that fails before the rename changes nothing, in memory
    or in the catalog on disk."""
    from cryptdisk.db._catalog import Catalog

    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (id BIGINT, v VARCHAR) ORDER BY id")
        for lo in range(0, 1000, 250):
            db.sql(f"INSERT INTO t SELECT i, 's' FROM range({lo}, {lo + 250}) r(i)")
    trap = _Armed(KeyboardInterrupt() if exc == "interrupt" else OSError(5, "injected"))
    real = Catalog.to_json

    def to_json(self):
        trap.fire()
        return real(self)
    monkeypatch.setattr(Catalog, "to_json", to_json)
    run, _points, _check = OPS[op]
    with cryptdisk.connect(path) as db:
        before = db.catalog.to_json()
        trap.armed = True
        with pytest.raises(KeyboardInterrupt if exc == "interrupt" else OSError):
            run(db)
        assert trap.fired
        assert db.catalog.to_json() == before  # undone in memory
        assert _ids(db) == BEFORE
    monkeypatch.undo()
    with cryptdisk.connect(path) as db:
        assert db.catalog.to_json() == before
        assert _ids(db) == BEFORE
        assert db.check() > 0
