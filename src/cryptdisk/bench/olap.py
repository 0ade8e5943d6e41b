"""The olap experiment: ClickHouse's encrypted-vs-plain table test, against the peers.

The data (see :mod:`cryptdisk.bench._olap_data`) is generated once as Parquet
and every engine loads that file (timed insert), then answers ``avg(c_float)``
and ``sum(c_int)``: cold (first query in a fresh process), warm (median of
repeats), all threads and one thread. Strategies: chdb with a plain disk and
with encrypted disks (AES_128_CTR, AES_256_CTR, via a storage_configuration
passed as ``config-file=``), DuckDB's database plain and with ENCRYPTION_KEY,
and Parquet written and read by pyarrow, plain and with modular encryption.
For a like-for-like insert, cryptdisk's database loads the same Parquet file
(``Database.insert``) on its plain and its encrypted policy, without and with
ClickHouse's sort key (``ORDER BY c_int``), in the same interleaved rounds as
chdb; the notes give the paired cryptdisk/chdb ratios. cryptdisk's scans
(``fs_scan``, ``olap_db``) are separate modules.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from ._model import BenchOptions, Measurement, Progress, Recorder, Skipped
from ._stats import paired_ratio
from ._suite import INSTALL_BENCH, Strategy, ensure_cleanup, interleave
from ._venv import DUCKDB_OPENSSL, VenvError, cache_dir, ensure_venv
from ._worker import run_worker

__all__ = ["NOTES", "run"]

NOTES: list[str] = []
_B = "cryptdisk.bench._bodies_olap:"

_CHDB_XML = """<clickhouse><storage_configuration><disks>
<raw><type>local</type><path>{raw}/</path></raw>
<enc><type>encrypted</type><disk>raw</disk><path>enc/</path><algorithm>{alg}</algorithm>
<key_hex id="0">{key}</key_hex><current_key_id>0</current_key_id></enc>
</disks><policies><encrypted><volumes><v><disk>enc</disk></v></volumes></encrypted></policies>
</storage_configuration></clickhouse>
"""


def _chdb_config(base: Path, alg: str) -> str:
    raw = base / "rawdisk"
    raw.mkdir(parents=True)
    key = os.urandom(16 if alg == "AES_128_CTR" else 32).hex()
    path = base / "config.xml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_CHDB_XML.format(raw=raw, alg=alg, key=key))
    return str(path)


Engine = tuple[str, str, str | None, str | None, str | None]

#: cryptdisk's database, insert only (the config slot holds the storage policy).
CRYPTDISK_ENGINES: list[Engine] = [
    ("cryptdisk plain", "cryptdisk", None, "plain", None),
    ("cryptdisk encrypted", "cryptdisk", None, "default", None),
    ("cryptdisk plain ORDER BY c_int", "cryptdisk-ordered", None, "plain", None),
    ("cryptdisk encrypted ORDER BY c_int", "cryptdisk-ordered", None, "default", None),
]
#: (cryptdisk strategy, chdb strategy) pairs whose insert ratio the notes report.
VS_CHDB = [("cryptdisk plain", "chdb plain"),
           ("cryptdisk plain ORDER BY c_int", "chdb plain"),
           ("cryptdisk encrypted", "chdb AES_128_CTR"),
           ("cryptdisk encrypted", "chdb AES_256_CTR"),
           ("cryptdisk encrypted ORDER BY c_int", "chdb AES_128_CTR"),
           ("cryptdisk encrypted ORDER BY c_int", "chdb AES_256_CTR")]


def _duckdb_openssl(record: Recorder, progress: Progress) -> list[Engine]:
    """DuckDB 1.5.5 + httpfs (OpenSSL) from a side venv, plain and encrypted."""
    name, reqs = DUCKDB_OPENSSL
    progress("olap: preparing the duckdb 1.5.5 venv", 0, 1)
    try:
        python = ensure_venv(name, reqs)
    except VenvError as exc:
        record(Skipped("olap", "duckdb-1.5.5 encrypted (OpenSSL)", str(exc),
                       f"python -m venv --system-site-packages {cache_dir() / name} && "
                       f"{cache_dir() / name}/bin/pip install {' '.join(reqs)}"))
        return []
    finally:
        progress("olap: preparing the duckdb 1.5.5 venv", 1, 1)
    return [("duckdb-1.5.5 plain", "duckdb-openssl", None, None, python),
            ("duckdb-1.5.5 encrypted (OpenSSL)", "duckdb-openssl", os.urandom(16).hex(), None,
             python)]


def _engines(base: Path, record: Recorder, progress: Progress, side_venvs: bool) -> list[Engine]:
    """``(strategy, engine, secret, chdb config, python)`` for every engine available here."""
    out: list[Engine] = []
    if importlib.util.find_spec("chdb") is None:
        record(Skipped("olap", "chdb", "the chdb package is not installed", INSTALL_BENCH))
    else:
        out.append(("chdb plain", "chdb", None, None, None))
        for alg in ("AES_128_CTR", "AES_256_CTR"):
            out.append((f"chdb {alg}", "chdb", None, _chdb_config(base / f"chdb-{alg}", alg),
                        None))
    out += CRYPTDISK_ENGINES
    out += [("duckdb plain", "duckdb", None, None, None),
            ("duckdb encrypted (Mbed TLS)", "duckdb", os.urandom(16).hex(), None, None)]
    if side_venvs:
        out += _duckdb_openssl(record, progress)
    else:
        record(Skipped("olap", "duckdb-1.5.5 encrypted (OpenSSL)",
                       "side venvs disabled (--no-venv)", "run without --no-venv"))
    out += [("parquet plain", "parquet", None, None, None),
            ("parquet encrypted (AES_GCM_V1)", "parquet", os.urandom(32).hex(), None, None)]
    return out


def _encrypted_at_rest(base: Path, stores: dict[str, Path]) -> list[str]:
    """Check that the encrypted peers really wrote ciphertext (configuration sanity)."""
    notes = []
    for name, store in stores.items():
        if name.startswith("chdb AES"):
            alg = name.split()[1]
            files = [p for p in (base / f"chdb-{alg}" / "rawdisk" / "enc").rglob("*.bin")]
            ok = bool(files) and all(p.read_bytes()[:3] == b"ENC" for p in files)
            notes.append(f"{name}: {len(files)} data files on the encrypted disk, "
                         f"{'all' if ok else 'NOT all'} start with ClickHouse's ENC header.")
        elif name.startswith("cryptdisk"):
            notes.append(_cryptdisk_at_rest(name, store))
        elif name.startswith("parquet encrypted"):
            tail = (store / "t.parquet").read_bytes()[-4:]
            notes.append(f"{name}: file ends with {tail!r} (PARE = encrypted footer).")
    return notes


def _cryptdisk_at_rest(name: str, store: Path) -> str:
    """Where cryptdisk's parts are and what their first bytes are (sealed vs Parquet)."""
    encrypted = "encrypted" in name
    files = [p for p in (store / "db" / ("data" if encrypted else "plain")).rglob("*")
             if p.is_file()]
    magic = b"CRYPTDSK" if encrypted else b"PAR1"
    heads = [p.read_bytes()[:8] for p in files]
    ok = bool(files) and all(h.startswith(magic) for h in heads)
    parquet = sum(h.startswith(b"PAR1") for h in heads)
    return (f"{name}: {len(files)} part files on its disk, {'all' if ok else 'NOT all'} start "
            f"with {magic.decode()}; {parquet} readable as Parquet.")


