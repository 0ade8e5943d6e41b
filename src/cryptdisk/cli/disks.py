"""``cryptdisk disks``, ``cryptdisk policies`` and ``cryptdisk convert``.

``disks`` and ``policies`` list a config's disks and storage policies the way
ClickHouse's ``system.disks`` and ``system.storage_policies`` do. ``convert``
re-encrypts a directory tree between plaintext, ClickHouse's ``ENC`` format and
cryptdisk's authenticated format, verifying every file, resumably.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

from ..config import Config, load_config
from ..disks import ClickHouseDisk, Disk, EncryptedDisk, LocalDisk, convert_tree
from ..errors import ConfigError, PolicyError

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("disks", help="list the disks of a config (like system.disks)")
    p.add_argument("--config", "-c", required=True, help="TOML or ClickHouse XML config")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=_disks)

    p = sub.add_parser("policies",
                       help="list the storage policies of a config (like system.storage_policies)")
    p.add_argument("--config", "-c", required=True, help="TOML or ClickHouse XML config")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=_policies)

    p = sub.add_parser(
        "convert", help="re-encrypt a directory tree (ClickHouse ENC / plain <-> cryptdisk)",
        description="Convert every file below SRC into DST in the chosen format, reading each "
        "file's format from its header and its key from the config, and verifying every "
        "converted file by reading it back. Resumable: run it again after an interruption.")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument("--config", "-c", required=True, help="TOML or ClickHouse XML config")
    p.add_argument("--to", choices=["cryptdisk", "clickhouse", "plain"], default="cryptdisk")
    p.add_argument("--disk", help="take keys, algorithm and segment size from this disk "
                   "(an encrypted disk for --to cryptdisk, a clickhouse disk for --to clickhouse)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=_convert)


# -- listing ------------------------------------------------------------------------


def _disk_row(disk: Disk) -> dict[str, Any]:
    inner = getattr(disk, "inner", None)
    algorithm = None
    if isinstance(disk, EncryptedDisk):
        algorithm = (disk.algorithm or disk.keyring.current_key().algorithm).label.lower()
    elif isinstance(disk, ClickHouseDisk):
        algorithm = disk.algorithm
    return {"name": disk.name, "path": disk.path, "type": disk.type,
            "is_encrypted": bool(disk.is_encrypted), "disk": inner.name if inner else "",
            "algorithm": algorithm or ""}


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _emit(rows: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not rows:
        return
    rows = [{k: _text(v) for k, v in r.items()} for r in rows]  # true/false as in system.disks
    columns = list(rows[0])
    if fmt == "csv":
        writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    text = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for t in text:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())


def _disks(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    _emit([_disk_row(cfg.disks[n]) for n in sorted(cfg.disks)], args.format)
    return 0


def _policies(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    rows = []
    for pname in sorted(cfg.policies):
        for priority, vol in enumerate(cfg.policies[pname].volumes, 1):
            disks = [d.name for d in vol.disks]
            rows.append({"policy_name": pname, "volume_name": vol.name,
                         "volume_priority": priority,
                         "disks": disks if args.format == "json" else ",".join(disks)})
    _emit(rows, args.format)
    return 0


# -- convert ---------------------------------------------------------------------------


def _pick_disk(cfg: Config, name: str | None, kind: type[Disk], flag: str) -> Disk | None:
    if name is not None:
        disk = cfg.disk(name)
        if not isinstance(disk, kind):
            raise PolicyError(f"disk {name!r} is a {disk.type} disk; {flag} needs a "
                              f"{kind.type} disk")
        return disk
    found = [d for d in cfg.disks.values() if isinstance(d, kind)]
    return found[0] if len(found) == 1 else None


def _target(cfg: Config, to: str, dst: str, disk_name: str | None) -> Disk:
    out = LocalDisk("destination", dst)
    if to == "plain":
        return out
    if to == "cryptdisk":
        chosen = _pick_disk(cfg, disk_name, EncryptedDisk, "--to cryptdisk")
        if isinstance(chosen, EncryptedDisk):
            # A tree meant for that disk gets its names encrypted as the disk would.
            return EncryptedDisk("destination", out, chosen.keyring, algorithm=chosen.algorithm,
                                 segment_size=chosen.segment_size,
                                 names_key_id=chosen.names.key_id if chosen.names else None)
        if cfg.keyring is None:
            raise ConfigError("no key to encrypt with: the config has no [keyring]",
                              path=cfg.path, hint="add a [keyring], or pass --disk NAME of an "
                              "encrypted disk")
        return EncryptedDisk("destination", out, cfg.keyring)
    chosen = _pick_disk(cfg, disk_name, ClickHouseDisk, "--to clickhouse")
    if not isinstance(chosen, ClickHouseDisk):
        raise ConfigError("--to clickhouse needs the clickhouse disk whose keys to use",
                          path=cfg.path, hint="pass --disk NAME (a disk of type clickhouse)")
    return ClickHouseDisk("destination", out, list(chosen.keys.values()), chosen.current_key_id,
                          algorithm=chosen.algorithm)


def _convert(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    cfg = load_config(args.config)
    target = _target(cfg, args.to, args.dst, args.disk)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.src)
                for f in fs)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TimeRemainingColumn())
    with Progress(*columns, disable=args.quiet or not sys.stderr.isatty(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"converting to {args.to}", total=total)
        summary = convert_tree(args.src, args.dst, target, config=cfg,
                               progress=lambda _p, n: bar.advance(task, n))
    sources = ", ".join(f"{n} {fmt}" for fmt, n in sorted(summary.formats.items())) or "none"
    print(f"converted {summary.converted} file(s) ({summary.bytes} bytes) to {args.to}, "
          f"skipped {summary.skipped} already converted; every file verified "
          f"(sources: {sources})")
    if summary.log_tails:
        print(f"left out {summary.log_tails} -cdlogtail file(s): each is the saved last "
              "segment of the log beside it, which was read through it (converted whole)")
    if summary.sqlite_files:
        print(f"left out {summary.sqlite_files} file(s) of SQLite's beside a database "
              "(-shm, an empty -wal, a finished -journal, -wal-cdtail/-journal-cdtail): "
              "they hold none of its data")
    if summary.sqlite_databases and args.to != "plain":
        print(f"note: {summary.sqlite_databases} SQLite database(s) converted into sealed "
              "files, readable (cryptdisk decrypt, convert --to plain) but not opened by "
              "cryptdisk.sqlite; for a database to use encrypted, run 'cryptdisk sqlite "
              "encrypt' on the plain database")
    if summary.removed_temps:
        print(f"removed {summary.removed_temps} unfinished temporary file(s) from an "
              "interrupted run")
    return 0
