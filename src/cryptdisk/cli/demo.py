"""``cryptdisk demo``: ClickHouse's encrypted-vs-plain experiment on the embedded database.

Creates a database in a scratch directory, an encrypted and a plain table,
inserts N rows into each, runs ``avg(c_float)`` and ``sum(c_int)`` cold and
warm with all threads and with one, prints the timings side by side with the
overhead ratio, shows ``system.disks`` and the first bytes of each part on
disk (ciphertext against Parquet's ``PAR1``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from typing import Any

__all__ = ["register"]

DEFAULT_ROWS = 10_000_000
SAMPLE = "c4ca4238a0b923820dcc509a6f75849b"  # md5('1'), the c_str of row n = 1


def _hexdump(data: bytes, width: int = 16) -> str:
    lines = []
    for i in range(0, len(data), width):
        chunk = data[i : i + width]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"  {i:08x}  {chunk.hex(' '):<{width * 3}} |{text}|")
    return "\n".join(lines)


def _insert(db: Any, console: Any, rows: int) -> dict[str, float]:
    import time

    from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn

    from ..bench.olap_db import INSERT_SQL, TABLES

    took = {}
    columns = (*Progress.get_default_columns()[:2], MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        for strategy, table in TABLES.items():
            task = bar.add_task(f"INSERT {rows:,} rows into {table}", total=rows)
            t0 = time.perf_counter()
            db.insert_query(table, INSERT_SQL.format(rows=rows),
                            on_rows=lambda n, task=task: bar.advance(task, n))
            took[strategy] = time.perf_counter() - t0
    return took


def _queries(path: str, repeats: int) -> list[tuple[str, float, float]]:
    from ..bench.olap_db import QUERIES, TABLES, time_query
    from ..db import connect

    out = []
    for qname, template in QUERIES.items():
        cases: dict[str, dict[str, list[float]]] = {}
        for _round in range(repeats):  # interleaved: plain, encrypted, plain, ...
            for strategy, table in TABLES.items():
                sql = template.format(table=table)
                with connect(path, read_only=True) as db:
                    cases.setdefault("cold", {}).setdefault(strategy, []).append(
                        time_query(db, sql)[0])
                    for label, setting in (("warm", "RESET threads"),
                                           ("warm, 1 thread", "SET threads = 1")):
                        db.sql(setting)
                        cases.setdefault(label, {}).setdefault(strategy, []).append(
                            min(time_query(db, sql)[0] for _ in range(3)))
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
        console.print(f"[bold]{table}[/bold] ({len(data):,} bytes on disk, {kind}):",
                      soft_wrap=True)
        console.print(f"  {full}", soft_wrap=True, markup=False, highlight=False)
        console.print(_hexdump(data[:64]), markup=False, highlight=False)
        found = data.find(SAMPLE.encode()) >= 0
        console.print(f"  md5('1') = {SAMPLE}, a c_str value, appears in these bytes: "
                      f"{'[red]yes[/red]' if found else '[green]no[/green]'}", soft_wrap=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..bench.olap_db import create_tables
    from ..db import connect

    if args.files:
        from ._demo_files import run_file_demo

        rows = 200_000 if args.rows == DEFAULT_ROWS else args.rows
        return run_file_demo(rows, args.dir)
    console = Console()
    workdir = args.dir or tempfile.mkdtemp(prefix="cryptdisk-demo-")
    path = os.path.join(workdir, "demo.db")
    if os.path.exists(path):
        shutil.rmtree(path)
        if os.path.exists(path + ".key"):
            os.remove(path + ".key")
    console.print(f"[bold]cryptdisk demo[/bold]: ClickHouse's encrypted-vs-plain experiment on "
                  f"an embedded database in {path}")
    try:
        with connect(path) as db:
            console.print(f"key file (mode 0600, outside the database directory): {path}.key",
                          soft_wrap=True)
            create_tables(db)
            took = _insert(db, console, args.rows)
            console.print("\n[bold]system.disks[/bold]")
            from .db import format_table

            console.print(format_table(db.sql("SELECT * FROM system.disks")), markup=False)
            console.print("\n[bold]system.parts[/bold] and [bold]system.keys[/bold] "
                          "(ids and counts, never key material)")
            console.print(format_table(db.sql(
                'SELECT "table", rows, bytes, bytes_on_disk, disk, key_id, algorithm '
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
                      "columns it needs); warm = repeated (served from the decrypted cache in "
                      "memory). Timings on a shared machine are noisy; ratios are medians of "
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
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help=f"rows per table (default {DEFAULT_ROWS:,}, as in ClickHouse's test)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per query")
    p.add_argument("--dir", help="work here instead of a temporary directory (kept)")
    p.add_argument("--keep", action="store_true", help="keep the temporary database")
    p.add_argument("--files", action="store_true",
                   help="instead, tour the file format: encrypt a dataset, random reads, "
                   "tampering, key rotation (default 200,000 rows)")
    p.set_defaults(func=cmd_demo)
