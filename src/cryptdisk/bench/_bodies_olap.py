"""Worker bodies of the olap experiment: one engine per call, in a fresh process.

``insert`` loads the shared Parquet file into a fresh store (timed) and
``query`` opens that store in a new process: the first execution of the
query is *cold* (fresh process and session; the OS page cache may still hold
the files), the next ``warm`` executions are *warm*; then the same query with
one thread (warm). Engines: ``chdb`` (ClickHouse, plain or encrypted disk),
``duckdb`` (its own database file, plain or ``ENCRYPTION_KEY``),
``parquet`` (pyarrow, plain or modular encryption AES_GCM_V1) and, for the
insert only, ``cryptdisk`` (cryptdisk's own database, plain or encrypted policy).
"""

from __future__ import annotations

import base64
import os
import statistics
from typing import Any

from ._measure import Sample, Stopwatch

__all__ = ["check_result", "insert", "prepare", "query"]

QUERIES = {"avg": ("avg(c_float)", "c_float", "mean"), "sum": ("sum(c_int)", "c_int", "sum")}


def prepare(path: str, rows: int, with_answers: bool = True) -> list[Sample]:
    """Generate the data set and (``with_answers``) the right answers of ``avg`` and ``sum``
    (in a worker, so the harness stays small)."""
    from pathlib import Path

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ._olap_data import generate

    generate(Path(path), rows)
    if not with_answers:  # (reading c_int and c_float back takes 16 bytes a row of memory)
        return [Sample("prepare", "rows", rows)]
    t = pq.read_table(path, columns=["c_int", "c_float"])
    # sum compared modulo 2**64: ClickHouse and pyarrow wrap, DuckDB widens
    answers = {"avg": pc.mean(t.column("c_float")).as_py(),
               "sum": pc.sum(t.column("c_int")).as_py()}
    return [Sample("prepare", "rows", rows, extra=answers)]


def _lit(text: str) -> str:
    """A SQL string literal (paths and keys are ours, but may contain quotes)."""
    return "'" + text.replace("'", "''") + "'"


def _chdb(store: str, config: str | None) -> Any:
    from chdb import session

    path = f"{store}/db" + (f"?config-file={config}" if config else "")
    return session.Session(path)  # type: ignore[no-untyped-call]


def _duckdb(store: str, key: str | None, openssl: bool = False) -> Any:
    import duckdb

    con = duckdb.connect()
    if openssl:  # the official signed httpfs extension from PyPI brings OpenSSL
        import glob

        import duckdb_extension_httpfs as ext

        where = os.path.join(os.path.dirname(ext.__file__), "extensions", "*",
                             "httpfs.duckdb_extension")
        con.execute(f"LOAD {_lit(sorted(glob.glob(where))[-1])}")
    elif key:
        # duckdb from PyPI has no OpenSSL here: writes need the Mbed TLS fallback.
        con.execute("SET force_mbedtls_unsafe = true")
    db = _lit(store + "/db.duckdb")
    if key:
        con.execute(f"ATTACH {db} AS x (ENCRYPTION_KEY {_lit(key)})")
    else:
        con.execute(f"ATTACH {db} AS x")
    return con


def _parquet_props(key: str | None, write: bool) -> Any:
    if not key:
        return None
    import pyarrow.parquet.encryption as pe
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    master = bytes.fromhex(key)

    class KeyWrap(pe.KmsClient):  # type: ignore[misc]  # the in-memory KMS of pyarrow's docs, with real wrapping
        def wrap_key(self, key_bytes: bytes, master_key_identifier: str) -> bytes:
            nonce = os.urandom(12)
            return base64.b64encode(nonce + AESGCM(master).encrypt(nonce, key_bytes, None))

        def unwrap_key(self, wrapped_key: bytes, master_key_identifier: str) -> bytes:
            raw = base64.b64decode(wrapped_key)
            return AESGCM(master).decrypt(raw[:12], raw[12:], None)

    factory = pe.CryptoFactory(lambda _config: KeyWrap())
    kms = pe.KmsConnectionConfig()
    if write:
        cfg = pe.EncryptionConfiguration(
            footer_key="footer", column_keys={"cols": ["c_int", "c_str", "c_float"]},
            encryption_algorithm="AES_GCM_V1", data_key_length_bits=256)
        return factory.file_encryption_properties(kms, cfg)
    return factory.file_decryption_properties(kms, pe.DecryptionConfiguration())


def _insert_chdb(store: str, data: str, config: str | None) -> tuple[Stopwatch, int]:
    s = _chdb(store, config)
    policy = " SETTINGS storage_policy = 'encrypted'" if config else ""
    s.query("CREATE TABLE t (c_int Int64, c_str String, c_float Float64) "
            f"ENGINE = MergeTree ORDER BY c_int{policy}")
    with Stopwatch() as sw:
        s.query(f"INSERT INTO t SELECT * FROM file({_lit(data)}, Parquet)")  # noqa: S608
    s.query("OPTIMIZE TABLE t FINAL")  # one part, as in the reference runs (untimed)
    count = int(s.query("SELECT count() FROM t", "CSV").bytes().decode())
    s.close()
    return sw, count


def _insert_duckdb(store: str, data: str, secret: str | None,
                   openssl: bool) -> tuple[Stopwatch, int]:
    con = _duckdb(store, secret, openssl)
    with Stopwatch() as sw:
        con.execute(f"CREATE TABLE x.t AS SELECT * FROM read_parquet({_lit(data)})")  # noqa: S608
        con.execute("CHECKPOINT x")
    count = int(con.execute("SELECT count(*) FROM x.t").fetchone()[0])
    con.close()
    return sw, count


