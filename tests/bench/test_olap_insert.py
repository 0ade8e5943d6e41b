"""The like-for-like insert case of ``bench olap``: cryptdisk's database loads chdb's Parquet file.

Structure and behaviour only, never timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cryptdisk.bench._bodies_olap import insert
from cryptdisk.bench._model import Measurement
from cryptdisk.bench._olap_data import generate
from cryptdisk.bench.olap import _cryptdisk_at_rest, _vs_chdb
from cryptdisk.db import connect

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROWS = 2500


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("olapins") / "data.parquet", ROWS, chunk=1000)


@pytest.mark.parametrize("engine", ["cryptdisk", "cryptdisk-ordered"])
@pytest.mark.parametrize("policy", ["plain", "default"])
def test_cryptdisk_insert_loads_every_row_of_the_parquet_file(tmp_path, data, engine, policy):
    store = tmp_path / "store"
    samples = insert(engine, str(store), str(data), None, policy, "insert", ROWS)
    assert len(samples) == 1 and samples[0].unit == "s" and samples[0].value > 0
    assert samples[0].extra["rows_loaded"] == ROWS
    source = pq.read_table(data)
    with connect(store / "db", read_only=True) as db:
        got = db.arrow_table("t")
        disk = db.query("SELECT DISTINCT disk FROM system.parts WHERE \"table\" = 't'")
    assert got.num_rows == ROWS
    assert sorted(got.column("c_str").to_pylist()) == sorted(source.column("c_str").to_pylist())
    assert sum(got.column("c_int").to_pylist()) == sum(source.column("c_int").to_pylist())
    if engine == "cryptdisk-ordered":
        ints = got.column("c_int").to_pylist()
        assert ints == sorted(ints)
    assert len(disk) == 1


def test_encrypted_policy_really_writes_ciphertext(tmp_path, data):
    store = tmp_path / "enc"
    insert("cryptdisk", str(store), str(data), None, "default", "insert", ROWS)
    parts = [p for p in (store / "db" / "data").rglob("*") if p.is_file()]
    assert parts
    one_value = pq.read_table(data).column("c_str")[7].as_py().encode()
    for p in parts:
        raw = p.read_bytes()
        assert raw.startswith(b"CRYPTDSK") and b"PAR1" not in raw[:4] + raw[-4:]
        assert one_value not in raw  # an md5 string of the data is not on disk in clear
    assert not (store / "db" / "plain").exists() or not any(
        p.is_file() for p in (store / "db" / "plain").rglob("*"))
    note = _cryptdisk_at_rest("cryptdisk encrypted", store)
    assert f"{len(parts)} part files" in note and "all start with CRYPTDSK" in note
    assert "0 readable as Parquet" in note


def test_plain_policy_writes_parquet_and_the_check_tells_them_apart(tmp_path, data):
    store = tmp_path / "plain"
    insert("cryptdisk", str(store), str(data), None, "plain", "insert", ROWS)
    parts = [p for p in (store / "db" / "plain").rglob("*") if p.is_file()]
    assert parts and all(p.read_bytes()[:4] == b"PAR1" for p in parts)
    assert "all start with PAR1" in _cryptdisk_at_rest("cryptdisk plain", store)
    # the same plaintext store named as an encrypted one must fail the check
    (store / "db" / "data").mkdir(exist_ok=True)
    for p in parts:
        (store / "db" / "data" / p.name).write_bytes(p.read_bytes())
    assert "NOT all start with CRYPTDSK" in _cryptdisk_at_rest("cryptdisk encrypted", store)


def test_row_count_mismatch_fails_the_run(tmp_path, data):
    with pytest.raises(AssertionError, match=f"loaded {ROWS} rows, expected {ROWS + 1}"):
        insert("cryptdisk", str(tmp_path / "s"), str(data), None, "plain", "insert", ROWS + 1)


def test_vs_chdb_note_pairs_runs_round_by_round():
    def m(strategy: str, values: list[float], cpu: list[float]) -> Measurement:
        return Measurement("olap", "insert 10 rows", strategy, "s", values, "lower", cpu)

    note = _vs_chdb([m("chdb plain", [1.0, 2.0, 4.0], [1.0, 1.0, 1.0]),
                     m("chdb AES_128_CTR", [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]),
                     m("cryptdisk plain", [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]),
                     m("cryptdisk encrypted", [1.0, 3.0, 5.0], [1.0, 1.0, 1.0]),
                     Measurement("olap", "avg(c_float) threads=all cold", "chdb plain", "s",
                                 [100.0, 100.0, 100.0])])
    assert len(note) == 1
    # per-round ratios 2/1, 2/2, 2/4 -> median 1, min 0.5, max 2
    assert "cryptdisk plain / chdb plain 1.00 (0.50-2.00), CPU 3.00" in note[0]
    assert "cryptdisk encrypted / chdb AES_128_CTR 1.50 (0.50-2.50), CPU 0.50" in note[0]
    assert "AES_256_CTR" not in note[0]  # no such measurement, no made-up ratio
    assert _vs_chdb([m("chdb plain", [1.0], [1.0])]) == []


def test_bench_olap_reports_cryptdisk_and_chdb_inserts_side_by_side(tmp_path):
    out, rep = tmp_path / "olap.json", tmp_path / "rep"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "olap", "--quick",
                        "--rows", "3000", "--repeats", "2", "--no-venv", "--workdir",
                        str(tmp_path / "w"), "--json", str(out), "--report", str(rep)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert not [s for s in d["skipped"] if s["strategy"].startswith(("cryptdisk", "chdb"))]
    ins = {m["strategy"]: m for m in d["measurements"]
           if m["experiment"] == "olap" and m["case"] == "insert 3,000 rows"}
    names = ["chdb plain", "chdb AES_128_CTR", "cryptdisk plain", "cryptdisk encrypted",
             "cryptdisk plain ORDER BY c_int", "cryptdisk encrypted ORDER BY c_int"]
    for name in names:
        assert len(ins[name]["values"]) == 2 and len(ins[name]["cpu_s"]) == 2
        assert ins[name]["extra"]["rows_loaded"] == 3000, name
    assert ins["cryptdisk encrypted ORDER BY c_int"]["extra"]["baseline"] == \
        "cryptdisk plain ORDER BY c_int"
    # insert only: cryptdisk's scans are the olap-db section's
    assert not [m for m in d["measurements"] if m["experiment"] == "olap"
                and m["strategy"].startswith("cryptdisk") and "insert" not in m["case"]]
    notes = " ".join(d["notes"]["olap"])
    assert "cryptdisk encrypted / chdb AES_128_CTR" in notes
    assert "cryptdisk encrypted: 1 part files on its disk, all start with CRYPTDSK; " \
           "0 readable as Parquet" in notes
    report = (rep / "README.md").read_text()
    assert "| insert 3,000 rows | cryptdisk encrypted | s | 2 |" in report
    assert "| insert 3,000 rows | chdb AES_128_CTR | s | 2 |" in report
