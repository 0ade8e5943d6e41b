"""kill -9 at random points of create, prune and restore, trial after trial, on one repository.

Trials cycle through create, prune, create, restore. Each runs in a real child process
that reports its progress (a chunk stored, a chunk deleted, a part restored) and waits
for a go-ahead after each report; the parent picks a random report number and kills the
child there with SIGKILL (or lets it finish when it reports fewer). After every trial
the repository holds the old or the new state: the backups before, or those plus the
new one (create), or those minus the one the rule drops (prune), or exactly the same
bytes (restore); and ``verify`` passes, so no chunk that a complete backup references
was lost. At the end, the newest and the oldest remaining backups restore to the source
as it was when they were taken.

``CRYPTDISK_BACKUP_KILL_TRIALS`` sets the number of trials (default 10; the issue's
run is 100) and ``CRYPTDISK_BACKUP_KILL_SEED`` the seed (default 19): the same values
give the same operations and kill points.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

import cryptdisk
from cryptdisk.backup import Repository, create, restore, verify

from .helpers import FAST_KDF, content
from .test_crash import _kill, _spawn

TRIALS = int(os.environ.get("CRYPTDISK_BACKUP_KILL_TRIALS", "10"))
SEED = int(os.environ.get("CRYPTDISK_BACKUP_KILL_SEED", "19"))


def _run_until(proc: subprocess.Popen[str], word: str, kill_at: int) -> str | None:
    """Let the child go on report by report; kill it at report ``kill_at`` of ``word``.

    Returns the child's last line if it finished first (then it was not killed)."""
    assert proc.stdout is not None and proc.stdin is not None
    for line in proc.stdout:
        parts = line.split()
        if parts and parts[0] == word and int(parts[1]) >= kill_at:
            _kill(proc)
            return None
        if parts and parts[0] == "done":
            proc.wait()
            proc.stdout.close()
            proc.stdin.close()
            return line
        try:
            proc.stdin.write("\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
    raise AssertionError(f"the child ended without finishing ({proc.wait()})")


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != "lock"}


def _grow(src: Path, n: int) -> None:
    """A new part of new rows in ``t`` (chunks the next backups share) and a new table
    ``g<n>`` in place of ``g<n-1>`` (chunks only this state's backups reference, which
    a prune of them deletes)."""
    db = cryptdisk.connect(src)
    db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR) FROM range({n * 5000}, "
           f"{(n + 1) * 5000})")
    db.sql(f"CREATE TABLE g{n} (x VARCHAR)")
    db.sql(f"INSERT INTO g{n} SELECT md5((range + {n} * 1000000)::VARCHAR) FROM range(20000)")
    if n:
        db.sql(f"DROP TABLE g{n - 1}")
    db.close()


def test_kill_9_at_random_points_of_create_prune_restore(tmp_path: Path) -> None:
    rnd = random.Random(SEED)
    src = tmp_path / "src.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE t (x BIGINT, s VARCHAR)")
    db.close()
    _grow(src, 0)
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    expected: dict[str, Any] = {}  # backup id -> the source's content when it was taken
    for grown in range(1, 4):  # three complete backups to start with
        done = create(repo, src)
        expected[done.id] = content(src)
        _grow(src, grown)
    grown = 4
    chunks = done.chunks
    log = []
    for trial in range(TRIALS):
        before = repo.manifest_ids()
        op = ("create", "prune", "create", "restore")[trial % 4]
        if op == "prune" and len(before) < 2:
            op = "create"
        if op == "create":
            _grow(src, grown)
            grown += 1
            state = content(src)
            kill_at = rnd.randint(1, chunks + 3)  # past the end: it finishes
            proc = _spawn("backup", url, "pw", str(src), "step", stdin=subprocess.PIPE)
            done = _run_until(proc, "chunk", kill_at)
            after = repo.manifest_ids()
            new = [i for i in after if i not in before]
            assert after[:len(before)] == before and len(new) <= 1, (trial, op, kill_at)
            assert (done is not None) <= (len(new) == 1)  # finished: the backup exists
            for bid in new:  # killed after its manifest, or finished
                expected[bid] = state
                chunks = repo.read_manifest(bid)["chunks"]
        elif op == "prune":
            kill_at = rnd.randint(0, 8)  # 0: after the manifests
            proc = _spawn("prune", url, "pw", str(len(before) - 1), stdin=subprocess.PIPE)
            done = _run_until(proc, "deleted", kill_at)
            after = repo.manifest_ids()
            assert after in (before, before[1:]), (trial, op, kill_at)
            assert done is None or after == before[1:]
            for bid in set(expected) - set(after):
                del expected[bid]
        else:
            bid = rnd.choice(before)
            parts = sum(len(t["parts"]) for t in repo.read_manifest(bid)["tables"])
            kill_at = rnd.randint(1, parts + 1)
            was = _listing(tmp_path / "repo")
            target = tmp_path / f"r{trial}.db"
            proc = _spawn("restore", url, "pw", bid, str(target), stdin=subprocess.PIPE)
            done = _run_until(proc, "part", kill_at)
            assert _listing(tmp_path / "repo") == was, (trial, op, kill_at)  # only read
            if done is not None:
                assert content(target) == expected[bid]
            else:  # killed: no target, only the work in progress beside it
                assert not target.exists() and not Path(f"{target}.key").exists()
                # The next restore to the target deletes it (and no TARGET.key was left:
                # the kill points are the parts' reports, before the key is published).
                restore(repo, bid, target)
                assert content(target) == expected[bid]
            assert not list(tmp_path.glob(f"{target.name}.restoring*")), (trial, kill_at)
        log.append((op, kill_at, done is None))
        report = verify(repo)
        assert report.ok, (trial, op, kill_at, report)
        assert set(repo.manifest_ids()) == set(expected)
    ids = repo.manifest_ids()
    for n, bid in enumerate({ids[0], ids[-1]}):
        restore(repo, bid, tmp_path / f"final{n}.db")
        assert content(tmp_path / f"final{n}.db") == expected[bid]
    ops = {op for op, _k, _killed in log}
    assert TRIALS < 10 or ops == {"create", "prune", "restore"}, log
    assert TRIALS < 10 or any(killed for _op, _k, killed in log), log
