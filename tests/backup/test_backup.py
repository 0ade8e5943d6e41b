"""Backups of both engines: round trips, dedup, verify naming damage, keys, prune."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite
from cryptdisk.backup import (
    Repository,
    create,
    find_backup,
    list_backups,
    prune,
    restore,
    verify,
)
from cryptdisk.errors import BackupError, BackupKeyError, ConfigError, CryptdiskError
from cryptdisk.keys import Keyring

from .helpers import FAST_KDF, content, make_db


def _repo(tmp_path: Path, **kw) -> Repository:
    return Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF, **kw)


def _parts(path: Path) -> dict[str, list[tuple[str, int, str]]]:
    db = cryptdisk.connect(path, read_only=True)
    try:
        return {t.name: [(p.id, p.rows, p.sha256) for p in t.parts]
                for t in db.catalog.tables.values()}
    finally:
        db.close()


def test_db_restore_equals_source(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src)
    repo = _repo(tmp_path)
    s = create(repo, src)
    assert s.kind == "db" and s.new_chunks == s.chunks > 0
    expected = content(src)
    parts = _parts(src)
    shutil.rmtree(src)  # the database and its key are lost: the backup is not
    (tmp_path / "a.db.key").rename(tmp_path / "old.key")
    restore(repo, s.id, tmp_path / "r.db")
    assert content(tmp_path / "r.db") == expected
    assert _parts(tmp_path / "r.db") == parts  # the parts as they were, not re-encoded
    (tmp_path / "old.key").rename(tmp_path / "a.db.key")
    assert (tmp_path / "r.db.key").exists()  # under a new key of its own
    assert (tmp_path / "r.db.key").read_bytes() != (tmp_path / "a.db.key").read_bytes()
    # the repository holds no plaintext of the data
    for p in (tmp_path / "repo").rglob("*"):
        if p.is_file():
            assert b"c4ca4238a0b923820dcc509a6f75849b" not in p.read_bytes()  # md5('1')


def test_restore_filters_tables_and_refuses_existing_target(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=10)
    repo = _repo(tmp_path)
    s = create(repo, src)
    restore(repo, s.id, tmp_path / "r.db", tables=["u"])
    assert list(content(tmp_path / "r.db")) == ["u"]
    with pytest.raises(BackupError, match="exists"):
        restore(repo, s.id, tmp_path / "r.db")
    (tmp_path / "k.db.key").write_bytes(b"someone's key")
    with pytest.raises(BackupError, match=r"k\.db\.key exists"):  # never over a key file
        restore(repo, s.id, tmp_path / "k.db")
    assert (tmp_path / "k.db.key").read_bytes() == b"someone's key"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("k.db")) == [
        "k.db.key"]
    with pytest.raises(BackupError, match="no table 'nope'"):
        restore(repo, s.id, tmp_path / "x.db", tables=["nope"])
    with pytest.raises(BackupError, match="no backup"):
        restore(repo, "nope", tmp_path / "y.db")


def _sqlite(path: Path, keyring: Keyring, rows: int) -> None:
    c = cryptdisk.sqlite.connect(path, keyring=keyring)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT)")
    with c:
        c.executemany("INSERT INTO t(s) VALUES (?)", [(f"row {i}" * 3,) for i in range(rows)])
    c.close()


def _sqlite_rows(path: Path, keyring: Keyring) -> list:
    c = cryptdisk.sqlite.connect(path, keyring=keyring, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return c.execute("SELECT * FROM t ORDER BY id").fetchall()
    finally:
        c.close()


def test_sqlite_restore_equals_source(tmp_path: Path) -> None:
    kr = Keyring.generate()
    src = tmp_path / "app.db"
    _sqlite(src, kr, 3000)
    repo = _repo(tmp_path)
    s = create(repo, src, keyring=kr)
    assert s.kind == "sqlite"
    other = Keyring.generate(5)
    restore(repo, s.id, tmp_path / "r.db", keyring=other)
    assert _sqlite_rows(tmp_path / "r.db", other) == _sqlite_rows(src, kr)
    with pytest.raises(cryptdisk.CryptdiskError):
        _sqlite_rows(tmp_path / "r.db", kr)  # not under the source's key


def test_second_backup_after_small_change_stores_little(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=200_000)
    repo = _repo(tmp_path)
    first = create(repo, src)
    db = cryptdisk.connect(src)
    db.sql("INSERT INTO t SELECT range, md5(range::VARCHAR), 0 FROM range(200000, 202000)")
    db.close()
    second = create(repo, src)
    assert first.stored_bytes > 100_000
    assert second.stored_bytes < first.stored_bytes * 0.10
    assert second.chunks > second.new_chunks


def test_unchanged_parts_are_not_read_again_unless_a_chunk_is_gone(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=20_000)
    repo = _repo(tmp_path)
    first = create(repo, src)
    assert first.files_reused == 0
    db = cryptdisk.connect(src)
    db.sql("INSERT INTO u VALUES ('c', 3)")  # one new part; the others are as they were
    db.close()
    second = create(repo, src)
    assert second.files_reused == first.files and second.files == first.files + 1
    assert second.chunks == sum(1 for _ in _chunks_of(repo, second.id))
    # a chunk of the reused parts gone: its part is read again and the chunk rewritten
    gone = next(iter(_chunks_of(repo, second.id)))
    Path(repo.chunk_path(gone)).unlink()
    third = create(repo, src)
    assert third.files_reused == second.files - 1 and third.new_chunks == 1
    assert Path(repo.chunk_path(gone)).exists()
    assert verify(repo).ok  # the same name: the earlier backups are whole again too
    restore(repo, third.id, tmp_path / "r.db")
    assert content(tmp_path / "r.db") == content(src)


def _chunks_of(repo: Repository, backup_id: str):
    for t in repo.read_manifest(backup_id)["tables"]:
        for p in t["parts"]:
            yield from p["chunks"]


def test_sqlite_second_backup_dedups(tmp_path: Path) -> None:
    kr = Keyring.generate()
    src = tmp_path / "app.db"
    _sqlite(src, kr, 400_000)
    repo = _repo(tmp_path)
    first = create(repo, src, keyring=kr)
    c = cryptdisk.sqlite.connect(src, keyring=kr)
    with c:
        c.executemany("INSERT INTO t(s) VALUES (?)", [("new",)] * 4000)
    c.close()
    second = create(repo, src, keyring=kr)
    # 1% more rows dirties the new leaf pages at the end and the table's interior pages,
    # which lie scattered through the file: each dirties one ~128 KiB chunk. Over 15
    # random repository seeds the second backup stored 5.3-8.3% of the first (its tail
    # crossed 10% in CI); without deduplication it would store about 100%.
    assert 0 < second.stored_bytes < first.stored_bytes * 0.20


def _corrupt(repo: Repository, tmp_path: Path):
    files = sorted(p for p in (tmp_path / "repo" / "chunks").rglob("*") if p.is_file())
    return files


def test_verify_names_missing_tampered_truncated_chunks_and_their_backups(
        tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=50_000)
    repo = _repo(tmp_path)
    b1 = create(repo, src).id
    db = cryptdisk.connect(src)
    db.sql("INSERT INTO u VALUES ('c', 3)")
    db.close()
    b2 = create(repo, src).id
    assert verify(repo).ok
    files = _corrupt(repo, tmp_path)
    assert len(files) >= 5
    files[0].unlink()
    data = bytearray(files[1].read_bytes())
    data[40] ^= 1
    files[1].write_bytes(bytes(data))
    files[2].write_bytes(files[2].read_bytes()[:-5])
    files[3].write_bytes(files[4].read_bytes())  # a valid chunk under another name
    report = verify(repo)
    assert not report.ok
    assert set(report.problems) == {files[0].name, files[1].name, files[2].name,
                                    files[3].name}
    assert "tampered" in report.problems[files[3].name][0]
    assert report.problems[files[0].name][0] == "missing"
    assert "tampered" in report.problems[files[1].name][0]
    for _problem, backups in report.problems.values():
        assert set(backups) <= {b1, b2} and backups
    with pytest.raises(BackupError, match="chunk"):
        restore(repo, b1, tmp_path / "r.db")
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "r.db.key").exists()
    assert not list(tmp_path.glob("r.db.restoring-*"))  # the work in progress is gone too
    sampled = verify(repo, sample=50)
    assert 0 < sampled.chunks_checked < report.chunks_checked


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_tampered_or_truncated_chunk_is_an_authentication_error(tmp_path: Path,
                                                                  damage: str) -> None:
    """A restore meeting a chunk that fails AES-GCM raises an AuthenticationError (that is
    also a BackupError) and leaves no TARGET; a missing chunk is a BackupError alone."""
    kr = Keyring.generate()
    lite = tmp_path / "sales.db"
    _sqlite(lite, kr, 300)
    repo = _repo(tmp_path)
    bid = create(repo, lite, keyring=kr).id
    chunk = Path(repo.chunk_path(repo.read_manifest(bid)["file"]["chunks"][0]))
    blob = chunk.read_bytes()
    chunk.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]) if damage == "flip" else blob[:40])
    with pytest.raises(cryptdisk.AuthenticationError, match="tampered or truncated") as info:
        restore(repo, bid, tmp_path / "r.db", keyring=kr)
    assert isinstance(info.value, BackupError)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("r.db")]
    chunk.unlink()
    with pytest.raises(BackupError, match="missing") as missing:
        restore(repo, bid, tmp_path / "r.db", keyring=kr)
    assert not isinstance(missing.value, cryptdisk.AuthenticationError)


def test_a_sqlite_backup_beside_a_writer_holding_its_lock_says_so(tmp_path: Path) -> None:
    """Rollback-journal mode: a writer in an exclusive transaction past the busy timeout
    makes the backup fail with a BackupError that says so (not apsw.BusyError), and
    nothing is published; once the writer commits, the backup runs."""
    kr = Keyring.generate()
    src = tmp_path / "rj.db"
    c = cryptdisk.sqlite.connect(src, keyring=kr)
    c.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
    assert c.execute("PRAGMA journal_mode").fetchall() == [("delete",)]
    repo = _repo(tmp_path)
    c.execute("BEGIN EXCLUSIVE; INSERT INTO t VALUES (2)")
    try:
        with pytest.raises(BackupError, match="locked by a writer"):
            create(repo, src, keyring=kr)
    finally:
        c.execute("COMMIT")
        c.close()
    assert list_backups(repo) == []
    bid = create(repo, src, keyring=kr).id
    restore(repo, bid, tmp_path / "r.db", keyring=kr)
    r = cryptdisk.sqlite.connect(tmp_path / "r.db", keyring=kr)
    assert r.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    r.close()


def test_list_shows_the_stored_bytes_create_reported(tmp_path: Path) -> None:
    """One figure per backup: what create said it stored (chunks and manifest)."""
    src = tmp_path / "a.db"
    make_db(src, rows=5000)
    repo = _repo(tmp_path)
    made = [create(repo, src) for _ in range(2)]
    listed = list_backups(repo)
    assert [b["stored_bytes"] for b in listed] == [s.stored_bytes for s in made]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "repo").rglob("*")
                  if p.is_file() and (p.parts[-2] == "manifests" or "chunks" in p.parts))
    assert sum(b["stored_bytes"] for b in listed) == on_disk


def test_tampered_or_swapped_manifest_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=10)
    repo = _repo(tmp_path)
    b1 = create(repo, src).id
    b2 = create(repo, src).id
    m1 = tmp_path / "repo" / "manifests" / b1
    m2 = tmp_path / "repo" / "manifests" / b2
    m2.write_bytes(m1.read_bytes())  # a valid manifest under another id
    report = verify(repo)
    assert b2 in report.bad_manifests
    listed = list_backups(repo)
    assert listed[0]["id"] == b1 and "error" not in listed[0]
    assert listed[1]["id"] == b2 and "fails authentication" in listed[1]["error"]
    with pytest.raises(BackupError, match="fails authentication") as info:
        restore(repo, b2, tmp_path / "r.db")
    assert isinstance(info.value, cryptdisk.AuthenticationError)


def test_keys_passphrase_keyring_and_clear_errors(tmp_path: Path) -> None:
    kr = Keyring.generate(3)
    url = str(tmp_path / "repo")
    repo = Repository.init(url, keyring=kr)
    with pytest.raises(BackupKeyError, match="no passphrase wrapping"):
        Repository.open(url, passphrase="pw")
    with pytest.raises(BackupKeyError, match="none of the given keyring keys"):
        Repository.open(url, keyring=Keyring.generate(3))
    with pytest.raises(BackupKeyError, match="locked"):
        Repository.open(url)
    repo.add_wrapping(passphrase="second", kdf_params=FAST_KDF)
    assert Repository.open(url, passphrase="second").id == repo.id
    with pytest.raises(BackupKeyError, match="wrong passphrase"):
        Repository.open(url, passphrase="wrong")
    assert Repository.open(url, keyring=kr).keys.chunk == repo.keys.chunk
    assert "second" not in (tmp_path / "repo" / "config").read_text()
    assert "pw" not in repr(repo) and "chunk" not in repr(repo.keys)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(repo)


def test_a_passphrase_that_is_not_a_str_is_a_type_error_before_anything_is_made(
        tmp_path: Path) -> None:
    """bytes (or anything but a str) raised AttributeError from deep in the KDF after
    init had checked the location; now a TypeError naming the type, and nothing made."""
    url = str(tmp_path / "repo")
    for bad in (b"pw", bytearray(b"pw"), 1234):
        with pytest.raises(TypeError, match=f"passphrase must be a str, not {type(bad).__name__}"):
            Repository.init(url, passphrase=bad, kdf_params=FAST_KDF)  # type: ignore[arg-type]
        assert not (tmp_path / "repo").exists()
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    with pytest.raises(TypeError, match="passphrase must be a str, not bytes"):
        Repository.open(url, passphrase=b"pw")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="passphrase must be a str"):
        repo.add_wrapping(passphrase=b"x", kdf_params=FAST_KDF)  # type: ignore[arg-type]


def test_config_parameters_are_authenticated(tmp_path: Path) -> None:
    url = str(tmp_path / "repo")
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    cfg = tmp_path / "repo" / "config"
    cfg.write_text(cfg.read_text().replace('"avg": 131072', '"avg": 65536'))
    with pytest.raises(BackupError, match="tampered"):
        Repository.open(url, passphrase="pw")


def test_prune_keeps_last_and_deletes_only_unreferenced_chunks(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=20_000)
    repo = _repo(tmp_path)
    ids = []
    for i in range(3):
        db = cryptdisk.connect(src)
        if i == 0:  # only the first backup holds this table's chunks
            db.sql("CREATE TABLE gone (x VARCHAR)")
            db.sql("INSERT INTO gone SELECT md5(range::VARCHAR) FROM range(20000)")
        else:
            db.sql("DROP TABLE IF EXISTS gone")
        db.sql(f"INSERT INTO t SELECT range, 'x{i}', 0 FROM range(5000)")
        db.close()
        ids.append(create(repo, src).id)
    before = repo.chunk_names()
    dropped, deleted = prune(repo, keep_last=2)
    assert dropped == ids[:1] and deleted > 0
    assert [b["id"] for b in list_backups(repo)] == ids[1:]
    assert len(repo.chunk_names()) == len(before) - deleted
    assert verify(repo).ok  # the chain's pruned link is not a break
    restore(repo, ids[1], tmp_path / "r.db")
    with pytest.raises(BackupError, match="at least one retention rule"):
        prune(repo, keep_last=0)


def test_prune_applies_its_rules_to_each_source_apart(tmp_path: Path) -> None:
    """Two databases backed up into one repository (as docs/backup.md does): the newer
    backups of one never crowd out the other's, so --keep-last 1 keeps one of each."""
    kr = Keyring.generate()
    lite = tmp_path / "sales.db"
    _sqlite(lite, kr, 300)
    src = tmp_path / "a.db"
    make_db(src, rows=500)
    repo = _repo(tmp_path)
    lite_ids = [create(repo, lite, keyring=kr).id for _ in range(2)]
    db_ids = [create(repo, src).id for _ in range(3)]
    dropped, _deleted = prune(repo, keep_last=1)
    assert sorted(dropped) == sorted(lite_ids[:1] + db_ids[:2])
    assert [b["id"] for b in list_backups(repo)] == [lite_ids[-1], db_ids[-1]]
    assert verify(repo).ok
    restore(repo, lite_ids[-1], tmp_path / "r.db", keyring=kr)
    assert _sqlite_rows(tmp_path / "r.db", kr) == _sqlite_rows(lite, kr)


