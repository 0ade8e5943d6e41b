"""The fields experiment (``cryptdisk bench fields``): what field-level protection costs.

Issue 18's benchmark, each run in a fresh worker process, strategies interleaved:

- **Throughput per core** of each function of :mod:`cryptdisk.fields` (Python API,
  one thread) on ``--rows`` values (default 10M, quick 200k): 16-digit card numbers,
  32-character strings, 64-bit ids (an ``int64`` column, cast to text inside), and
  1 MiB values for AES-GCM in MB/s (64 of them, quick 16). The values are one
  generated batch of up to 2**20 distinct values, passed in slices of 65,536 until
  ``--rows`` are done (so the input is not regenerated per run).
- **Query overhead**: ``SELECT sum(length(...))`` over a table of the embedded
  database (at-rest encrypted) holding 4 clear and 4 protected (``encrypt``, AES-GCM,
  base64 text) columns of the same 16-character values, decrypting 1, 2 and 4 columns
  (strategy ``decrypt``: the scan computes them, see docs/fields-scan.md) against the
  same scan of the clear columns (``clear``), the same decryption of ``BLOB`` copies of
  the protected columns holding the ciphertexts' bytes (``decrypt-blob``: no base64 to
  store, read and decode), and as DuckDB UDFs (``decrypt-udf``,
  ``push_field_functions = False``). Each case is measured twice per run, on a fresh
  connection: ``first run`` (nothing in the database's cache, so row groups are decoded
  and functions computed) and ``repeated`` (the median of 3 runs after a second one,
  answered from the cache), each against the clear scan in the same state.
- **Masking overhead**: the same scan through ``mask_last4`` of a clear column
  (``mask``) against the clear scan: what a masking policy whose body is
  ``mask_last4(v)`` makes a subject's query read (``cryptdisk serve`` rewrites the
  query so; that rewrite, a parse per query, is not in the figure).
- **A masking policy**: the clear query run by an embedded connection with
  ``role="analyst"`` (``policy``), column ``c0`` having the masking policy
  ``CASE WHEN current_role() IN ('auditor') THEN v ELSE mask_last4(v) END``: the
  per-query rewrite, the folded ``CASE`` and the mask, against the clear scan. Only
  ``c0`` has the policy, so in the 2- and 4-column cases one column of several is masked.
- **Fetching rows**: the scan shape that returns them to the caller (``SELECT c0 FROM
  t``, and ``SELECT c0, c1, c2, c3`` with ``c0`` decrypted or masked) as the Arrow table
  ``Database.sql`` gives, against the same clear columns. The sum scans do almost
  nothing per value (DuckDB sums string lengths it keeps), so any per-value function
  dominates them; a query whose rows leave the database pays for building them.

``--case TEXT`` runs only the cases whose name contains TEXT (``scan 1``, ``fetch``,
``AES-GCM``...); each scan case needs the table, made once per run.

Targets (issue 18): FF1 >= 1M 16-digit values/s/core, AES-SIV >= 3M short values/s/core,
AES-GCM >= 1 GB/s/core on long values, one decrypted column < 1.5x the clear scan, a
mask <= 5% on a scan. The notes say which are met.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from ._measure import Sample, Stopwatch
from ._model import BenchOptions, Measurement, Progress, Recorder
from ._stats import paired_ratio
from ._suite import Strategy, experiment_dir, interleave, keep_measurements
from ._worker import run_worker

__all__ = ["NOTES", "run", "scan", "scan_prepare", "throughput"]

EXPERIMENT = "fields"
NOTES: list[str] = []
_B = "cryptdisk.bench.fields:"
_BATCH = 65_536
_MIB = 1 << 20

#: case -> (function, data, unit, target in that unit or None)
CASES: dict[str, tuple[str, str, str, float | None]] = {
    "fpe_encrypt FF1, 16 digits": ("fpe_encrypt", "cards", "values/s", 1e6),
    "fpe_decrypt FF1, 16 digits": ("fpe_decrypt", "cards", "values/s", None),
    "tokenize 6+4 kept, Luhn, 16 digits": ("tokenize", "luhn", "values/s", None),
    "encrypt_deterministic AES-SIV, 16 digits": ("encrypt_deterministic", "cards", "values/s",
                                                 3e6),
    "encrypt_deterministic AES-SIV, 64-bit ids": ("encrypt_deterministic", "ids", "values/s",
                                                  3e6),
    "encrypt_deterministic AES-SIV, 32 chars": ("encrypt_deterministic", "str32", "values/s",
                                                3e6),
    "decrypt_deterministic AES-SIV, 32 chars": ("decrypt_deterministic", "str32", "values/s",
                                                None),
    "encrypt AES-GCM, 32 chars": ("encrypt", "str32", "values/s", None),
    "decrypt AES-GCM, 32 chars": ("decrypt", "str32", "values/s", None),
    "encrypt AES-GCM, 1 MiB values": ("encrypt", "mib", "MB/s", 1000.0),
    "decrypt AES-GCM, 1 MiB values": ("decrypt", "mib", "MB/s", None),
    "mask_last4, 16 digits": ("mask_last4", "cards", "values/s", None),
    "mask_hash HMAC-SHA-256, 32 chars": ("mask_hash", "str32", "values/s", None),
}

#: the masking policy of the scan table's c0 ('policy' strategy: read as role analyst)
_POLICY = "CASE WHEN current_role() IN ('auditor') THEN v ELSE mask_last4(v) END"

_CONFIG = """
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
hex = "{at_rest}"

