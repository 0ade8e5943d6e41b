"""Backup and restore speed of cryptdisk.backup on the embedded database, a quick measurement.

    python -m cryptdisk.bench.backup_speed [--rows N] [--workdir DIR] [--restic]

Builds a database of N rows (the README's table: BIGINT, md5 VARCHAR, DOUBLE) in a
temporary directory, backs it up into a local repository, adds 1% rows and backs it up
again, verifies, and restores the second backup. Prints MB/s of the parts' plaintext
(Parquet) bytes, the process's CPU seconds, and the second backup's stored bytes as a
share of the first's. One run; the numbers depend on the machine and its disk.

``--restic`` keeps the table unencrypted (``storage_policy = 'plain'``) so that restic
(Debian's package, its default settings) backs up the same Parquet bytes from
``src.db/plain`` beside cryptdisk, and restores them (files only, where cryptdisk
re-inserts the rows and checks the database).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..backup import Repository, create, restore, verify
from ..db import connect

__all__ = ["main"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _du(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(path) for f in fs)


class _Restic:
    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("restic")
        if exe is None:
            raise SystemExit("--restic: restic is not installed (apt-get install restic)")
        self.exe, self.repo = exe, workdir / "restic-repo"
        self.env = dict(os.environ, RESTIC_REPOSITORY=str(self.repo),
                        RESTIC_PASSWORD="bench")  # noqa: S106
        self.run("init")

    def run(self, *argv: str) -> tuple[float, float]:
        t, c = time.perf_counter(), _children_cpu()
        subprocess.run([self.exe, "-q", *argv], env=self.env, check=True)
        return time.perf_counter() - t, _children_cpu() - c


def run(rows: int, workdir: Path, with_restic: bool = False) -> list[str]:
    src = workdir / "src.db"
    db = connect(src)
    plain = " SETTINGS storage_policy = 'plain'" if with_restic else ""
    db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int"
           + plain)
    db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 FROM range({int(rows)})")  # noqa: S608
    db.close()
    # a cheap passphrase KDF: this measures the data path, not Argon2id
    repo = Repository.init(str(workdir / "repo"), passphrase="bench",  # noqa: S106
                           kdf_params={"memory_cost": 1024, "iterations": 1, "lanes": 1})
    out = []
    restic = _Restic(workdir) if with_restic else None
    t, c = time.perf_counter(), _cpu()
    first = create(repo, src)
    t1, c1 = time.perf_counter() - t, _cpu() - c
    mb = first.bytes / 1e6
    out.append(f"rows {rows}: parts {mb:.1f} MB plaintext, stored {first.stored_bytes / 1e6:.1f} "
               f"MB ({first.chunks} chunks)")
    out.append(f"first backup  {t1:6.2f} s  {mb / t1:6.0f} MB/s  cpu {c1:.2f} s")
    if restic is not None:
        rt, rc = restic.run("backup", str(src / "plain"))
        r_first = _du(restic.repo)
        out.append(f"restic first  {rt:6.2f} s  {first.bytes / 1e6 / rt:6.0f} MB/s  cpu {rc:.2f} s"
                   f"  repository {r_first / 1e6:.1f} MB")
    db = connect(src)
    extra = rows // 100
    db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 "  # noqa: S608
           f"FROM range({int(rows)}, {int(rows + extra)})")
    db.close()
    t, c = time.perf_counter(), _cpu()
    second = create(repo, src)
    t2, c2 = time.perf_counter() - t, _cpu() - c
    if restic is not None:
        rt, rc = restic.run("backup", str(src / "plain"))
        grown = _du(restic.repo) - r_first
        out.append(f"restic second {rt:6.2f} s  after +1% rows: repository grew "
                   f"{grown / 1e6:.2f} MB = {100 * grown / r_first:.1f}%  cpu {rc:.2f} s")
    out.append(f"second backup {t2:6.2f} s  after +1% rows: stored {second.stored_bytes / 1e6:.2f} "
               f"MB = {100 * second.stored_bytes / first.stored_bytes:.1f}% of the first "
               f"({second.new_chunks} of {second.chunks} chunks new)  cpu {c2:.2f} s")
    t, c = time.perf_counter(), _cpu()
    report = verify(repo)
    tv, cv = time.perf_counter() - t, _cpu() - c
    out.append(f"verify        {tv:6.2f} s  {second.bytes / 1e6 / tv:6.0f} MB/s  cpu {cv:.2f} s  "
               f"({report.chunks_checked} chunks, ok={report.ok})")
    t, c = time.perf_counter(), _cpu()
    restore(repo, second.id, workdir / "restored.db")
    tr, cr = time.perf_counter() - t, _cpu() - c
    out.append(f"restore       {tr:6.2f} s  {second.bytes / 1e6 / tr:6.0f} MB/s  cpu {cr:.2f} s  "
               "(re-inserts the rows and runs Database.check())")
    if restic is not None:
        rt, rc = restic.run("restore", "latest", "--target", str(workdir / "restic-restored"))
        out.append(f"restic restore {rt:5.2f} s  {second.bytes / 1e6 / rt:6.0f} MB/s  "
                   f"cpu {rc:.2f} s  (files only)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cryptdisk.bench.backup_speed",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", help="where to build (default: a temporary directory)")
    parser.add_argument("--restic", action="store_true",
                        help="also run restic on the same (unencrypted) parts")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="cd-backup-speed-") as tmp:
        for line in run(args.rows, Path(tmp), args.restic):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
