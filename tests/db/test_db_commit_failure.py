"""A commit whose catalog write fails: the files the change wrote, and what is certain.

Failures are injected into the catalog's write (``os.replace`` of the catalog, and the look
at the catalog after it): a failure before the rename leaves the old catalog, and the
change's new files are deleted at once; a failure whose outcome cannot be known (the
rename happened, then even ``stat`` of the catalog fails) keeps every file, raises a
:class:`CatalogError` saying so, and the connection reads the catalog again before its
next statement. Either way the database opens with the old rows or the new ones, every
part the catalog names is on disk, and ``check()`` passes.
"""

from __future__ import annotations

import errno
import io
import os

import pyarrow as pa
import pytest

import cryptdisk
from cryptdisk.errors import CatalogError

from .dbhelpers import write_config

BEFORE = list(range(1000))


def _ids(db):
    return [r[0] for r in db.query("SELECT id FROM t ORDER BY id")]


#: statement -> (what it runs, the ids after it, whether it rewrites the rows)
OPS = {
    "insert": (lambda db: db.sql("INSERT INTO t SELECT i, 'n' FROM range(1000, 1100) r(i)"),
               BEFORE + list(range(1000, 1100))),
    "insert_arrow": (lambda db: db.insert("t", pa.table({"id": pa.array([5000], pa.int64()),
                                                         "v": ["a"]})), [*BEFORE, 5000]),
    "delete": (lambda db: db.sql("DELETE FROM t WHERE id < 10"), BEFORE[10:]),
    "update": (lambda db: db.sql("UPDATE t SET v = 'x' WHERE id < 10"), BEFORE),
    "optimize": (lambda db: db.sql("OPTIMIZE TABLE t FINAL"), BEFORE),
    "move": (lambda db: db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'plain'"),
             BEFORE),
    "add_column": (lambda db: db.sql("ALTER TABLE t ADD COLUMN z INTEGER DEFAULT 7"), BEFORE),
    "truncate": (lambda db: db.sql("TRUNCATE t"), []),
    "create_as": (lambda db: db.sql("CREATE TABLE u AS SELECT * FROM t WHERE id < 500"),
                  BEFORE),
}


def _all_parts(db):
    return sum(len(meta.parts) for meta in db.catalog.tables.values())


def _parquet_files(root):
    return {f for _r, _d, fs in os.walk(root) for f in fs if f.endswith(".parquet")}


def _named(db):
    return {os.path.basename(p.path) for meta in db.catalog.tables.values()
            for p in meta.parts}


def _setup(tmp_path):
    cfg = str(write_config(tmp_path, [1], 1))
    path = str(tmp_path / "db")
    with cryptdisk.connect(path, cfg) as db:
        db.sql("CREATE TABLE t (id BIGINT, v VARCHAR) ORDER BY id")
        for lo in range(0, 1000, 250):  # 4 parts
            db.sql(f"INSERT INTO t SELECT i, 's' FROM range({lo}, {lo + 250}) r(i)")
    return path, cfg


class _CatalogTrap:
    """Fails the next rename of the catalog: before it (``before``), or after it with the
    catalog impossible to look at (``unknown``: ``stat`` of it fails until disarmed), or
    before it with the catalog impossible to look at (``unknown_before``)."""

    def __init__(self, monkeypatch, mode):
        self.mode, self.fired, self.renamed = mode, False, False
        real_replace, real_stat = os.replace, os.stat

        def replace(src, dst, *a, **k):
            if self.fired or os.path.basename(os.fspath(dst)) != "catalog":
                return real_replace(src, dst, *a, **k)
            self.fired = True
            if mode == "before":
                raise OSError(errno.ENOSPC, "injected: no space left")
            if mode == "unknown_before":
                self.renamed = True  # (not renamed: stat fails all the same)
                raise OSError(errno.EIO, "injected: I/O error before the rename")
            real_replace(src, dst, *a, **k)
            self.renamed = True
            raise OSError(errno.EIO, "injected: I/O error after the rename")

        def stat(p, *a, **k):
            if self.renamed and os.path.basename(os.fspath(p)) == "catalog":
                raise OSError(errno.EIO, "injected: stat of the catalog")
            return real_stat(p, *a, **k)

        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "stat", stat)

    def disarm(self):
        self.renamed = False


