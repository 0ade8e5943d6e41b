"""A read-only connection's statement runs once more, its catalog loaded again, when its
first attempt finds a part gone under a stale catalog (``CatalogError``: a writer merged
or dropped it) or a key it does not hold (``KeyNotFoundError``: another process rotated,
and the connection reads its own key file, loaded again); the same error a second time,
or a writer's, is raised. Queries and streams (``Reader.stream``) alike."""

from __future__ import annotations

import pytest

import cryptdisk
from cryptdisk.db import Database, Reader
from cryptdisk.errors import CatalogError, KeyNotFoundError


@pytest.fixture
def path(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (a BIGINT) ORDER BY a")
        db.sql("INSERT INTO t SELECT range FROM range(1000)")
    return tmp_path / "db"


def failing(monkeypatch, cls, errors):
    """``cls._prepare`` raises ``errors`` in turn, then prepares as it does; the calls."""
    real, calls = cls._prepare, []

    def prepare(self, *args, **kwargs):
        calls.append(self)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "_prepare", prepare)
    return calls


def run(db, how):
    sql = "SELECT sum(a) FROM t"
    if how == "query":
        return db.query(sql)
    with db.stream(sql) as s:
        return [tuple(r.values()) for r in s.read_all().to_pylist()]


@pytest.mark.parametrize("how", ["query", "stream"])
@pytest.mark.parametrize("error", [CatalogError("part p_1 is gone"),
                                   KeyNotFoundError("no key 2")])
def test_a_read_only_statement_runs_again_after_a_stale_catalog_or_key(path, monkeypatch,
                                                                         how, error):
    reloads = []
    with cryptdisk.connect(path, read_only=True) as db:
        real_reload = type(db)._reload_own_keys
        monkeypatch.setattr(type(db), "_reload_own_keys",
                            lambda self: reloads.append(1) or real_reload(self))
        calls = failing(monkeypatch, Database if how == "query" else Reader, [error])
        assert run(db, how) == [(499500,)]
    assert len(calls) == 2
    assert reloads == ([1] if isinstance(error, KeyNotFoundError) else [])


@pytest.mark.parametrize("how", ["query", "stream"])
def test_a_second_failure_is_raised(path, monkeypatch, how):
    with cryptdisk.connect(path, read_only=True) as db:
        calls = failing(monkeypatch, Database if how == "query" else Reader,
                        [CatalogError("gone"), CatalogError("gone again")])
        with pytest.raises(CatalogError, match="gone again"):
            run(db, how)
    assert len(calls) == 2


@pytest.mark.parametrize("how", ["query", "stream"])
def test_a_writer_raises_at_once(path, monkeypatch, how):
    with cryptdisk.connect(path) as db:
        calls = failing(monkeypatch, Database if how == "query" else Reader,
                        [CatalogError("gone")])
        with pytest.raises(CatalogError, match="gone"):
            run(db, how)
    assert len(calls) == 1