[disks.local]
type = "local"
path = "data"

[disks.secure]
type = "encrypted"
disk = "local"

[policies.default]
volumes = [{{ name = "main", disks = ["secure"] }}]

[fields.keys.bench]
hex = "{field}"
"""


# -- worker bodies ---------------------------------------------------------------------------


def _digits(n: int, seed: int, luhn: bool = False) -> Any:
    """``n`` random 16-digit strings (Luhn-valid with ``luhn``), built over numpy buffers."""
    import numpy as np
    import pyarrow as pa

    x = np.random.default_rng(seed).integers(0, 10, size=(n, 16), dtype=np.int64)
    if luhn:
        x[:, -1] = 0
        rev = x[:, ::-1].copy()
        doubled = rev[:, 1::2] * 2
        rev[:, 1::2] = np.where(doubled > 9, doubled - 9, doubled)
        x[:, -1] = (10 - rev.sum(axis=1) % 10) % 10
    data = (x + ord("0")).astype(np.uint8).tobytes()
    offsets = (np.arange(n + 1, dtype=np.int32) * 16).tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _data(kind: str, n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    if kind == "cards":
        return _digits(n, 0)
    if kind == "luhn":
        return _digits(n, 1, luhn=True)
    if kind == "ids":
        return pa.array(np.random.default_rng(2).integers(-2**63, 2**63 - 1, size=n,
                                                          dtype=np.int64))
    if kind == "str32":
        data = os.urandom(16 * n).hex().encode("ascii")
        offsets = (np.arange(n + 1, dtype=np.int32) * 32).tobytes()
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    if kind == "mib":
        return pa.array([os.urandom(_MIB) for _ in range(n)], pa.binary())
    raise ValueError(f"unknown data {kind!r}")


def throughput(case: str, function: str, data: str, values: int, unit: str) -> list[Sample]:
    """One function over ``values`` values (see the module docstring), timed."""
    from .. import fields

    key = fields.FieldKey.generate("bench")
    pool = _data(data, min(values, 64 if data == "mib" else 1 << 20))
    call: Callable[[Any], Any] = {
        "fpe_encrypt": lambda v: fields.fpe_encrypt(v, key, "pan"),
        "fpe_decrypt": lambda v: fields.fpe_decrypt(v, key, "pan"),
        "tokenize": lambda v: fields.tokenize(v, key, "pan", keep_first=6, keep_last=4,
                                              luhn=True),
        "encrypt_deterministic": lambda v: fields.encrypt_deterministic(v, key),
        "decrypt_deterministic": lambda v: fields.decrypt_deterministic(v, key),
        "encrypt": lambda v: fields.encrypt(v, key),
        "decrypt": lambda v: fields.decrypt(v, key, output="binary"),
        "mask_last4": fields.mask_last4,
        "mask_hash": lambda v: fields.mask_hash(v, key),
    }[function]
    if function.startswith("decrypt") or function == "fpe_decrypt":
        pool = {"decrypt": fields.encrypt, "decrypt_deterministic": fields.encrypt_deterministic,
                "fpe_decrypt": lambda v, k: fields.fpe_encrypt(v, k, "pan")}[function](pool, key)
    batch = 1 if data == "mib" else _BATCH
    slices = [pool.slice(i, batch) for i in range(0, len(pool), batch)]
    done, nbytes = 0, 0
    with Stopwatch() as sw:
        while done < values:
            for part in slices:
                take = part if done + len(part) <= values else part.slice(0, values - done)
                call(take)
                done += len(take)
                if data == "mib":
                    nbytes += _MIB
                if done >= values:
                    break
    if unit == "MB/s":
        return [sw.rate(case, nbytes, values=values)]
    return [sw.rate(case, done, unit="values/s", scale=1, work_unit="values", values=values)]


def scan_prepare(path: str, config: str, rows: int) -> list[Sample]:
    """The scan table: c0..c3 clear, e0..e3 their ``encrypt`` (AES-GCM, base64) copies,
    b0..b3 the same ciphertexts' bytes (``BLOB``)."""
    from .. import fields  # noqa: F401 - gives databases opened afterwards the SQL functions
    from ..db import connect

    db = connect(path, config)
    try:
        db.sql("CREATE TABLE t (c0 VARCHAR, c1 VARCHAR, c2 VARCHAR, c3 VARCHAR, "
               "e0 VARCHAR, e1 VARCHAR, e2 VARCHAR, e3 VARCHAR, "
               "b0 BLOB, b1 BLOB, b2 BLOB, b3 BLOB)")
        step = 1_000_000
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            clear = ", ".join(f"substr(md5((range * 4 + {i})::VARCHAR), 1, 16) AS c{i}"
                              for i in range(4))
            sealed = ", ".join(f"encrypt(c{i}, 'bench') AS e{i}" for i in range(4))
            blobs = ", ".join(f"from_base64(e{i})" for i in range(4))
            db.sql(f"INSERT INTO t SELECT *, {blobs} FROM (SELECT *, {sealed} "  # noqa: S608
                   f"FROM (SELECT {clear} FROM range({int(lo)}, {int(hi)})))")
    finally:
        db.close()
    # c0 through a masking policy, as cryptdisk serve keeps it (PATH.policies): the
    # 'policy' strategy reads it as role analyst, the others without a role
    from ..server import AnalyticalEngine, PolicyStore

    engine = AnalyticalEngine(path, config)
    try:
        store = PolicyStore(path + ".policies", engine.keyring, engine)
        for sql in (f"CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> {_POLICY}",
                    "ALTER TABLE t ALTER COLUMN c0 SET MASKING POLICY m"):
            store.handle(None, sql)  # no users: the caller manages policies
    finally:
        engine.close()
    return []