def _vs_chdb(measurements: list[Measurement]) -> list[str]:
    """Paired insert ratios cryptdisk/chdb (same interleaved rounds), one note line."""
    inserts = {m.strategy: m for m in measurements if m.case.startswith("insert ")}
    parts = []
    for ours, theirs in VS_CHDB:
        a, b = inserts.get(ours), inserts.get(theirs)
        if a is None or b is None:
            continue
        wall = paired_ratio(a.values, b.values)
        cpu = paired_ratio(a.cpu_s, b.cpu_s) if a.cpu_s and b.cpu_s else None
        parts.append(f"{ours} / {theirs} {wall.median:.2f} ({wall.low:.2f}-{wall.high:.2f})"
                     + (f", CPU {cpu.median:.2f}" if cpu else ""))
    if not parts:
        return []
    return ["Insert, cryptdisk vs chdb (the same Parquet file, paired per round, wall time; "
            ">1 = cryptdisk slower): " + "; ".join(parts) + "."]


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _notes(rows: int, warm: int, data: str) -> list[str]:
    """How the peers were configured, for the report."""
    return [
        f"{rows:,} rows, generated once as Parquet ({os.path.getsize(data) / 1e6:.0f} MB) and "
        "loaded by every engine. c_int = SplitMix64(n) as Int64, c_str = md5 hex of n, "
        "c_float = n / SplitMix64(n) * 1e7 (ClickHouse's run used cityHash64).",
        "Every query answer was checked against pyarrow's on the source file "
        "(sum modulo 2^64, avg to 1e-9).",
        "Insert: chdb INSERT ... SELECT FROM file(Parquet) into a MergeTree ORDER BY c_int "
        "(then OPTIMIZE FINAL, untimed); cryptdisk Database.insert(table, parquet_path) into "
        "a table on the plain or the (encrypted) default policy of a database opened with "
        "no config, without and with ORDER BY c_int (a full sort; ClickHouse sorts each "
        "insert block); DuckDB CREATE TABLE AS + CHECKPOINT; pyarrow write_table. Every "
        "loaded table's row count is checked. The last insert of each strategy is the store "
        "the queries read; cryptdisk's scans are in the olap-db section.",
        f"Cold = first query in a fresh process (the OS page cache may hold the files); warm = "
        f"median of {warm} repeats in that process. threads=1: chdb max_threads=1, DuckDB "
        "SET threads=1, pyarrow use_threads=False.",
        "chdb encrypted disks: a storage_configuration (local disk + encrypted disk, key_hex "
        "with id 0, current_key_id 0) as the ClickHouse docs show, passed with config-file=.",
        "DuckDB: the suite's duckdb (version in the environment) has no OpenSSL module here, "
        "so 'duckdb encrypted (Mbed TLS)' runs on its Mbed TLS fallback (SET "
        "force_mbedtls_unsafe = true), the slow path. 'duckdb-1.5.5 ...' runs duckdb 1.5.5 "
        "with the official httpfs extension from PyPI (duckdb-extension-httpfs, loaded with "
        f"LOAD '<path>'), i.e. OpenSSL, in a venv under {cache_dir()} created on demand; "
        "it is compared with duckdb-1.5.5 plain from the same venv.",
        "Parquet modular encryption: AES_GCM_V1, every column, footer encrypted, 256-bit data "
        "keys wrapped by an in-memory KMS client (AES-GCM) as in pyarrow's documentation.",
    ]


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Run the olap experiment (see the module docstring)."""
    ensure_cleanup(options)
    NOTES.clear()
    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(2, 3, options.repeats)
    warm = options.pick(3, 5)
    base = Path(options.workdir) / "olap"
    base.mkdir()
    progress("olap: generating data", 0, 1)
    data = str(base / "data.parquet")
    prepared = run_worker(options.cleanup, _B + "prepare", dict(path=data, rows=rows))
    expected = prepared.samples[0].extra
    progress("olap: generating data", 1, 1)
    engines = _engines(base, record, progress, options.side_venvs)
    inserts, queries = [], []
    stores: dict[str, Path] = {}
    for name, engine, secret, config, python in engines:
        store = stores[name] = base / ("store-" + "".join(c if c.isalnum() else "_"
                                                          for c in name))
        family = (name.replace("encrypted", "plain") if engine.startswith("cryptdisk")
                  else name.split(" ")[0] + " plain")
        inserts.append(Strategy(name, _B + "insert",
                                dict(engine=engine, store=str(store), data=data, secret=secret,
                                     config=config, case=f"insert {rows:,} rows", rows=rows),
                                None, family, lambda s=store: _fresh(s),  # type: ignore[misc]
                                python))
        for q in ("avg", "sum") if engine not in ("cryptdisk", "cryptdisk-ordered") else ():
            queries.append(Strategy(name, _B + "query",
                                    dict(engine=engine, store=str(store), q=q, secret=secret,
                                         config=config, warm=warm, rows=rows,
                                         expected=expected[q]), None, family,
                                    None, python))
    measured: list[Measurement] = []

    def keep(item: Measurement | Skipped) -> None:
        if isinstance(item, Measurement):
            measured.append(item)
        record(item)

    interleave(options, "olap", inserts, keep, progress, "olap: insert", repeats)
    interleave(options, "olap", queries, record, progress, "olap: queries", repeats)
    NOTES.extend(_vs_chdb(measured))
    NOTES.extend(_encrypted_at_rest(base, stores))
    NOTES.extend(_notes(rows, warm, data))