def test_prune_refuses_while_a_backup_holds_the_lock(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    with repo.lock(exclusive=False):
        with pytest.raises(BackupError, match="busy"):
            prune(repo, keep_last=1)


def test_manifests_chain(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=10)
    repo = _repo(tmp_path)
    b1 = create(repo, src).id
    b2 = create(repo, src).id
    assert repo.read_manifest(b1)["prev"] is None
    assert repo.read_manifest(b2)["prev"]["id"] == b1
    m1 = tmp_path / "repo" / "manifests" / b1
    # a re-encrypted (valid) different b1 breaks the chain: simulate with another write
    doc = repo.read_manifest(b1)
    doc["bytes"] = 0
    repo.write_manifest(doc)
    assert m1.exists()
    assert verify(repo).chain_breaks


def test_init_on_s3_refuses_a_missing_bucket_unless_create_bucket(tmp_path: Path) -> None:
    from tests.disks.s3server import s3_server

    with s3_server() as endpoint:
        opts = {"endpoint_url": endpoint, "skip_instance_cache": True}
        with pytest.raises(BackupError, match="bucket nope does not exist") as err:
            Repository.init("s3://nope/repo", passphrase="pw", kdf_params=FAST_KDF,
                            storage_options=opts)
        assert "--create-bucket" in (err.value.hint or "")
        with pytest.raises(BackupError, match="not a backup repository"):
            Repository.open("s3://nope/repo", passphrase="pw", storage_options=opts)
        Repository.init("s3://nope/repo", passphrase="pw", kdf_params=FAST_KDF,
                        storage_options=opts, create_bucket=True)
        assert Repository.open("s3://nope/repo", passphrase="pw", storage_options=opts).id


def test_s3_repository(tmp_path: Path) -> None:
    from tests.disks.s3server import make_bucket, s3_server

    src = tmp_path / "a.db"
    make_db(src, rows=5000)
    with s3_server() as endpoint:
        make_bucket(endpoint, "backups")
        opts = {"endpoint_url": endpoint, "skip_instance_cache": True}
        repo = Repository.init("s3://backups/repo", passphrase="pw", kdf_params=FAST_KDF,
                               storage_options=opts)
        s = create(repo, src)
        again = Repository.open("s3://backups/repo", passphrase="pw", storage_options=opts)
        assert create(again, src).new_chunks == 0
        assert verify(again).ok
        restore(again, s.id, tmp_path / "r.db")
        assert content(tmp_path / "r.db") == content(src)

        # prune and create exclude each other through lock markers
        other = Repository.open("s3://backups/repo", passphrase="pw", storage_options=opts)
        with again.lock(exclusive=False):
            with pytest.raises(BackupError, match="busy: another backup or prune"):
                prune(other, keep_last=1)
        with again.lock(exclusive=True):
            with pytest.raises(BackupError, match="busy: a prune runs"):
                create(other, src)
        assert prune(other, keep_last=1)[0] == [s.id]  # released: prune runs
        other._put("backups/repo/locks/create-dead", b"{}")  # a killed backup's marker
        with pytest.raises(BackupError, match="create-dead") as err:
            prune(other, keep_last=1)
        assert "--break-lock" in (err.value.hint or "")
        prune(other, keep_last=1, break_lock=True)
        assert verify(other).ok


def test_find_backup_by_id_latest_and_time(tmp_path: Path) -> None:
    import datetime as dt
    import time

    src = tmp_path / "a.db"
    make_db(src, rows=10)
    repo = _repo(tmp_path)
    with pytest.raises(BackupError, match="no backups"):
        find_backup(repo, "latest")
    b1 = create(repo, src).id
    time.sleep(0.01)  # ordering only: the two backups' times differ
    between = dt.datetime.now(dt.UTC).isoformat()
    time.sleep(0.01)
    b2 = create(repo, src).id
    assert find_backup(repo, "latest") == b2
    assert find_backup(repo, b1) == b1
    assert find_backup(repo, "@" + between) == b1
    with pytest.raises(BackupError, match="at or before"):
        find_backup(repo, "@2000-01-01T00:00")
    with pytest.raises(BackupError, match="ISO 8601"):
        find_backup(repo, "@yesterday")


def test_latest_is_refused_when_the_repository_holds_several_sources(tmp_path: Path) -> None:
    """``latest`` alone means the newest backup only in a one-source repository; with two
    sources it names both and how to pick one (``source=``), which takes the path as
    ``list`` shows it (absolute) or relative to the working directory."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    make_db(a, rows=10)
    make_db(b, rows=20)
    repo = _repo(tmp_path)
    a1 = create(repo, a).id
    assert find_backup(repo, "latest") == a1  # one source: unchanged
    a2 = create(repo, a).id
    assert find_backup(repo, "latest") == a2
    b1 = create(repo, b).id
    with pytest.raises(BackupError, match="2 sources") as err:
        find_backup(repo, "latest")
    assert str(a) in str(err.value) and str(b) in str(err.value)
    assert "--source" in (err.value.hint or "")
    assert find_backup(repo, "latest", source=str(a)) == a2
    assert find_backup(repo, "latest", source=b) == b1
    # @TIME is as ambiguous: the newest backup of any source before TIME could be b's
    with pytest.raises(BackupError, match="2 sources") as err:
        find_backup(repo, "@2999-01-01T00:00")
    assert "'@2999-01-01T00:00' does not say which" in str(err.value)
    assert find_backup(repo, "@2999-01-01T00:00", source=a) == a2
    assert find_backup(repo, "@2999-01-01T00:00", source=b) == b1
    with pytest.raises(BackupError, match="no backup of") as err:
        find_backup(repo, "latest", source=tmp_path / "c.db")
    assert str(a) in str(err.value)
    assert find_backup(repo, a1, source=a) == a1
    with pytest.raises(BackupError, match="not of"):
        find_backup(repo, a1, source=b)


def test_prune_removes_temporaries_of_killed_writes(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    d = tmp_path / "repo" / "chunks" / "ab"
    d.mkdir(parents=True)
    (d / ".tmp-deadbeef").write_bytes(b"half a chunk")
    prune(repo, keep_last=1)
    assert not (d / ".tmp-deadbeef").exists()


def test_restore_under_a_new_config_with_a_plain_table(tmp_path: Path) -> None:
    from cryptdisk.config import load_config
    from tests.db.dbhelpers import write_config

    src = tmp_path / "a.db"
    make_db(src, rows=1000)
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE p (x BIGINT) SETTINGS storage_policy = 'plain'")
    db.sql("INSERT INTO p SELECT range FROM range(10)")
    db.close()
    repo = _repo(tmp_path)
    s = create(repo, src)
    new = tmp_path / "new"
    new.mkdir()
    cfg = write_config(new, [4], 4)
    restore(repo, s.id, tmp_path / "r.db", config=load_config(cfg))
    assert not (tmp_path / "r.db.key").exists()  # the config's keys, not a new key file
    r = cryptdisk.connect(tmp_path / "r.db", load_config(cfg), read_only=True)
    assert r.query("SELECT count(*), sum(x) FROM p") == [(10, 45)]
    assert r.query("SELECT count(*) FROM t") == [(1000,)]
    assert r.query("SELECT storage_policy, is_encrypted FROM system.tables "
                   "WHERE name = 'p'") == [("plain", False)]
    r.close()
    lacking = write_config(new, [4], 4, name="noplain.toml", plain=False)
    with pytest.raises(CryptdiskError, match="plain"):  # the policy the backup needs
        restore(repo, s.id, tmp_path / "x.db", config=load_config(lacking))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("x.db")]


def _files(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())


def test_a_failed_restore_under_a_config_leaves_no_part_on_its_disks(tmp_path: Path) -> None:
    """The config's disks lie outside TARGET: the parts of the tables restored before the
    failure (a tampered chunk of the last table) are deleted with the rest."""
    from cryptdisk.config import load_config
    from tests.db.dbhelpers import write_config

    src = tmp_path / "a.db"
    make_db(src, rows=5000)
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE p (x BIGINT) SETTINGS storage_policy = 'plain'")
    db.sql("INSERT INTO p SELECT range FROM range(10)")
    db.close()
    repo = _repo(tmp_path)
    s = create(repo, src)
    m = repo.read_manifest(s.id)
    assert [t["name"] for t in m["tables"]][-1] == "p"
    (chunk,) = m["tables"][-1]["parts"][0]["chunks"]
    path = Path(repo.chunk_path(chunk))
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    new = tmp_path / "new"
    new.mkdir()
    cfg = load_config(write_config(new, [4], 4))
    before = _files(new)
    with pytest.raises(BackupError, match="tampered"):
        restore(repo, s.id, tmp_path / "r.db", config=cfg)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("r.db")]
    assert _files(new) == before  # t's and u's parts went with the failed restore


def test_retention_rules() -> None:
    from cryptdisk.backup import retained

    def bid(day: str, hour: int) -> str:
        return f"{day}T{hour:02d}0000.000000Z-00000000"

    ids = sorted([bid("20261130", 9), bid("20261130", 18),      # Mon of week 49
                  bid("20261201", 8), bid("20261201", 20),      # Tue
                  bid("20261125", 12),                          # Wed of week 48
                  bid("20261031", 23)])                         # October
    assert retained(ids, keep_last=2) == [bid("20261201", 8), bid("20261201", 20)]
    assert retained(ids, keep_daily=2) == [bid("20261130", 18), bid("20261201", 20)]
    assert retained(ids, keep_weekly=3) == [bid("20261031", 23), bid("20261125", 12),
                                            bid("20261201", 20)]
    assert retained(ids, keep_monthly=2) == [bid("20261130", 18), bid("20261201", 20)]
    assert retained(ids, keep_last=2, keep_monthly=3) == [
        bid("20261031", 23), bid("20261130", 18), bid("20261201", 8), bid("20261201", 20)]
    assert retained(ids, keep_daily=100) == [bid("20261031", 23), bid("20261125", 12),
                                             bid("20261130", 18), bid("20261201", 20)]
    with pytest.raises(BackupError, match="retention rule"):
        retained(ids)
    with pytest.raises(BackupError, match="retention rule"):
        retained(ids, keep_last=-1, keep_daily=1)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("memory_cost", 1 << 40, r"memory_cost 1099511627776 is outside \[8, 1048576\]"),
    ("memory_cost", 16 * 64 * 1024 + 1, r"memory_cost 1048577 is outside"),
    ("iterations", 2**31, r"iterations 2147483648 is outside \[1, 48\]"),
    ("iterations", 0, r"iterations 0 is outside"),
    ("lanes", 2**24, r"lanes 16777216 is outside \[1, 16\]"),
    ("lanes", ..., r"lanes None is outside"),
])
def test_argon2_parameters_from_the_config_are_bounded_before_argon2_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: object,
        says: str) -> None:
    """The config is not authenticated until the key is open: parameters that would make
    Argon2id exhaust memory or time are refused before it runs, clearly."""
    import json

    import cryptdisk.backup._keys as keys_mod

    url = str(tmp_path / "repo")
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    cfg = tmp_path / "repo" / "config"
    doc = json.loads(cfg.read_text())
    if value is ...:
        del doc["wrappings"][0]["params"][name]
    else:
        doc["wrappings"][0]["params"][name] = value
    cfg.write_text(json.dumps(doc))
    ran = []
    monkeypatch.setattr(keys_mod, "Argon2id", lambda **kw: ran.append(kw))
    with pytest.raises(BackupError, match=says) as err:
        Repository.open(url, passphrase="pw")
    assert "damaged or edited config" in str(err.value)
    assert ran == []  # refused before any key derivation
    monkeypatch.undo()
    doc["wrappings"][0]["params"] = FAST_KDF
    cfg.write_text(json.dumps(doc))
    Repository.open(url, passphrase="pw")  # the same repository with its own parameters


def test_argon2_work_is_bounded_as_a_whole(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each parameter within its bound, but memory times passes 16 times the default's."""
    import json

    import cryptdisk.backup._keys as keys_mod

    top = dict(memory_cost=1024 * 1024, iterations=48, lanes=16)
    big = dict(memory_cost=1024 * 1024, iterations=3 + 1, lanes=4)
    keys_mod.check_kdf_params(dict(top, iterations=3))  # 16x the default's work: allowed
    keys_mod.check_kdf_params(dict(top, memory_cost=64 * 1024))
    for params in (top, big):
        with pytest.raises(BackupError, match=r"memory_cost x iterations \d+ is over 3145728"):
            keys_mod.check_kdf_params(params)
    url = str(tmp_path / "repo")
    ran = []
    monkeypatch.setattr(keys_mod, "Argon2id", lambda **kw: ran.append(kw))
    with pytest.raises(BackupError, match="is over 3145728"):  # never written either
        Repository.init(url, passphrase="pw", kdf_params=big)
    monkeypatch.undo()
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    cfg = tmp_path / "repo" / "config"
    doc = json.loads(cfg.read_text())
    doc["wrappings"][0]["params"] = big
    cfg.write_text(json.dumps(doc))
    monkeypatch.setattr(keys_mod, "Argon2id", lambda **kw: ran.append(kw))
    with pytest.raises(BackupError, match="is over 3145728"):
        Repository.open(url, passphrase="pw")
    assert ran == []


def test_an_encrypted_part_swapped_for_another_fails_the_backup(tmp_path: Path) -> None:
    """Encrypted parts have no SHA-256 in the catalog: the backup checks each one's footer
    (part id, rows, size) as it reads it, so a part file replaced by another valid part of
    the database fails the backup instead of being stored under the wrong part; the
    manifest records the SHA-256 of the bytes read, which a restore checks."""
    src = tmp_path / "a.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE t (id BIGINT, s VARCHAR)")
    for _ in range(2):  # the same rows twice: two parts of the same size
        db.sql("INSERT INTO t SELECT range, md5(range::VARCHAR) FROM range(100)")
    paths = [src / "data" / p.path for p in db.table("t").parts]
    assert [p.sha256 for p in db.table("t").parts] == ["", ""]
    db.close()
    repo = _repo(tmp_path)
    os.replace(paths[1], tmp_path / "kept")
    os.link(paths[0], paths[1])
    with pytest.raises(BackupError, match="not what the catalog recorded"):
        create(repo, src)
    os.replace(tmp_path / "kept", paths[1])
    good = create(repo, src)
    manifest = repo.read_manifest(good.id)
    assert all(len(p["sha256"]) == 64 for t in manifest["tables"] for p in t["parts"])
    restore(repo, good.id, tmp_path / "r.db")
    assert content(tmp_path / "r.db") == content(src)