def _total(table: Any, shape: str) -> int:
    """The answer checked against ``expected``: the query's sum, or the characters fetched."""
    import pyarrow.compute as pc

    if shape == "sum":
        return int(table.column(0)[0].as_py())
    return sum(int(pc.sum(pc.utf8_length(c)).as_py() or 0) for c in table.columns)


def scan(case: str, path: str, config: str, sql: str, expected: int, timed: int = 3,
         shape: str = "sum", rows: int | None = None, role: str | None = None,
         push: bool = True) -> list[Sample]:
    """``sql`` as ``role`` if given, on a fresh connection: the first run (nothing in the
    database's cache: row groups decoded and field functions computed), then one more
    run (the cache keeps what a second run offers) and the median of ``timed`` repeated
    runs (answered from the cache within its bound). Answers checked outside the timing:
    ``shape`` "sum" reads the query's one value, "fetch" counts the characters of the
    Arrow table the query returned. ``push`` False: field functions run as DuckDB UDFs
    and macros, not in the scan."""
    from .. import fields  # noqa: F401 - gives databases opened afterwards the SQL functions
    from ..db import connect

    def check(table: Any) -> None:
        got = _total(table, shape)
        if got != expected:
            raise AssertionError(f"{case}: the scan answered {got}, expected {expected}")
        if role is not None and shape == "fetch" and table is not None and \
                not str(table.column(0)[0].as_py()).startswith("*"):
            raise AssertionError(f"{case}: role {role} read c0 unmasked")

    db = connect(path, config, role=role)
    db.push_field_functions = push
    try:
        with Stopwatch() as first:
            table = db.sql(sql)
        check(table)
        del table
        check(db.sql(sql))
        walls, cpus = [], []
        for _ in range(timed):
            with Stopwatch() as sw:
                table = db.sql(sql)
            walls.append(sw.wall)
            cpus.append(sw.cpu)
            check(table)
            del table
    finally:
        db.close()
    return [Sample(f"{case}, first run", "s", first.wall, first.cpu, rows, "rows", "lower"),
            Sample(f"{case}, repeated", "s", statistics.median(walls),
                   statistics.median(cpus), rows, "rows", "lower")]