@pytest.mark.parametrize("op", list(OPS))
def test_a_commit_that_failed_before_the_rename_deletes_its_new_files_at_once(
        tmp_path, monkeypatch, op):
    path, cfg = _setup(tmp_path)
    run, _after = OPS[op]
    with cryptdisk.connect(path, cfg) as db:
        version, before = db.catalog.version, db.catalog.to_json()
        files = _parquet_files(tmp_path)
        assert files == _named(db)
        trap = _CatalogTrap(monkeypatch, "before")
        with pytest.raises(OSError, match="no space left"):
            run(db)
        assert trap.fired
        monkeypatch.undo()
        assert db.catalog.version == version and db.catalog.to_json() == before
        # no file of the change is left for the next open: the disk holds what it held
        assert _parquet_files(tmp_path) == files
        assert _ids(db) == BEFORE
        db.sql("INSERT INTO t (id, v) VALUES (2000, 'z')")  # the connection goes on
    with cryptdisk.connect(path, cfg) as db:
        assert _ids(db) == [*BEFORE, 2000]
        assert _parquet_files(tmp_path) == _named(db)
        assert db.check() == _all_parts(db)


@pytest.mark.parametrize("op", list(OPS))
def test_a_commit_whose_outcome_is_unknown_keeps_its_files_and_reads_the_catalog_again(
        tmp_path, monkeypatch, op):
    """The catalog was renamed into place, then the write failed and the catalog could not
    be looked at: the change is published (on disk), so nothing it names may go, and this
    connection must not write another catalog of the same version from its memory."""
    path, cfg = _setup(tmp_path)
    run, after = OPS[op]
    with cryptdisk.connect(path, cfg) as db:
        version = db.catalog.version
        trap = _CatalogTrap(monkeypatch, "unknown")
        with pytest.raises(CatalogError, match="whether it was published is unknown") as info:
            run(db)
        assert trap.fired and trap.renamed
        assert "this connection reads the catalog again" in info.value.hint
        trap.disarm()
        with cryptdisk.connect(path, cfg, read_only=True) as reader:  # named: on disk
            assert _named(reader) <= _parquet_files(tmp_path)
        assert _ids(db) == after  # read again: the published change
        assert db.catalog.version == version + 1
        db.sql("INSERT INTO t (id, v) VALUES (2000, 'z')")
        assert db.catalog.version == version + 2
    monkeypatch.undo()
    with cryptdisk.connect(path, cfg) as db:
        assert _ids(db) == sorted([*after, 2000])
        assert db.check() == _all_parts(db)
        assert _parquet_files(tmp_path) >= _named(db)


@pytest.mark.parametrize("op", list(OPS))
def test_a_commit_whose_unknown_outcome_was_no_publish_deletes_its_files_once_known(
        tmp_path, monkeypatch, op):
    """The write failed before the rename and the catalog could not be looked at: the
    files stay while that is unknown, and go when the next statement reads the catalog
    again and finds the version before."""
    path, cfg = _setup(tmp_path)
    run, _after = OPS[op]
    with cryptdisk.connect(path, cfg) as db:
        version, files = db.catalog.version, _parquet_files(tmp_path)
        trap = _CatalogTrap(monkeypatch, "unknown_before")
        with pytest.raises(CatalogError, match="whether it was published is unknown"):
            run(db)
        trap.disarm()
        monkeypatch.undo()
        assert _parquet_files(tmp_path) >= files
        assert _ids(db) == BEFORE  # read again: the version before
        assert db.catalog.version == version
        assert _parquet_files(tmp_path) == files  # and the change's files are gone
        db.sql("INSERT INTO t VALUES (2000, 'z')")
    with cryptdisk.connect(path, cfg) as db:
        assert _ids(db) == [*BEFORE, 2000]
        assert _parquet_files(tmp_path) == _named(db)
        assert db.check() == _all_parts(db)