def test_a_repository_url_with_credentials_is_refused_before_anything_shows_it() -> None:
    secret = "s3cr3t-do-not-leak"
    for url, options in ((f"memory://user:{secret}@bucket/repo", None),
                         ("memory://bucket/repo", {"endpoint_url": f"http://k:{secret}@h/"})):
        with pytest.raises(ConfigError, match="may not hold credentials") as info:
            Repository.init(url, passphrase="pw", kdf_params=FAST_KDF, storage_options=options)
        assert secret not in str(info.value) and secret not in repr(info.value)
        with pytest.raises(ConfigError):
            Repository.open(url, passphrase="pw", storage_options=options)



def test_a_local_repository_is_private_to_its_owner(tmp_path: Path) -> None:
    """Directories 0700 and files 0600 whatever the umask: chunk names and sizes, and the
    wrapped keys, are no other local user's to read."""
    src = tmp_path / "a.db"
    make_db(src, rows=100)
    old = os.umask(0o022)
    try:
        repo = Repository.init(str(tmp_path / "deep" / "repo"), passphrase="pw",
                               kdf_params=FAST_KDF)
        create(repo, src)
    finally:
        os.umask(old)
    top = tmp_path / "deep" / "repo"
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777
             for p in [top.parent, top, *top.rglob("*")]}
    assert {m for p, m in modes.items() if (tmp_path / p).is_dir()} == {0o700}, modes
    assert {m for p, m in modes.items() if (tmp_path / p).is_file()} == {0o600}, modes