# -- the experiment ----------------------------------------------------------------------------


def _term(kind: str, i: int) -> str:
    if kind == "clear":
        return f"c{i}"
    if kind == "decrypt":
        return f"decrypt(e{i}, 'bench')"
    if kind == "decrypt-blob":
        return f"decrypt(b{i}, 'bench')"
    return f"mask_last4(c{i})"


def _scan_sql(kind: str, k: int) -> str:
    terms = [f"length({_term(kind, i)})" for i in range(k)]
    return f"SELECT sum({' + '.join(terms)}) FROM t"  # noqa: S608 - our own column names


def _fetch_sql(kind: str, k: int) -> str:
    """The first column protected (decrypted or masked), the other ``k - 1`` clear."""
    cols = [f"{_term(kind, 0)} AS c0"] + [f"c{i}" for i in range(1, k)]
    return f"SELECT {', '.join(cols)} FROM t"  # noqa: S608 - our own column names


#: scan case -> (SQL of a strategy, columns, shape); "fetch": the rows go to the caller
SCANS: dict[str, tuple[Callable[[str, int], str], int, str]] = {
    "scan 1 column": (_scan_sql, 1, "sum"),
    "scan 2 columns": (_scan_sql, 2, "sum"),
    "scan 4 columns": (_scan_sql, 4, "sum"),
    "fetch 1 column": (_fetch_sql, 1, "fetch"),
    "fetch 4 columns, 1 protected": (_fetch_sql, 4, "fetch"),
}


