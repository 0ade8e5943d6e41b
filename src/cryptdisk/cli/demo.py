"""``cryptdisk demo``: ClickHouse's encrypted-vs-plain experiment on the embedded database.

Creates a database in a scratch directory, an encrypted and a plain table,
inserts N rows into each, runs ``avg(c_float)`` and ``sum(c_int)`` cold and
warm with all threads and with one, prints the timings side by side with the
overhead ratio, shows ``system.disks`` and the first bytes of each part on
disk (ciphertext against Parquet's ``PAR1``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["register"]

DEFAULT_ROWS = 10_000_000
SAMPLE = "c4ca4238a0b923820dcc509a6f75849b"  # md5('1'), the c_str of row n = 1

# ClickHouse's experiment, as ``cryptdisk bench olap-db`` runs it (bench/olap_db.py)
POLICIES = {"plain": "plain", "cryptdisk": "default"}  # strategy -> storage policy
TABLES = {"plain": "t_plain", "cryptdisk": "t_encrypted"}
SCHEMA = "(c_int BIGINT, c_str VARCHAR, c_float DOUBLE)"
INSERT_SQL = ("SELECT (hash(n) >> 1)::BIGINT, md5(n::VARCHAR), "
              "n / (hash(n) >> 1)::DOUBLE * 1e7 FROM range(1, {rows} + 1) r(n)")
QUERIES = {"avg(c_float)": "SELECT avg(c_float) FROM {table}",
           "sum(c_int)": "SELECT sum(c_int) FROM {table}"}


def create_tables(db: Any) -> None:
    for strategy, policy in POLICIES.items():
        db.sql(f"CREATE TABLE {TABLES[strategy]} {SCHEMA} SETTINGS storage_policy = '{policy}'")


def time_query(db: Any, sql: str) -> float:
    """Wall seconds of one query, result fetched."""
    t0 = time.perf_counter()
    db.query(sql)
    return time.perf_counter() - t0


def _hexdump(data: bytes, width: int = 16) -> str:
    lines = []
    for i in range(0, len(data), width):
        chunk = data[i : i + width]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"  {i:08x}  {chunk.hex(' '):<{width * 3}} |{text}|")
    return "\n".join(lines)


def _insert(db: Any, console: Any, rows: int) -> dict[str, float]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    took = {}
    # Narrow enough for 80 columns at 10M rows: "INSERT t_encrypted", a 20-cell bar,
    # 10000000/10000000 and the time take about 65.
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
               TimeElapsedColumn())
    console.print(f"INSERT {rows:,} rows into each table")
    with Progress(*columns, console=console, transient=False) as bar:
        for strategy, table in TABLES.items():
            task = bar.add_task(f"INSERT {table}", total=rows)
            t0 = time.perf_counter()
            db.insert_query(table, INSERT_SQL.format(rows=rows),
                            on_rows=lambda n, task=task: bar.advance(task, n))
            took[strategy] = time.perf_counter() - t0
    return took


def _queries(path: str, repeats: int) -> list[tuple[str, float, float]]:
    from ..db import connect

    out = []
    for qname, template in QUERIES.items():
        cases: dict[str, dict[str, list[float]]] = {}
        for _round in range(repeats):  # interleaved: plain, encrypted, plain, ...
            for strategy, table in TABLES.items():
                sql = template.format(table=table)
                with connect(path, read_only=True) as db:
                    cases.setdefault("cold", {}).setdefault(strategy, []).append(
                        time_query(db, sql))
                    for label, setting in (("warm", "RESET threads"),
                                           ("warm, 1 thread", "SET threads = 1")):
                        db.sql(setting)
                        cases.setdefault(label, {}).setdefault(strategy, []).append(
                            min(time_query(db, sql) for _ in range(3)))
        for label, by in cases.items():
            out.append((f"{qname} {label}", statistics.median(by["plain"]),
                        statistics.median(by["cryptdisk"])))
    return out


def _show_bytes(db: Any, console: Any) -> None:
    for (table, disk, rel) in db.query('SELECT "table", disk, path FROM system.parts '
                                       'ORDER BY "table" LIMIT 2'):
        full = os.path.join(db.config.disks[disk].path, rel)
        with open(full, "rb") as f:
            data = f.read()
        kind = "Parquet, readable by anyone" if data[:4] == b"PAR1" else \
            "cryptdisk header, then AES-GCM ciphertext"
        console.print(f"[bold]{table}[/bold] ({len(data):,} bytes on disk, {kind}):")
        console.print(f"  {os.path.relpath(full, db.path)}", overflow="fold", markup=False,
                      highlight=False)
        console.print(_hexdump(data[:64]), markup=False, highlight=False)
        found = data.find(SAMPLE.encode()) >= 0
        console.print(f"  c_str value md5('1') = {SAMPLE} in these bytes: "
                      f"{'[red]yes[/red]' if found else '[green]no[/green]'}")


@contextlib.contextmanager
def _quiet_key_notice() -> Iterator[None]:
    """The demo says where its key is itself: drop the database's own notice (said once)."""
    logger = logging.getLogger("cryptdisk.db")

    def drop(record: logging.LogRecord) -> bool:
        return "created the encryption key" not in record.getMessage()

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _positive_rows(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of rows: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    if value > 2**63 - 1:  # a BIGINT: DuckDB's range() takes no larger
        raise argparse.ArgumentTypeError(f"must be at most 2**63-1, not {text}")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    import pyarrow as pa
    from rich.console import Console
    from rich.table import Table

    from ..db import connect

    if args.files:
        from ._demo_files import run_file_demo

        rows = 200_000 if args.rows == DEFAULT_ROWS else args.rows
        return run_file_demo(rows, args.dir)
    from ._demo_files import claim_workdir

    console = Console()
    workdir = args.dir or tempfile.mkdtemp(prefix="cryptdisk-demo-")
    claim_workdir(workdir, ("demo.db", "demo.db.key"))
    path = os.path.join(workdir, "demo.db")
    if os.path.exists(path):
        shutil.rmtree(path)
        if os.path.exists(path + ".key"):
            os.remove(path + ".key")
    console.print(f"[bold]cryptdisk demo[/bold]: ClickHouse's encrypted-vs-plain experiment on "
                  f"an embedded database in {path}")
    try:
        with _quiet_key_notice(), connect(path) as db:
            console.print(f"key file (mode 0600, outside the database directory): {path}.key",
                          overflow="fold")
            create_tables(db)
            took = _insert(db, console, args.rows)
            console.print(f"\n[bold]system.disks[/bold] (paths in {path})", overflow="fold")
            from .db import format_table

            rows = db.query("SELECT name, type, is_encrypted, path FROM system.disks")
            disks = pa.table({"name": [r[0] for r in rows], "type": [r[1] for r in rows],
                              "is_encrypted": [r[2] for r in rows],
                              "path": [os.path.relpath(r[3], path) + "/" for r in rows]})
            console.print(format_table(disks), markup=False)
            console.print("\n[bold]system.parts[/bold] and [bold]system.keys[/bold] "
                          "(ids and counts, never key material)")
            console.print(format_table(db.sql(  # system.disks shows the disks; 80 columns
                'SELECT "table", rows, bytes, bytes_on_disk, key_id, algorithm '
                "FROM system.parts ORDER BY 1")), markup=False)
            console.print(format_table(db.sql("SELECT * FROM system.keys")), markup=False)
            console.print()
            _show_bytes(db, console)
        table = Table(title=f"\n{args.rows:,} rows: plain vs encrypted (median, seconds)")
        for col in ("step", "plain", "encrypted", "encrypted / plain"):
            table.add_column(col, justify="left" if col == "step" else "right")
        table.add_row("INSERT", f"{took['plain']:.3f}", f"{took['cryptdisk']:.3f}",
                      f"{took['cryptdisk'] / took['plain']:.2f}")
        with console.status("running queries (cold, warm, one thread)..."):
            results = _queries(path, args.repeats)
        for name, plain, enc in results:
            table.add_row(name, f"{plain:.4f}", f"{enc:.4f}", f"{enc / plain:.2f}")
        console.print(table)
        console.print("cold = first query after opening the database (decrypts and decodes the "
                      "row groups it needs, streaming them to DuckDB); warm = repeated (decoded "
                      "row groups served from the decrypted cache in memory). Timings on a "
                      "shared machine are noisy; ratios are medians of "
                      "interleaved runs.")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep or args.dir:
            console.print(f"kept {path} (key {path}.key); try: cryptdisk sql {path}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="encrypted vs plain tables on an embedded database",
                       description=__doc__)
    p.add_argument("--rows", type=_positive_rows, default=DEFAULT_ROWS,
                   help=f"rows per table (default {DEFAULT_ROWS:,}, as in ClickHouse's test)")
    p.add_argument("--repeats", type=_positive_rows, default=3,
                   help="interleaved rounds per query (default 3)")
    p.add_argument("--dir", help="work here instead of a temporary directory (kept)")
    p.add_argument("--keep", action="store_true", help="keep the temporary database")
    p.add_argument("--files", action="store_true",
                   help="instead, tour the file format: encrypt a dataset, random reads, "
                   "tampering, key rotation (default 200,000 rows)")
    p.set_defaults(func=cmd_demo)
