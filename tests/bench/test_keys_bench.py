"""cryptdisk bench keys runs end to end at a tiny size (no timing is asserted): every key
opens every file and scans its table, and the provider calls are what each key makes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cryptdisk.bench import BenchOptions, Measurement, Skipped, key_servers
from cryptdisk.bench.keys_speed import run

CASES = ("load the keyring (connect)", "first open of each file", "re-open (unwrap cache)",
         "cold scan: open, sum(x)")
ENV = ("SOFTHSM2_CONF", "CD_BENCH_PIN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def test_each_key_in_fresh_workers_with_its_provider_calls(tmp_path: Path) -> None:
    before = {k: os.environ.get(k) for k in ENV}
    got: list = []
    run(BenchOptions(tmp_path, quick=True, rows=25, repeats=1), got.append, lambda *a: None)
    ms = {(m.case, m.strategy): m for m in got if isinstance(m, Measurement)}
    keys = ("local key file", "pkcs11 (SoftHSM2)", "pkcs11 wrapped_key", "kmip (PyKMIP)",
            "kmip wrapped_key", "aws-kms (moto)")
    assert set(ms) == {(c, k) for c in CASES for k in keys}
    first = {k: ms[("first open of each file", k)] for k in keys}
    assert all(m.work == 25 and m.unit == "opens/s" and m.values[0] > 0 for m in first.values())
    # one provider call per file sealed by the token or the server, one per process for a
    # wrapped key and for aws-kms (KMS Decrypt of the keyring key)
    assert [first[k].extra["provider_calls"] for k in keys] == [0, 25, 1, 25, 1, 1]
    scan = {k: ms[("cold scan: open, sum(x)", k)] for k in keys}
    assert all(m.work == 200_000 for m in scan.values())
    assert [scan[k].extra["provider_calls"] for k in keys[2:]] == [1, 4, 1, 1]
    assert scan["kmip (PyKMIP)"].extra["baseline"] == "local key file"
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created
    assert {k: os.environ.get(k) for k in before} == before  # and restored the environment


def test_a_provider_without_its_server_package_is_skipped_with_the_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(provider: str) -> None:
        raise key_servers.ServerMissing(provider, f"pip install {provider}-server")

    monkeypatch.setattr(key_servers, "require", missing)
    got: list = []
    run(BenchOptions(tmp_path, quick=True, rows=10, repeats=1), got.append, lambda *a: None)
    skipped = {s.strategy: s.install for s in got if isinstance(s, Skipped)}
    assert skipped == {"kmip (PyKMIP)": "pip install kmip-server",
                       "aws-kms (moto)": "pip install aws-kms-server"}
    measured = {m.strategy for m in got if isinstance(m, Measurement)}
    assert measured == {"local key file", "pkcs11 (SoftHSM2)", "pkcs11 wrapped_key"}
    assert list(tmp_path.iterdir()) == []
