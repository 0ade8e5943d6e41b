"""Worker bodies of ``cryptdisk bench backup``: one phase of one tool per call.

A round runs, for cryptdisk and for restic in turn: the first backup (into a new
repository), the second backup after 1% more rows, and the restore of the second
backup. Each phase is its own worker process, so its CPU seconds (restic's too: it is
a reaped child) and peak RSS are its own; the repository and the restored copy live in
the round's directory between phases. Each body checks its result (the restored bytes
or rows), so a wrong answer fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ._measure import Sample, Stopwatch

__all__ = ["cryptdisk_phase", "prepare", "restic_phase"]

#: Argon2id parameters of the benchmark's repository: this measures the data path, not
#: the key derivation (a one-off ~0.1 s at the defaults).
_FAST_KDF = {"memory_cost": 1024, "iterations": 1, "lanes": 1}
_PASSPHRASE = "cryptdisk bench backup"  # noqa: S105 - a throwaway repository's


def _du(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(path) for f in fs)


def prepare(workdir: str, rows: int) -> list[Sample]:
    """``first.db`` with ``rows`` rows and ``second.db``, the same plus 1% more rows.

    The table's storage policy is ``plain``: its parts are Parquet files under
    ``DB/plain`` that restic reads as they are, the same bytes cryptdisk backs up.
    """
    from ..db import connect

    first, second = Path(workdir) / "first.db", Path(workdir) / "second.db"
    with connect(first) as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int "
               "SETTINGS storage_policy = 'plain'")
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 "  # noqa: S608
               f"FROM range({int(rows)})")
    shutil.copytree(first, second, copy_function=os.link)  # parts are never rewritten
    shutil.copy2(f"{first}.key", f"{second}.key")
    extra = max(1, rows // 100)
    with connect(second) as db:
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 "  # noqa: S608
               f"FROM range({int(rows)}, {int(rows + extra)})")
        sizes = {"first": 0, "second": 0}
        sizes["second"] = sum(p.bytes for p in db.table("t").parts)
        sizes["first"] = sizes["second"] - db.table("t").parts[-1].bytes
    return [Sample("prepare", "bytes", float(sizes["second"]), extra={
        "first_bytes": sizes["first"], "second_bytes": sizes["second"],
        "rows": rows, "extra_rows": extra})]


def _round_dir(workdir: str, tool: str, phase: str) -> Path:
    d = Path(workdir) / f"round-{tool}"
    if phase == "first":
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    return d


def cryptdisk_phase(workdir: str, phase: str, first_bytes: int,
                    second_bytes: int) -> list[Sample]:
    """One phase of cryptdisk: ``first``, ``second`` or ``restore`` (see the module)."""
    from ..backup import Repository, create, find_backup, restore
    from ..db import connect

    d = _round_dir(workdir, "cryptdisk", phase)
    url = str(d / "repo")
    if phase == "first":
        repo = Repository.init(url, passphrase=_PASSPHRASE, kdf_params=_FAST_KDF)
        with Stopwatch() as sw:
            s = create(repo, Path(workdir) / "first.db")
        (d / "first-size").write_text(str(_du(d / "repo")))
        return [sw.rate("first backup", s.bytes, repository_bytes=_du(d / "repo"))]
    repo = Repository.open(url, passphrase=_PASSPHRASE)
    if phase == "second":
        with Stopwatch() as sw:
            s = create(repo, Path(workdir) / "second.db")
        first = int((d / "first-size").read_text())
        grown = _du(d / "repo") - first
        return [sw.rate("second backup (+1% rows)", s.bytes, repository_bytes=first + grown),
                Sample("second backup stores, % of the first", "%", 100 * grown / first,
                       better="lower", extra={"grown_bytes": grown, "first_bytes": first})]
    target = d / "restored.db"
    shutil.rmtree(target, ignore_errors=True)
    with Stopwatch() as sw:
        got = restore(repo, find_backup(repo, "latest", source=Path(workdir) / "second.db"),
                      target)
    with connect(target, read_only=True) as db:
        restored = sum(p.bytes for p in db.table("t").parts)
    if restored != second_bytes:
        raise AssertionError(f"restored {restored} bytes of parts, expected {second_bytes}")
    shutil.rmtree(target)
    os.unlink(f"{target}.key")
    return [sw.rate("restore (of the second)", second_bytes, rows=got["rows"])]


def restic_phase(workdir: str, phase: str, first_bytes: int,
                 second_bytes: int) -> list[Sample]:
    """One phase of restic (Debian's package, its default settings) on the same bytes."""
    exe = shutil.which("restic")
    if exe is None:
        raise RuntimeError("restic is not installed")
    d = _round_dir(workdir, "restic", phase)
    env: dict[str, Any] = dict(os.environ, RESTIC_REPOSITORY=str(d / "repo"),
                               RESTIC_PASSWORD=_PASSPHRASE, RESTIC_CACHE_DIR=str(d / "cache"))

    def restic(*argv: str) -> None:
        subprocess.run([exe, "-q", *argv], env=env, check=True, stdout=subprocess.DEVNULL)

    # restic records paths: both states are backed up from the same path, as a user
    # would, through hard links to the parts (restic does not follow symlinks)
    src = d / "src"
    if phase == "first":
        restic("init")
        shutil.copytree(Path(workdir) / "first.db" / "plain", src, copy_function=os.link)
        with Stopwatch() as sw:
            restic("backup", f"{src}/")
        (d / "first-size").write_text(str(_du(d / "repo")))
        return [sw.rate("first backup", first_bytes, repository_bytes=_du(d / "repo"))]
    if phase == "second":
        shutil.rmtree(src)
        shutil.copytree(Path(workdir) / "second.db" / "plain", src, copy_function=os.link)
        with Stopwatch() as sw:
            restic("backup", f"{src}/")
        first = int((d / "first-size").read_text())
        grown = _du(d / "repo") - first
        return [sw.rate("second backup (+1% rows)", second_bytes, repository_bytes=first + grown),
                Sample("second backup stores, % of the first", "%", 100 * grown / first,
                       better="lower", extra={"grown_bytes": grown, "first_bytes": first})]
    target = d / "restored"
    shutil.rmtree(target, ignore_errors=True)
    with Stopwatch() as sw:
        restic("restore", "latest", "--target", str(target))
    found = [p for p in target.rglob("*.parquet") if p.is_file()]
    restored = sum(p.stat().st_size for p in found)
    if restored != second_bytes:
        raise AssertionError(f"restic restored {restored} bytes of parts, expected "
                             f"{second_bytes}")
    shutil.rmtree(target)
    return [sw.rate("restore (of the second)", second_bytes)]
