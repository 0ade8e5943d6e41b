"""``cryptdisk bench {crypto,io,olap,oltp,all,fs-scan,olap-db,backup,olap-engine,server,
oltp-cpu,fields,names,dask}``:
what encryption at rest costs, and what the embedded database costs against its peers."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import CryptdiskError

__all__ = ["register"]

_CHOICES = ["crypto", "io", "olap", "oltp", "all", "fs-scan", "olap-db", "backup",
            "olap-engine", "server", "oltp-cpu", "fields", "names", "dask", "keys"]
_ORDER = ["crypto", "io", "olap", "oltp"]


class BenchUsageError(CryptdiskError):
    """Bad arguments to ``cryptdisk bench``."""


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512M, 4G)") from None


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value
    return parse


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark encryption at rest against plain storage and peers",
        description="Reproduce the published experiments (vioperf, pgbench, ClickHouse) "
        "for cryptdisk and its peers on this machine. Runs are interleaved (A B A B) and "
        "every figure reports its run count, median and min-max.")
    p.add_argument("experiment", choices=_CHOICES,
                   help="which experiment ('all' runs the first four; fs-scan and olap-db are "
                   "the parts of olap on cryptdisk:// and on the embedded database, alone; "
                   "backup: cryptdisk backup beside restic; olap-engine: the database's query "
                   "shapes against DuckDB's file and chdb; oltp-cpu: CPU per SQLite "
                   "transaction in one process, plain against cryptdisk; fields: field-level "
                   "protection; names: listing and opening small files with and without "
                   "encrypted names; dask: cryptdisk.dask against dd.read_parquet on "
                   "LocalClusters of 1..N worker processes; keys: keys in a SoftHSM2 "
                   "token against a key file)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: the whole suite in a few minutes")
    p.add_argument("--rows", type=_positive(int),
                   help="olap and backup rows; fields values per function and scan rows "
                   "(default 10M, quick 200k); names: files (default 10k, quick 2k); keys: "
                   "files below 100k (default 2k), table rows from 100k (default 10M)")
    p.add_argument("--duration", type=_positive(float),
                   help="seconds per timed test (io, oltp, oltp-cpu, random reads)")
    p.add_argument("--repeats", type=_positive(int), help="interleaved runs per strategy")
    p.add_argument("--threads", type=_positive(int),
                   help="threads (default: one per core); dask: the most worker processes "
                   "(default: cores + 1)")
    p.add_argument("--case", metavar="TEXT",
                   help="oltp: only the cases whose name contains TEXT (e.g. 'wal+full "
                   "clients=1'); with many --repeats, for a tighter paired ratio; "
                   "olap-engine: only the query shapes whose name contains TEXT (e.g. "
                   "'c_int'), or 'load' for the loads alone, --repeats times; olap-db: only "
                   "the queries whose name contains TEXT (e.g. 'avg'); fields: only its cases "
                   "containing TEXT (e.g. 'scan 1', 'fetch')")
    p.add_argument("--size", type=_size,
                   help="crypto: size of the streamed file for peak RSS (default 4G, quick 128M)")
    p.add_argument("--no-venv", dest="side_venvs", action="store_false",
                   help="olap: do not create the side venv (pip) for duckdb 1.5.5 + OpenSSL")
    p.add_argument("--workdir", type=Path,
                   help="scratch directory (default: the system temp dir); removed afterwards")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="write every run as JSON here (default with --report: DIR/results.json)")
    p.add_argument("--report", type=Path, metavar="DIR",
                   help="write a Markdown report, PNG plots and every run as JSON into DIR")
    p.add_argument("--note", help="a sentence put at the top of the report (e.g. machine state)")
    p.add_argument("--server", action="store_true",
                   help="oltp: the real pgbench against cryptdisk serve and PostgreSQL "
                   "(the same as 'cryptdisk bench server')")
    p.add_argument("--workers", metavar="N|auto",
                   help="server: cryptdisk serve's worker processes (default: serve's own "
                   "default, auto)")
    p.add_argument("--drop-page-cache", action="store_true",
                   help="olap-engine: before each query run, evict that engine's store files "
                   "from the OS page cache (posix_fadvise), so cold runs read from disk")
    p.set_defaults(func=_handle)


def _check_outputs(json_out: Path | None, report: Path | None) -> None:
    """Refuse, before any run, a --json or --report that could not be written once the
    runs are over (a --json that is a directory, a --report that is a file, a parent
    that is missing, not a directory or not writable)."""
    if report is not None and report.exists() and not report.is_dir():
        raise BenchUsageError(f"--report {report} is not a directory")
    if json_out is not None and json_out.is_dir():
        raise BenchUsageError(f"--json {json_out} is a directory; give a file name")
    report_dir = report.resolve() if report is not None else None
    for out in (json_out, report):
        if out is None:
            continue
        if report_dir is not None and out.resolve().parent == report_dir:
            continue  # made with the report
        if not out.parent.exists():
            raise BenchUsageError(f"{out.parent} does not exist (needed for {out})")
        if not out.parent.is_dir():
            raise BenchUsageError(f"{out.parent} is not a directory (needed for {out})")
        where = out if out.exists() else out.parent
        if not os.access(where, os.W_OK | (os.X_OK if where.is_dir() else 0)):
            raise BenchUsageError(f"{where} is not writable (needed for {out})")


def _handle(args: argparse.Namespace) -> int:
    from ..bench import BenchOptions, Cleanup, new_results, progress_bar, run_experiment

    if args.case is not None and args.experiment not in ("oltp", "server", "oltp-cpu",
                                                         "olap-engine", "olap-db",
                                                         "fields"):
        raise BenchUsageError("--case picks oltp cases (or server, oltp-cpu, olap-engine, "
                              "olap-db or fields cases); use it with 'cryptdisk bench oltp', "
                              "'server', 'oltp-cpu', 'olap-engine', 'olap-db' or 'fields'")
    if args.drop_page_cache and args.experiment != "olap-engine":
        raise BenchUsageError("--drop-page-cache goes with 'cryptdisk bench olap-engine'")
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise BenchUsageError(f"--workdir {args.workdir} is not a directory")
    _check_outputs(args.json, args.report)
    import importlib.util

    if importlib.util.find_spec("psutil") is None:
        raise BenchUsageError("cryptdisk bench needs psutil (process CPU and cleanup)",
                              hint="pip install 'cryptdisk[bench]'")
    if args.experiment in ("olap", "all", "olap-engine") and _missing("numpy"):
        raise BenchUsageError(f"cryptdisk bench {args.experiment} needs numpy (it generates "
                              "the olap experiment's table)",
                              hint="pip install 'cryptdisk[bench]'")
    if args.report is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise BenchUsageError("--report needs matplotlib for its plots",
                                  hint="pip install 'cryptdisk[bench]'")
    names = _ORDER if args.experiment == "all" else [args.experiment]
    if args.server:
        if args.experiment not in ("oltp", "server"):
            raise BenchUsageError("--server goes with 'cryptdisk bench oltp'")
        names = ["server"]
    command = "cryptdisk " + shlex.join(sys.argv[1:])
    t0 = time.perf_counter()
    with Cleanup(args.workdir) as cleanup:
        options = BenchOptions(cleanup.workdir, args.quick, args.rows, args.duration,
                               args.repeats, args.threads, args.size, args.side_venvs,
                               args.case, cleanup, args.workers,
                               drop_page_cache=args.drop_page_cache)
        results = new_results(command, options)
        with progress_bar() as progress:
            for name in names:
                run_experiment(name, options, results, progress)
    results.elapsed_s = round(time.perf_counter() - t0, 1)
    _print_summary(results)
    if args.json is None and args.report is not None:
        args.json = args.report / "results.json"  # every run, for ratios the report rounds
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)  # the report dir, made here
        args.json.write_text(json.dumps(results.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.report is not None:
        from ..bench import write_report

        path = write_report(results, args.report, note=args.note, runs=args.json)
        print(f"wrote {path}", file=sys.stderr)
    if results.failures:
        failed = ", ".join(f"{f.experiment}/{f.strategy}" for f in results.failures)
        where = ("their tracebacks are in the report and the JSON" if args.report or args.json
                 else "rerun with --report DIR to keep their tracebacks")
        raise CryptdiskError(f"{len(results.failures)} benchmark run(s) failed: {failed}; "
                             "the results above are incomplete", hint=where)
    return 0


def _missing(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # blocked, or a broken installation
        return True


def _print_summary(results: Any) -> None:
    from ..bench import summary_lines

    out = sys.stdout
    for line in summary_lines(results):
        out.write(line + os.linesep)