@pytest.mark.parametrize("store", ["local", "local-no-hard-links", "s3"])
def test_of_inits_at_once_one_makes_the_repository_and_the_others_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str) -> None:
    """Inits that all found the location empty (held at a barrier just after, while
    Argon2id runs) each wrote their config over the others' and each reported
    'created ... (id X)' with its own id: the last one's won, the others' passphrases
    and keys opened nothing. Now exactly one succeeds, the others raise BackupError.
    local-no-hard-links: a file system without hard links (FAT, exFAT, some SMB shares:
    link() is EPERM) made every init fail with PermissionError; one succeeds there too."""
    import errno
    import threading

    import cryptdisk.backup._repo as repo_module

    real = repo_module.wrap_with_passphrase
    barrier = threading.Barrier(3, timeout=60)

    def held(*args, **kw):  # type: ignore[no-untyped-def]
        barrier.wait()
        return real(*args, **kw)

    monkeypatch.setattr(repo_module, "wrap_with_passphrase", held)
    with contextlib.ExitStack() as stack:
        if store == "s3":
            from tests.disks.s3server import ENV, make_bucket, s3_server

            endpoint = stack.enter_context(s3_server())
            for name, value in ENV.items():
                monkeypatch.setenv(name, value)
            make_bucket(endpoint, "racing-inits")
            url, opts = "s3://racing-inits/repo", {"endpoint_url": endpoint}
        else:
            url, opts = str(tmp_path / "repo"), {}
        if store == "local-no-hard-links":
            def no_link(*_args, **_kw):  # type: ignore[no-untyped-def]
                raise PermissionError(errno.EPERM, "Operation not permitted")

            monkeypatch.setattr(os, "link", no_link)
        made: list[tuple[str, Repository]] = []
        failed: list[BaseException] = []

        def init(passphrase: str) -> None:
            try:
                made.append((passphrase, Repository.init(url, passphrase=passphrase,
                                                         kdf_params=FAST_KDF,
                                                         storage_options=opts)))
            except BaseException as exc:  # reported below
                failed.append(exc)

        threads = [threading.Thread(target=init, args=(f"pw{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(made) == 1, (made, failed)
        assert len(failed) == 2 and all(isinstance(e, BackupError) for e in failed), failed
        assert all("already a backup repository" in str(e) for e in failed)
        pw, winner = made[0]
        assert Repository.open(url, passphrase=pw, storage_options=opts).id == winner.id
        if store != "s3":
            assert sorted(os.listdir(tmp_path / "repo")) == ["config"]


@pytest.mark.parametrize("store", ["local", "s3"])
def test_wrappings_added_at_once_are_all_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              store: str) -> None:
    """Two 'backup keys --add-passphrase-env' at once each read the config, added their
    wrapping and wrote it: the last write won and the other passphrase, reported added
    (exit 0), opened nothing, so retiring the old key after it could lock the repository
    out. Now the config is re-read and rewritten under a lock (S3: If-Match)."""
    import threading

    import cryptdisk.backup._repo as repo_module

    with contextlib.ExitStack() as stack:
        if store == "s3":
            from tests.disks.s3server import ENV, make_bucket, s3_server

            endpoint = stack.enter_context(s3_server())
            for name, value in ENV.items():
                monkeypatch.setenv(name, value)
            make_bucket(endpoint, "racing-keys")
            url, opts = "s3://racing-keys/repo", {"endpoint_url": endpoint}
        else:
            url, opts = str(tmp_path / "repo"), {}
        Repository.init(url, passphrase="pw", kdf_params=FAST_KDF, storage_options=opts)
        opened = [Repository.open(url, passphrase="pw", storage_options=opts)
                  for _ in range(2)]
        real = repo_module.wrap_with_passphrase
        barrier = threading.Barrier(2, timeout=60)

        def held(*args, **kw):  # type: ignore[no-untyped-def]
            out = real(*args, **kw)
            barrier.wait()  # both have read the config and made their wrapping
            return out

        monkeypatch.setattr(repo_module, "wrap_with_passphrase", held)
        failed: list[BaseException] = []

        def add(repo: Repository, passphrase: str) -> None:
            try:
                repo.add_wrapping(passphrase=passphrase, kdf_params=FAST_KDF)
            except BaseException as exc:  # reported below
                failed.append(exc)

        threads = [threading.Thread(target=add, args=(r, f"new{i}"))
                   for i, r in enumerate(opened)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failed, failed
        for pw in ("pw", "new0", "new1"):
            assert Repository.open(url, passphrase=pw, storage_options=opts).id == opened[0].id
        assert len(Repository.read_config(url, opts)[2]["wrappings"]) == 3


def test_a_wrapping_is_added_on_s3_when_the_etag_is_not_the_md5(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 object's ETag is the MD5 of its bytes only for a plain single-part PUT: under
    SSE-KMS (or SSE-C) it is an opaque tag. add_wrapping once required the two to match
    and, with every ETag opaque, failed ten times over with 'kept changing'; the
    If-Match PUT is what guards the update, so a wrapping is added whatever the tag."""
    import hashlib

    from moto.s3.models import FakeKey

    from tests.disks.s3server import ENV, make_bucket, s3_server

    def opaque(key: FakeKey) -> str:  # as under SSE-KMS: not the MD5 of the object
        return '"' + hashlib.sha256(key.value).hexdigest()[:32] + '"'

    monkeypatch.setattr(FakeKey, "etag", property(opaque))
    with s3_server() as endpoint:
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
        make_bucket(endpoint, "kms-etags")
        url, opts = "s3://kms-etags/repo", {"endpoint_url": endpoint}
        Repository.init(url, passphrase="pw", kdf_params=FAST_KDF, storage_options=opts)
        repo = Repository.open(url, passphrase="pw", storage_options=opts)
        repo.add_wrapping(passphrase="new", kdf_params=FAST_KDF)
        assert Repository.open(url, passphrase="new", storage_options=opts).id == repo.id
        assert len(Repository.read_config(url, opts)[2]["wrappings"]) == 2


def test_an_s3_init_whose_config_put_fails_raises_the_stores_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The conditional PUT of a new repository's config failing for another reason than a
    config already there (access denied, say) raised the FileNotFoundError of the check
    that followed ('no config there'), hiding the store's own error; it is the store's
    error now."""
    import s3fs

    from tests.disks.s3server import ENV, make_bucket, s3_server

    real = s3fs.S3FileSystem.pipe_file

    def denied(self, path, value=None, mode="overwrite", **kw):  # type: ignore[no-untyped-def]
        if mode == "create":
            raise PermissionError(f"Access Denied: {path}")
        return real(self, path, value, mode=mode, **kw)

    with s3_server() as endpoint:
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
        make_bucket(endpoint, "denied-init")
        monkeypatch.setattr(s3fs.S3FileSystem, "pipe_file", denied)
        with pytest.raises(PermissionError, match="Access Denied"):
            Repository.init("s3://denied-init/repo", passphrase="pw", kdf_params=FAST_KDF,
                            storage_options={"endpoint_url": endpoint})


def test_an_s3_wrapping_whose_config_put_is_denied_raises_the_stores_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """add_wrapping's conditional PUT of the config failing for another reason than a
    concurrent update (access denied, say) was tried ten times and reported as
    'config kept changing ... another process changes the repository's keys', hiding
    the store's error; it is the store's error now, at once."""
    from tests.disks.s3server import ENV, make_bucket, s3_server

    calls: list[str] = []

    with s3_server() as endpoint:
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
        make_bucket(endpoint, "denied-keys")
        url, opts = "s3://denied-keys/repo", {"endpoint_url": endpoint}
        Repository.init(url, passphrase="pw", kdf_params=FAST_KDF, storage_options=opts)
        repo = Repository.open(url, passphrase="pw", storage_options=opts)
        real = repo.fs.pipe_file

        def denied(path, value=None, mode="overwrite", **kw):  # type: ignore[no-untyped-def]
            if "IfMatch" in kw:
                calls.append(path)
                raise PermissionError(f"Access Denied: {path}")
            return real(path, value, mode=mode, **kw)

        monkeypatch.setattr(repo.fs, "pipe_file", denied)
        with pytest.raises(PermissionError, match="Access Denied"):
            repo.add_wrapping(passphrase="new", kdf_params=FAST_KDF)
        assert len(calls) == 1
        assert len(Repository.read_config(url, opts)[2]["wrappings"]) == 1


@pytest.mark.parametrize("when", ["between the read and the write", "after the write"])
def test_a_wrapping_added_on_a_store_without_conditional_writes_is_not_lost(
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, when: str) -> None:
    """On a store other than local and S3 (here fsspec's memory store) add_wrapping read the
    config, added its wrapping and wrote it back unconditionally: another update landing
    between the read and the write, or writing over ours a config it had read before,
    lost a wrapping whose add had reported success. Now the config is compared before
    the write and read back after it, and the change applied again to the newer one."""
    import json

    from cryptdisk.backup._keys import wrap_with_passphrase

    url = f"memory://wrapping-race/{'between' if 'between' in when else 'after'}"
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    ours, theirs = (Repository.open(url, passphrase="pw") for _ in range(2))
    path = f"{ours.root}/config"
    stale = json.loads(ours.fs.cat_file(path))  # the config the other update read
    real_pipe, real_cat = ours.fs.pipe_file, ours.fs.cat_file
    done = False

    def cat_file(p: str, *args, **kw):  # type: ignore[no-untyped-def]
        nonlocal done
        out = real_cat(p, *args, **kw)
        if p == path and when.startswith("between") and not done:
            done = True  # the other update runs whole after ours read the config
            theirs.add_wrapping(passphrase="theirs", kdf_params=FAST_KDF)
        return out

    def pipe_file(p: str, data: bytes, *args, **kw):  # type: ignore[no-untyped-def]
        nonlocal done
        real_pipe(p, data, *args, **kw)
        if p == path and when.startswith("after") and not done:
            done = True  # the other update writes the config it read, its wrapping added
            stale["wrappings"].append(wrap_with_passphrase(theirs._master, theirs.id,
                                                           "theirs", FAST_KDF))
            real_pipe(p, json.dumps(stale, indent=1, sort_keys=True).encode())

    monkeypatch.setattr(ours.fs, "cat_file", cat_file)
    monkeypatch.setattr(ours.fs, "pipe_file", pipe_file)
    ours.add_wrapping(passphrase="ours", kdf_params=FAST_KDF)
    monkeypatch.undo()
    assert done
    for pw in ("pw", "ours", "theirs"):
        assert Repository.open(url, passphrase=pw).id == ours.id, pw
    assert len(Repository.read_config(url)[2]["wrappings"]) == 3