def _judge(measured: list[Measurement], rows: int) -> list[str]:
    by = {(m.case, m.strategy): m for m in measured}
    notes = []
    for case, (_fn, _data_kind, unit, target) in CASES.items():
        m = by.get((case, "cryptdisk"))
        if m is None or target is None:
            continue
        low, high = m.spread
        verdict = "meets" if m.median >= target else "MISSES"
        shown = f"{m.median / 1e6:.2f}M" if unit == "values/s" else f"{m.median:,.0f}"
        goal = f"{target / 1e6:g}M" if unit == "values/s" else f"{target:,.0f}"
        notes.append(f"{case}: {shown} {unit} (runs {low:,.0f}-{high:,.0f}); {verdict} "
                     f"the target of {goal} {unit} per core.")
    for label, strategy, limit in (("decrypting", "decrypt", 1.5),
                                   ("decrypting the ciphertexts' bytes (BLOB)", "decrypt-blob",
                                    1.5), ("masking", "mask", 1.05),
                                   ("through c0's masking policy, as a role", "policy", 1.05),
                                   ("decrypting as DuckDB UDFs (not in the scan)",
                                    "decrypt-udf", None)):
        for case in [f"{c}, {run}" for c in SCANS for run in ("first run", "repeated")]:
            a, b = by.get((case, strategy)), by.get((case, "clear"))
            if a is None or b is None:
                continue
            r = paired_ratio(a.values, b.values)
            verdict = ""
            if case.startswith("scan 1 column,") and limit is not None:
                verdict = (f"; {'meets' if r.median < limit else 'MISSES'} the target of "
                           f"{'under 1.5x' if limit == 1.5 else 'at most +5%'}")
            notes.append(f"{case}, {label} ({rows:,} rows): {r.median:.2f}x the clear scan "
                         f"(paired runs {r.low:.2f}-{r.high:.2f}){verdict}.")
    return notes


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Function throughput, then the scans (see the module docstring)."""
    from ..fields import native_library

    NOTES.clear()
    values = options.pick(200_000, 10_000_000, options.rows)
    rows = options.pick(200_000, 10_000_000, options.rows)
    repeats = options.pick(3, 5, options.repeats)
    functions = [c for c in CASES if options.case is None or options.case in c]
    scans = [c for c in SCANS if options.case is None or options.case in c]
    if not functions and not scans:
        raise ValueError(f"no fields case matches --case {options.case!r} (cases: "
                         f"{', '.join([*CASES, *SCANS])})")
    measured: list[Measurement] = []
    keep = keep_measurements(measured, record)
    with experiment_dir(options, "fields") as workdir:
        strategies = []
        for case in functions:
            fn, data, unit, _target = CASES[case]
            n = options.pick(16, 64) if data == "mib" else values  # 1 MiB values
            strategies.append(Strategy("cryptdisk", _B + "throughput", dict(
                case=case, function=fn, data=data, values=n, unit=unit)))
        if strategies:
            interleave(options, EXPERIMENT, strategies, keep, progress,
                       f"fields: {len(strategies)} functions, {values:,} values", repeats)
        if scans:
            _scans(options, workdir, scans, rows, repeats, keep, progress)
    for m in measured:
        scan_case = m.case.rsplit(", ", 1)[0]  # "scan 1 column, first run" etc.
        m.extra.setdefault("rows", rows if scan_case in SCANS else m.extra.get("values"))
        if m.case in CASES and CASES[m.case][3] is not None:
            m.extra["target"] = CASES[m.case][3]
    NOTES.extend(_judge(measured, rows))
    library = native_library()
    NOTES.append("Column encryption ran through "
                 + (f"the C extension (cryptdisk.fields._cfields, {library})" if library else
                    "cryptography, one call per value (the C extension was not built)")
                 + ", mask_hash too; FF1 and tokens are numpy over cryptography's AES. "
                 "Throughput is one thread in one worker process; a scan runs DuckDB's "
                 "threads (the C loops release the GIL). 'mask' is mask_last4 in the query "
                 "(in SQL a DuckDB macro, in the throughput case the Python API's C loop), "
                 "what a masking policy with that body makes a subject role's query run; "
                 "'policy' is the clear query as role analyst through c0's masking policy "
                 "(the per-query rewrite and the folded CASE included). 'scan' cases sum the "
                 "values' lengths inside DuckDB; 'fetch' cases return the rows to the "
                 "caller as an Arrow table.")
    for m in measured:
        record(m)


def _scans(options: BenchOptions, workdir: Any, scans: list[str], rows: int, repeats: int,
           keep: Any, progress: Progress) -> None:
    """The table, then each scan case's clear, decrypt and mask runs interleaved."""
    config = str(workdir / "bench.toml")
    with open(config, "w") as f:
        f.write(_CONFIG.format(at_rest=os.urandom(32).hex(), field=os.urandom(32).hex()))
    path = str(workdir / "db")
    progress(f"fields: a {rows:,}-row table with 4 protected columns", 0, 1)
    run_worker(options.cleanup, _B + "scan_prepare", dict(path=path, config=config,
                                                          rows=rows))
    for case in scans:
        make, k, shape = SCANS[case]
        runs = [Strategy(kind, _B + "scan", dict(
            case=case, path=path, config=config, sql=make(kind, k), expected=16 * k * rows,
            shape=shape, rows=rows), baseline=None if kind == "clear" else "clear")
            for kind in ("clear", "decrypt", "decrypt-blob", "mask")]
        runs.append(Strategy("policy", _B + "scan", dict(  # the clear query, as a role
            case=case, path=path, config=config, sql=make("clear", k), expected=16 * k * rows,
            shape=shape, rows=rows, role="analyst"), baseline="clear"))
        runs.append(Strategy("decrypt-udf", _B + "scan", dict(  # decrypt, as DuckDB UDFs
            case=case, path=path, config=config, sql=make("decrypt", k),
            expected=16 * k * rows, shape=shape, rows=rows, push=False), baseline="clear"))
        interleave(options, EXPERIMENT, runs, keep, progress,
                   f"fields: warm scans of {rows:,} rows, {case}", repeats, rotate=True)
