"""The cluster's HTTP dashboard (scheduler and workers, every page distributed serves
without bokeh: workers, each task, call stacks, exceptions, logs, JSON, Prometheus
metrics) scraped while a read_table task runs and after a task fails: no page shows the
encryption key or the workers' S3 secret key."""

import os
import urllib.error
import urllib.parse
import urllib.request

import pytest

import cryptdisk
import cryptdisk.dask
from cryptdisk.errors import CatalogError

from ..db.dbhelpers import write_config
from .daskhelpers import key_needles


def _pause_first_read(marker, release):
    """Patch Database.read_part in the workers: the first call anywhere reports itself in
    ``marker`` and waits for ``release`` (so the test sees a running task)."""
    def patch():
        import time

        from cryptdisk.db import Database

        original = Database.read_part

        def read_part(self, *args, **kwargs):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return original(self, *args, **kwargs)
            deadline = time.monotonic() + 300
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
            return original(self, *args, **kwargs)

        read_part.original = original
        Database.read_part = read_part
    return patch


def _unpatch():
    from cryptdisk.db import Database

    Database.read_part = getattr(Database.read_part, "original", Database.read_part)


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.read()
    except urllib.error.HTTPError as exc:  # an error page is a page too (json/identity.json
        with exc:                          # fails on tuple keys of erred tasks: distributed)
            return exc.read()


def _pages(client, keys):
    """Every page of the scheduler's and the workers' HTTP servers, by URL."""
    base = client.dashboard_link.rsplit("/", 1)[0]
    info = client.scheduler_info()
    workers = list(info["workers"])
    urls = [f"{base}/info/main/workers.html", f"{base}/info/main/exceptions.html",
            f"{base}/info/main/logs.html", f"{base}/json/counts.json",
            f"{base}/json/identity.json", f"{base}/metrics"]
    for addr in workers:
        q = urllib.parse.quote(addr, safe="")
        urls += [f"{base}/info/worker/{q}.html", f"{base}/info/call-stacks/{q}.html",
                 f"{base}/info/logs/{q}.html"]
        port = info["workers"][addr]["services"]["dashboard"]
        urls += [f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{port}/health"]
    for key in keys:
        q = urllib.parse.quote(str(key), safe="")
        urls += [f"{base}/info/task/{q}.html", f"{base}/info/call-stack/{q}.html"]
    return {u: _get(u) for u in urls}


def _assert_clean(pages, needles):
    assert pages
    for url, body in pages.items():
        for needle in needles:
            assert needle not in body and needle.lower() not in body.lower(), url


def _wait_for(path):
    import time

    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.02)


def test_the_dashboard_shows_no_key_while_a_task_runs_or_after_it_fails(client, s3, tmp_path):
    _endpoint, aws_secret = s3
    cfg = write_config(tmp_path, [1], 1)
    needles = key_needles(tmp_path, aws_secret)
    db = tmp_path / "db"
    with cryptdisk.connect(db, cfg) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        con.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(1000) r(i)")
        con.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(1000, 2000) r(i)")
    marker, release = str(tmp_path / "reading"), str(tmp_path / "release")
    client.run(_pause_first_read(marker, release))
    try:
        df = cryptdisk.dask.read_table(db, "t", ["k", "s"], [("k", "<", 1500)], config=cfg)
        future = client.compute(df)
        _wait_for(marker)  # a worker is inside read_part now
        keys = [k for k in dict(df.__dask_graph__()) if "read-table" in str(k)]
        running = _pages(client, keys)
        assert any(b"processing" in body for url, body in running.items() if "/task/" in url)
        assert any(b"read_part" in body for url, body in running.items()
                   if "call-stack" in url)  # the running task's stack was on a page
        open(release, "w").close()
        assert len(future.result()) == 1500
        _assert_clean(running, needles)

        other = tmp_path / "other"  # a task that fails: its parts merged away after
        with cryptdisk.connect(other, cfg) as con:  # planning, on a database no worker has
            con.sql("CREATE TABLE t (k BIGINT) ORDER BY k")  # opened yet
            con.sql("INSERT INTO t VALUES (1)")
            con.sql("INSERT INTO t VALUES (2)")
            stale = cryptdisk.dask.read_table(other, "t", config=cfg)
            con.sql("OPTIMIZE TABLE t FINAL")
        failed = client.compute(stale)
        with pytest.raises(CatalogError):
            failed.result()
        erred = [k for k in dict(stale.__dask_graph__()) if "read-table" in str(k)]
        after = _pages(client, erred)
        assert b"CatalogError" in after[client.dashboard_link.rsplit("/", 1)[0]
                                        + "/info/main/exceptions.html"]
        _assert_clean(after, needles)
    finally:
        client.run(_unpatch)
