"""The fields experiment runs end to end on a few values (no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from cryptdisk.bench import fields
from cryptdisk.bench._model import BenchOptions, Measurement

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_fields_records_every_function_and_scan(tmp_path):
    got = []
    fields.run(BenchOptions(tmp_path, quick=True, rows=3000, repeats=1), got.append,
               lambda what, n, total: None)
    assert all(isinstance(m, Measurement) for m in got), [m for m in got
                                                          if not isinstance(m, Measurement)]
    cases = {(m.case, m.strategy) for m in got}
    for case in fields.CASES:
        assert (case, "cryptdisk") in cases
    for case in ("scan 1 column", "scan 2 columns", "scan 4 columns", "fetch 1 column",
                 "fetch 4 columns, 1 protected"):
        for run in ("first run", "repeated"):  # each timed apart, against the clear one's
            for strategy in ("clear", "decrypt", "decrypt-blob", "mask", "policy",
                             "decrypt-udf"):
                assert (f"{case}, {run}", strategy) in cases
    gcm = next(m for m in got if m.case == "encrypt AES-GCM, 1 MiB values")
    assert gcm.unit == "MB/s" and gcm.work == 16 * (1 << 20) and gcm.extra["target"] == 1000
    ff1 = next(m for m in got if m.case == "fpe_encrypt FF1, 16 digits")
    assert ff1.unit == "values/s" and ff1.work == 3000 and ff1.values[0] > 0
    scan = next(m for m in got
                if m.case == "scan 1 column, repeated" and m.strategy == "decrypt")
    assert scan.extra["baseline"] == "clear" and scan.extra["rows"] == 3000
    assert scan.work == 3000 and scan.cpu_s  # so the report has a CPU ratio per row
    notes = "\n".join(fields.NOTES)
    assert "fpe_encrypt FF1, 16 digits" in notes and "the target of 1M values/s" in notes
    assert "scan 1 column, first run, decrypting (3,000 rows)" in notes
    assert "scan 1 column, repeated, decrypting (3,000 rows)" in notes and "under 1.5x" in notes
    assert "scan 1 column, first run, decrypting the ciphertexts' bytes (BLOB) (3,000 rows)" \
        in notes
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created


def test_case_picks_the_cases_to_run(tmp_path):
    got = []
    fields.run(BenchOptions(tmp_path, quick=True, rows=2000, repeats=1, case="fetch 1"),
               got.append, lambda what, n, total: None)
    assert {(m.case, m.strategy) for m in got} == {
        (f"fetch 1 column, {run}", s) for s in ("clear", "decrypt", "decrypt-blob", "mask",
                                                 "policy", "decrypt-udf")
        for run in ("first run", "repeated")}
    notes = "\n".join(fields.NOTES)
    assert "fetch 1 column, repeated, masking (2,000 rows)" in notes
    assert "fetch 1 column, first run, through c0's masking policy, as a role (2,000 rows)" \
        in notes
    try:
        fields.run(BenchOptions(tmp_path, quick=True, case="nothing like it"), got.append,
                   lambda what, n, total: None)
    except ValueError as exc:
        assert "scan 1 column" in str(exc)  # it lists the cases
    else:
        raise AssertionError("an unknown --case ran")


def test_cryptdisk_bench_fields_writes_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "fields", "--rows", "2000",
                        "--repeats", "1", "--workdir", str(tmp_path / "w"), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "scan 1 column" in r.stdout
    data = json.loads(out.read_text())
    assert {m["experiment"] for m in data["measurements"]} == {"fields"}
    assert any("target" in line for line in data["notes"]["fields"])