def test_a_move_that_fails_half_way_deletes_the_copies_it_made(tmp_path, monkeypatch):
    path, cfg = _setup(tmp_path)
    with cryptdisk.connect(path, cfg) as db:
        files = _parquet_files(tmp_path)
        disk = db.config.disks["open"]
        real = type(disk).open_write
        calls = []

        def open_write(self, p):
            calls.append(p)
            if len(calls) == 3:
                raise OSError(errno.ENOSPC, "injected: no space left")
            return real(self, p)
        monkeypatch.setattr(type(disk), "open_write", open_write)
        with pytest.raises(OSError, match="no space left"):
            db.move("t", "plain")
        monkeypatch.undo()
        assert len(calls) == 3
        assert _parquet_files(tmp_path) == files
        assert _ids(db) == BEFORE
        db.move("t", "plain")
        assert {p.disk for p in db.table("t").parts} == {"open"}
    with cryptdisk.connect(path, cfg) as db:
        assert _ids(db) == BEFORE
        assert _parquet_files(tmp_path) == _named(db)


def test_an_import_that_fails_deletes_the_files_it_copied(tmp_path):
    path, cfg = _setup(tmp_path)
    with cryptdisk.connect(path, cfg) as db:
        streams = []
        for part in db.table("t").parts[:2]:
            with db.config.disks[part.disk].open_read(part.path) as f:
                streams.append(io.BytesIO(f.read()))
        files = _parquet_files(tmp_path)
        # the first stream is a new part; the second is refused (the table has its id)
        db.sql("CREATE TABLE u (id BIGINT, v VARCHAR) ORDER BY id")
        with pytest.raises(cryptdisk.errors.DatabaseError, match="already has part"):
            db.import_parts("u", [streams[0], io.BytesIO(streams[0].getvalue())])
        assert _parquet_files(tmp_path) == files
        assert db.query("SELECT count(*) FROM u") == [(0,)]


def test_staged_parts_stay_after_a_failed_commit_and_commit_later(tmp_path, monkeypatch):
    """Parts another connection staged are not this commit's to delete: a commit that
    failed leaves them, and committing them again succeeds."""
    path, cfg = _setup(tmp_path)
    with cryptdisk.connect(path, cfg) as db:
        with cryptdisk.connect(path, cfg, read_only=True) as worker:
            staged = worker.stage_parts("t", pa.table({"id": pa.array([3000], pa.int64()),
                                                       "v": ["w"]}), db.catalog.version + 1)
        trap = _CatalogTrap(monkeypatch, "before")
        with pytest.raises(OSError, match="no space left"):
            db.commit_parts("t", staged)
        assert trap.fired
        monkeypatch.undo()
        assert db.commit_parts("t", staged) == 1
        assert _ids(db) == [*BEFORE, 3000]
    with cryptdisk.connect(path, cfg) as db:
        assert db.check() == 5


@pytest.mark.parametrize("op", ["insert", "insert_arrow", "update", "optimize", "move",
                                "add_column", "create_as"])
def test_a_new_file_whose_directory_sync_fails_is_deleted(tmp_path, monkeypatch, op):
    """A new part (or a moved copy) renamed into place whose directory's ``fsync`` then
    fails: the statement fails and changes nothing, and the file goes with it (no catalog
    will name it), not at the next writer's open."""
    import cryptdisk.disks._local as local

    path, cfg = _setup(tmp_path)
    run, _after = OPS[op]
    real = local._fsync_dir
    fired = []

    def fsync_dir(directory):
        if not fired and any(f.endswith(".parquet") and f not in files  # a new part's
                             for f in os.listdir(directory)):
            fired.append(directory)
            raise OSError(errno.EIO, "injected: fsync of the directory")
        return real(directory)

    files: set[str] = set()
    with cryptdisk.connect(path, cfg) as db:
        files |= _parquet_files(tmp_path)
        monkeypatch.setattr(local, "_fsync_dir", fsync_dir)
        with pytest.raises(OSError, match="fsync of the directory"):
            run(db)
        monkeypatch.undo()
        assert fired
        assert _parquet_files(tmp_path) == files
        assert _ids(db) == BEFORE
    with cryptdisk.connect(path, cfg) as db:
        assert _ids(db) == BEFORE
        assert db.check() == 4
