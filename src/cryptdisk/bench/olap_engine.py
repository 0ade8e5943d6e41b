"""The analytical engine's query shapes on cryptdisk, DuckDB's own file and chdb.

``python -m cryptdisk.bench.olap_engine --rows 10000000 --workdir DIR``: the
Parquet data set of ``cryptdisk bench olap`` (c_int = a 64-bit hash, c_str =
md5, c_float) is loaded into a cryptdisk database (an encrypted and a plain
table, both ``ORDER BY c_int``), a DuckDB database file and chdb (plain
MergeTree and an AES_256_CTR encrypted disk, ``ORDER BY c_int``). Each query
shape then runs in a fresh process per engine: the first run is *cold* (just
after opening the store; the OS page cache may hold the files), then the
median of ``--repeats`` *warm* runs; the child's peak RSS (VmHWM) is reported.
Engines are interleaved per shape, so a noisy machine disturbs them alike:
compare ratios within one run. Stores already in ``--workdir`` are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "main"]

_M64 = 2**64


def _key(n: int) -> int:
    import numpy as np

    from cryptdisk.bench._olap_data import splitmix64

    return int(splitmix64(np.array([n], dtype=np.uint64)).view(np.int64)[0])


def shapes() -> dict[str, str]:
    """Query shape -> SQL over table ``{t}``."""
    point = _key(12345)
    lo = point
    hi = lo + _M64 // 1000
    return {
        "avg": "SELECT avg(c_float) FROM {t}",
        "sum": "SELECT sum(c_int) FROM {t}",
        "point": f"SELECT c_int, c_str, c_float FROM {{t}} WHERE c_int = {point}",  # noqa: S608
        "range": f"SELECT count(*), sum(c_float) FROM {{t}} WHERE c_int BETWEEN {lo} AND {hi}",  # noqa: S608
        "group": "SELECT substr(c_str, 1, 2) AS p, count(*) AS n FROM {t} GROUP BY p "
                 "ORDER BY p",
        "top10": "SELECT c_int, c_str, c_float FROM {t} ORDER BY c_float DESC LIMIT 10",
        "distinct": "SELECT count(DISTINCT c_str) FROM {t}",
        "limit": "SELECT c_int, c_str, c_float FROM {t} LIMIT 10",
    }


SHAPES = list(shapes())
ENGINES = ["cryptdisk encrypted", "cryptdisk plain", "duckdb file", "chdb plain",
           "chdb AES_256_CTR"]

_CHDB_XML = """<clickhouse><storage_configuration><disks>
<raw><type>local</type><path>{raw}/</path></raw>
<enc><type>encrypted</type><disk>raw</disk><path>enc/</path><algorithm>AES_256_CTR</algorithm>
<key_hex id="0">{key}</key_hex><current_key_id>0</current_key_id></enc>
</disks><policies><encrypted><volumes><v><disk>enc</disk></v></volumes></encrypted></policies>
</storage_configuration></clickhouse>
"""


def _chdb_session(work: Path, encrypted: bool) -> Any:
    from chdb import session

    name = "chdb-enc" if encrypted else "chdb"
    path = f"{work / name}/db"
    if encrypted:
        path += f"?config-file={work / name / 'config.xml'}"
    return session.Session(path)  # type: ignore[no-untyped-call]


def load(work: Path, rows: int, engines: list[str]) -> dict[str, float]:
    """Generate the data and load ``engines`` where not loaded yet; returns load seconds."""
    from cryptdisk.bench._olap_data import generate

    data = work / "data.parquet"
    if not data.exists():
        generate(data, rows)
    out = {}
    import cryptdisk

    if any(e.startswith("cryptdisk") for e in engines) and not (work / "cd").exists():
        db = cryptdisk.connect(str(work / "cd"))
        for table, policy in (("t_enc", "default"), ("t_plain", "plain")):
            db.sql(f"CREATE TABLE {table} (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) "
                   f"ORDER BY c_int SETTINGS storage_policy = '{policy}'")
            t0 = time.perf_counter()
            db.insert(table, str(data))
            out["cryptdisk " + ("encrypted" if policy == "default" else "plain")] = \
                time.perf_counter() - t0
        db.close()
    import duckdb

    if "duckdb file" in engines and not (work / "duck.db").exists():
        con = duckdb.connect(str(work / "duck.db"))
        t0 = time.perf_counter()
        con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet('{data}') ORDER BY c_int")  # noqa: S608
        out["duckdb file"] = time.perf_counter() - t0
        con.close()
    for encrypted in (False, True):
        name = "chdb-enc" if encrypted else "chdb"
        if ("chdb AES_256_CTR" if encrypted else "chdb plain") not in engines \
                or (work / name).exists():
            continue
        (work / name / "raw").mkdir(parents=True, exist_ok=True)
        if encrypted:
            (work / name / "config.xml").write_text(_CHDB_XML.format(
                raw=work / name / "raw", key=os.urandom(32).hex()))
        s = _chdb_session(work, encrypted)
        policy = " SETTINGS storage_policy = 'encrypted'" if encrypted else ""
        s.query("CREATE TABLE t (c_int Int64, c_str String, c_float Float64) "
                f"ENGINE = MergeTree ORDER BY c_int{policy}")
        t0 = time.perf_counter()
        s.query(f"INSERT INTO t SELECT * FROM file('{data}', Parquet)")  # noqa: S608
        out["chdb plain" if not encrypted else "chdb AES_256_CTR"] = time.perf_counter() - t0
        s.query("OPTIMIZE TABLE t FINAL")
        s.close()
    return out


def _vmhwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(work: Path, engine: str, shape: str, repeats: int) -> dict[str, Any]:
    """Open the store, run the shape cold then ``repeats`` times warm (in this process)."""
    sql = shapes()[shape]
    if engine.startswith("cryptdisk"):
        import cryptdisk

        db = cryptdisk.connect(str(work / "cd"), read_only=True)
        table = "t_enc" if engine.endswith("encrypted") else "t_plain"

        def run() -> Any:
            return db.query(sql.format(t=table))
    elif engine == "duckdb file":
        import duckdb

        con = duckdb.connect(str(work / "duck.db"), read_only=True)

        def run() -> Any:
            return con.execute(sql.format(t="t")).fetchall()
    else:
        s = _chdb_session(work, engine != "chdb plain")
        chsql = sql.replace("count(DISTINCT c_str)", "uniqExact(c_str)")

        def run() -> Any:
            return s.query(chsql.format(t="t"), "CSV").bytes()
    t0 = time.perf_counter()
    first = run()
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        warm.append(time.perf_counter() - t0)
    return {"cold": cold, "warm": statistics.median(warm), "rss_mb": _vmhwm_mb(),
            "answer": repr(first)[:200]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cryptdisk.bench.olap_engine")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--baseline", nargs=2, metavar=("SRC", "WORKDIR"),
                        help="also run cryptdisk from source tree SRC (another version) on "
                        "the stores loaded in WORKDIR, as engines 'base: cryptdisk ...'")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    if args.child:
        print(json.dumps(child(work, args.child[0], args.child[1], args.repeats)))
        return 0
    engines = args.engines.split(",")
    runs = [(e, work, None) for e in engines]
    if args.baseline:
        src, base = args.baseline
        runs = [r for e in engines for r in
                ([(e, work, None)] + ([("base: " + e, Path(base), src)]
                                      if e.startswith("cryptdisk") else []))]
    work.mkdir(parents=True, exist_ok=True)
    for e, s in load(work, args.rows, engines).items():
        print(f"load {e}: {s:.2f} s", flush=True)
    print(f"{'shape':9} {'engine':26} {'cold ms':>9} {'warm ms':>9} {'RSS MB':>7}  answer")
    for shape in args.shapes.split(","):
        for engine, where, src in runs:
            env = dict(os.environ)
            if src:
                env["PYTHONPATH"] = src
            proc = subprocess.run(
                [sys.executable, "-m", "cryptdisk.bench.olap_engine", "--workdir", str(where),
                 "--repeats", str(args.repeats), "--child", engine.removeprefix("base: "),
                 shape], capture_output=True, text=True, check=False, env=env)
            if proc.returncode:
                print(f"{shape:9} {engine:26} failed: {proc.stderr.strip()[-300:]}", flush=True)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{shape:9} {engine:26} {r['cold'] * 1e3:9.1f} {r['warm'] * 1e3:9.2f} "
                  f"{r['rss_mb']:7.0f}  {r['answer'][:60]}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
