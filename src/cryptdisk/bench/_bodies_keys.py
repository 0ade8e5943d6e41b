"""Worker bodies of the keys experiment: open files and scan a table under a config's key.

Each run is a fresh process, so the keyring connects to its provider and every unwrap
cache starts empty, as in a new reader. The SoftHSM2 token (``SOFTHSM2_CONF``) and its
PIN (``CD_BENCH_PIN``), and moto's dummy AWS credentials, come from the environment the
harness set; the KMIP and KMS servers are the harness's (:mod:`.key_servers`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import open as cd_open
from ..keys import Keyring
from ._measure import Sample, Stopwatch

__all__ = ["PIN_ENV", "open_files", "prepare", "scan_table", "write_files"]

PIN_ENV = "CD_BENCH_PIN"
_STORE = "\n".join(["[disks.local]", 'type = "local"', 'path = "store"',
                    "[disks.secure]", 'type = "encrypted"', 'disk = "local"',
                    "[policies.default]", 'volumes = [{ name = "main", disks = ["secure"] }]',
                    ""])


def _write(directory: str, text: str) -> str:
    path = os.path.join(directory, "cryptdisk.toml")
    with open(path, "w") as f:
        f.write(text + _STORE)
    return path


def _configs(workdir: str, module: str | None, label: str | None,
             kmip: dict[str, Any] | None, kms_endpoint: str | None) -> dict[str, str]:
    """Strategy name -> the config of its key (a directory each)."""
    from ..keys import Key, create_wrapped_key, write_key_file

    configs = {}
    local = os.path.join(workdir, "local")
    os.makedirs(local)
    write_key_file(os.path.join(local, "k1.hex"), Key.generate(1))
    configs["local key file"] = _write(local, '[keyring]\n[[keyring.keys]]\nid = 1\n'
                                       'file = "k1.hex"\n')
    if module is not None and label is not None:
        from ..keys.providers import generate_pkcs11_key

        generate_pkcs11_key(module, label, "kek", pin=os.environ[PIN_ENV])
        entry = (f'[keyring]\n[[keyring.keys]]\nid = 1\nsource = "pkcs11"\n'
                 f'module = "{module}"\ntoken = "{label}"\nkey = "kek"\n'
                 f'pin_env = "{PIN_ENV}"\n')
        direct = os.path.join(workdir, "pkcs11")
        os.makedirs(direct)
        configs["pkcs11 (SoftHSM2)"] = _write(direct, entry)
        wrapped = os.path.join(workdir, "wrapped")
        os.makedirs(wrapped)
        create_wrapped_key(os.path.join(wrapped, "k1.p11"), {
            "id": 1, "source": "pkcs11", "module": module, "token": label, "key": "kek",
            "pin_env": PIN_ENV})
        configs["pkcs11 wrapped_key"] = _write(wrapped, entry + 'wrapped_key = "k1.p11"\n')
    if kmip is not None:
        configs.update(_kmip_configs(workdir, kmip))
    if kms_endpoint is not None:
        configs["aws-kms (moto)"] = _aws_kms_config(workdir, kms_endpoint)
    return configs


def _kmip_configs(workdir: str, kmip: dict[str, Any]) -> dict[str, str]:
    """A key made on the KMIP server, used directly and as the KEK of a wrapped key."""
    from ..keys import create_wrapped_key
    from ..keys.providers import create_kmip_key

    root, port = kmip["root"], int(kmip["port"])
    cert, tls_key, ca = f"{root}/client.pem", f"{root}/client.key", f"{root}/ca.pem"
    create_kmip_key("127.0.0.1", port, "bench-kek", cert=cert, key=tls_key, ca=ca)
    fields = {"id": 1, "source": "kmip", "host": "127.0.0.1", "port": port, "key": "bench-kek",
              "client_cert": cert, "client_key": tls_key, "ca": ca,
              "timeout": 30}
    entry = "[keyring]\n[[keyring.keys]]\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in fields.items())
    configs = {}
    direct = os.path.join(workdir, "kmip")
    os.makedirs(direct)
    configs["kmip (PyKMIP)"] = _write(direct, entry)
    wrapped = os.path.join(workdir, "kmip-wrapped")
    os.makedirs(wrapped)
    create_wrapped_key(os.path.join(wrapped, "k1.kmip"), fields)
    configs["kmip wrapped_key"] = _write(wrapped, entry + 'wrapped_key = "k1.kmip"\n')
    return configs


def _aws_kms_config(workdir: str, endpoint: str) -> str:
    """A KMS key made in moto and a keyring key wrapped by it."""
    from ..keys.providers import create_aws_kms_key, create_aws_kms_wrapped_key

    kms_key = create_aws_kms_key(region="us-east-1", endpoint=endpoint)
    base = os.path.join(workdir, "aws-kms")
    os.makedirs(base)
    create_aws_kms_wrapped_key(os.path.join(base, "k1.kms"), kms_key, key_id=1,
                               region="us-east-1", endpoint=endpoint)
    return _write(base, f'[keyring]\n[[keyring.keys]]\nid = 1\nsource = "aws-kms"\n'
                  f'kms_key = "{kms_key}"\nwrapped_key = "k1.kms"\nregion = "us-east-1"\n'
                  f'endpoint = "{endpoint}"\ntimeout = 30\n')


def prepare(workdir: str, module: str | None, label: str | None, files: int, rows: int,
            kmip: dict[str, Any] | None = None,
            kms_endpoint: str | None = None) -> list[Sample]:
    """Make each key (the token's in SoftHSM2, the KMIP server's, moto's KMS key), its files
    and its database (untimed); what was made goes to ``workdir/prepared.json``. ``kmip``:
    the server's ``root`` (its certificates) and ``port``."""
    import cryptdisk

    prepared = {}
    for name, config in _configs(workdir, module, label, kmip, kms_endpoint).items():
        base = os.path.dirname(config)
        os.makedirs(os.path.join(base, "files"))
        write_files(config, os.path.join(base, "files"), files)
        db = os.path.join(base, "db")
        with cryptdisk.connect(db, config) as conn:
            conn.sql("CREATE TABLE t (x BIGINT)")
            conn.sql(f"INSERT INTO t SELECT range FROM range({int(rows)})")  # noqa: S608
            parts = sum(len(t.parts) for t in conn.catalog.tables.values())
        prepared[name] = {"config": config, "files": os.path.join(base, "files"), "db": db,
                          "parts": parts}
    with open(os.path.join(workdir, "prepared.json"), "w") as f:
        json.dump(prepared, f)
    return []


def _calls(key: Any) -> dict[str, Any]:
    """Provider calls a key made (a wrapped key, aws-kms: the unwraps of its KEK), for the
    report."""
    uses = getattr(key, "uses", None)
    if uses is None:
        return {"provider_calls": 0}
    provider = key.provider
    if hasattr(provider, "unwraps"):
        return {"provider_calls": provider.unwraps}
    return {"provider_calls": uses["provider_calls"]}


def write_files(config: str, root: str, files: int) -> None:
    """``files`` files of 100 bytes under the config's current key (untimed)."""
    ring = Keyring.from_config(config)
    try:
        for i in range(files):
            with cd_open(Path(root) / f"f{i:06d}", "wb", keyring=ring) as f:
                f.write(b"k" * 100)
    finally:
        ring.close()


def open_files(config: str, root: str, files: int) -> list[Sample]:
    """Load the keyring (connect), open every file once (an unwrap each: the provider, or
    the KEK for a wrapped key), then open them all again (the unwrap cache)."""
    with Stopwatch() as connect:
        ring = Keyring.from_config(config)
    key = ring.current_key()
    names = [Path(root) / f"f{i:06d}" for i in range(files)]
    try:
        with Stopwatch() as first:
            for name in names:
                with cd_open(name, "rb", keyring=ring) as f:
                    f.read(1)
        calls = _calls(key)
        with Stopwatch() as again:
            for name in names:
                with cd_open(name, "rb", keyring=ring) as f:
                    f.read(1)
    finally:
        ring.close()
    return [connect.seconds("load the keyring (connect)", work_unit="keyrings"),
            first.rate("first open of each file", files, unit="opens/s", scale=1,
                       work_unit="opens", **calls),
            again.rate("re-open (unwrap cache)", files, unit="opens/s", scale=1,
                       work_unit="opens")]


def scan_table(config: str, db: str) -> list[Sample]:
    """Open the database (cold) and sum its table: the cold-scan cost of the key."""
    import cryptdisk

    with Stopwatch() as scan, cryptdisk.connect(db, config, read_only=True) as conn:
        result = conn.sql("SELECT sum(x) AS s, count(*) AS n FROM t")
        assert result is not None
        total = result.to_pylist()[0]
        key = conn.keyring.current_key()
        calls = _calls(key)
    return [scan.seconds("cold scan: open, sum(x)", total["n"], work_unit="rows", **calls)]