def _insert_parquet(store: str, data: str, secret: str | None) -> tuple[Stopwatch, int]:
    import pyarrow.parquet as pq

    table = pq.read_table(data)
    out = f"{store}/t.parquet"
    with Stopwatch() as sw:  # key generation and wrapping timed, as before
        pq.write_table(table, out, encryption_properties=_parquet_props(secret, True))
    return sw, int(pq.ParquetFile(out, decryption_properties=_parquet_props(secret, False)
                                  ).metadata.num_rows)


def _insert_cryptdisk(store: str, data: str, policy: str,
                      order_by: bool) -> tuple[Stopwatch, int]:
    """cryptdisk's database (no config: the ``default`` policy encrypts, ``plain`` does not).

    The timed part is ``Database.insert(table, parquet_path)``, the Python API's
    Parquet-file insert (DuckDB ``read_parquet`` streamed in batches into sealed parts,
    catalog published): what a user loading a Parquet file calls.
    """
    from ..db import connect

    order = " ORDER BY c_int" if order_by else ""
    with connect(f"{store}/db") as db:
        db.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE){order} "
               f"SETTINGS storage_policy = {_lit(policy)}")
        with Stopwatch() as sw:
            inserted = db.insert("t", data)
        count = int(db.query("SELECT count(*) FROM t")[0][0])
    if inserted != count:
        raise AssertionError(f"insert() reported {inserted} rows but the table has {count}")
    return sw, count


def insert(engine: str, store: str, data: str, secret: str | None, config: str | None,
           case: str, rows: int) -> list[Sample]:
    """Load ``data`` (Parquet) into a fresh store; the timed part is the load.

    For ``cryptdisk`` / ``cryptdisk-ordered`` engines ``config`` is the storage policy.
    The row count of the loaded table must equal ``rows``.
    """
    os.makedirs(store, exist_ok=True)
    if engine == "chdb":
        sw, count = _insert_chdb(store, data, config)
    elif engine.startswith("duckdb"):
        sw, count = _insert_duckdb(store, data, secret, engine == "duckdb-openssl")
    elif engine.startswith("cryptdisk"):
        sw, count = _insert_cryptdisk(store, data, config or "default",
                                      engine == "cryptdisk-ordered")
    else:
        sw, count = _insert_parquet(store, data, secret)
    if count != rows:
        raise AssertionError(f"{engine} loaded {count} rows, expected {rows}")
    return [sw.seconds(case, rows * 48, rows_loaded=count)]  # ~48 bytes a row (8 + 32 + 8)


def _runner(engine: str, store: str, secret: str | None, config: str | None) -> Any:
    """``(run(query_key, threads) -> value, close)`` for one open store."""
    if engine == "chdb":
        s = _chdb(store, config)

        def run_chdb(q: str, threads: int | None) -> Any:
            opt = f" SETTINGS max_threads = {threads}" if threads else ""
            return s.query(f"SELECT {QUERIES[q][0]} FROM t{opt}", "CSV").bytes()  # noqa: S608
        return run_chdb, s.close
    if engine.startswith("duckdb"):
        con = _duckdb(store, secret, engine == "duckdb-openssl")
        default = con.execute("SELECT current_setting('threads')").fetchone()[0]

        def run_duckdb(q: str, threads: int | None) -> Any:
            con.execute(f"SET threads = {threads or default}")
            return con.execute(f"SELECT {QUERIES[q][0]} FROM x.t").fetchone()  # noqa: S608
        return run_duckdb, con.close
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset
    import pyarrow.parquet as pq

    props = _parquet_props(secret, False)
    cores = pa.cpu_count()

    def run_parquet(q: str, threads: int | None) -> Any:
        pa.set_cpu_count(threads or cores)
        col = QUERIES[q][1]
        t = pq.read_table(f"{store}/t.parquet", columns=[col], decryption_properties=props,
                          use_threads=threads != 1)
        return getattr(pc, QUERIES[q][2])(t.column(col)).as_py()
    return run_parquet, lambda: None


def _scalar(result: Any) -> float | int:
    if isinstance(result, bytes):  # chdb CSV
        text = result.decode().strip()
        return float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(result, tuple):
        result = result[0]
    return float(result) if isinstance(result, float) else int(result)


def check_result(q: str, got: Any, expected: float | int) -> None:
    """The answer must match the one pyarrow computed from the source file."""
    value = _scalar(got)
    if q == "sum":  # engines differ in overflow: Int64 wraps, DuckDB widens to HUGEINT
        ok = int(value) % 2**64 == int(expected) % 2**64
    else:
        ok = abs(float(value) - float(expected)) <= 1e-9 * max(1.0, abs(float(expected)))
    if not ok:
        raise AssertionError(f"{QUERIES[q][0]} returned {value}, expected {expected}")


def query(engine: str, store: str, q: str, secret: str | None, config: str | None,
          warm: int, rows: int, expected: float | int) -> list[Sample]:
    """Cold, then ``warm`` warm runs with all threads, then ``warm`` with one thread.

    Every answer is checked against ``expected``.
    """
    run, close = _runner(engine, store, secret, config)
    name = QUERIES[q][0]
    out = []
    try:
        with Stopwatch() as sw:
            got = run(q, None)
        check_result(q, got, expected)
        out.append(sw.seconds(f"{name} threads=all cold", rows * 8))
        for threads, label in ((None, "all"), (1, "1")):
            walls, cpus = [], []
            for _ in range(warm):
                with Stopwatch() as sw:
                    got = run(q, threads)
                check_result(q, got, expected)
                walls.append(sw.wall)
                cpus.append(sw.cpu)
            out.append(Sample(f"{name} threads={label} warm", "s", statistics.median(walls),
                              statistics.median(cpus), rows * 8, "bytes", "lower",
                              {"warm_runs": warm}))
    finally:
        close()
    return out
