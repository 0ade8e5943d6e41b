"""keys experiment: what a key held by a provider costs, against a local key file.

Keys: a local key file; an AES key in a SoftHSM2 token (``pkcs11``: every data key
sealed and opened in the token); the same token key wrapping a keyring key
(``pkcs11 wrapped_key``: one token call per process, then local AES-GCM); an AES key on
PyKMIP's KMIP server (``kmip``: every data key sealed and opened by the server, over
mutual TLS on loopback) and the same server key wrapping a keyring key (``kmip
wrapped_key``); a keyring key wrapped by a KMS key in moto's server (``aws-kms``: one
KMS ``Decrypt`` per process). The SoftHSM2 token is made in the scratch directory
(``softhsm2-util``); the KMIP and KMS servers run on 127.0.0.1 while the experiment
runs (:mod:`.key_servers`). A provider whose software is missing is recorded as skipped
with its install hint. For each key, interleaved, each run a fresh worker
(:mod:`._bodies_keys`):

* opens: N files of 100 bytes (``--rows`` sets N; default 2,000, quick 300): load the
  keyring (connect), open every file once (an unwrap each), open them all again (the
  unwrap cache): opens per second, and the provider calls the first pass made;
* cold scan: a table (default 10M rows, quick 200k; ``--rows`` of 100,000 or more
  sets it, smaller sets N above) in a database on an encrypted disk, summed by a fresh
  process, with the provider calls it made::

    cryptdisk bench keys --repeats 5
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator

from . import key_servers
from ._bodies_keys import PIN_ENV
from ._model import BenchOptions, Progress, Recorder, Skipped
from ._suite import Strategy, ensure_cleanup, experiment_dir, interleave
from ._worker import run_worker

__all__ = ["NOTES", "run"]

#: moto accepts any credentials; these keep the workers' boto3 off any real account
_AWS_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

NOTES: list[str] = []
EXPERIMENT = "keys"
_MODULES = ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
            "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so")
def _token(workdir: str) -> tuple[str, str, str] | None:
    """A SoftHSM2 token in ``workdir``: (module, label, its config), or None without SoftHSM2.

    Made with ``softhsm2-util``; this process never loads the PKCS#11 module (SoftHSM2
    reads its config once per process), the workers do.
    """
    util = shutil.which("softhsm2-util")
    module = next((m for m in _MODULES if os.path.exists(m)), None)
    if not util or not module:
        return None
    tokens = os.path.join(workdir, "tokens")
    os.makedirs(tokens)
    conf = os.path.join(workdir, "softhsm2.conf")
    with open(conf, "w") as f:
        f.write(f"directories.tokendir = {tokens}\nobjectstore.backend = file\n"
                "log.level = ERROR\n")
    subprocess.run([util, "--init-token", "--free", "--label", "bench", "--pin",
                    os.environ[PIN_ENV], "--so-pin", os.urandom(8).hex()], check=True,
                   capture_output=True, env=dict(os.environ, SOFTHSM2_CONF=conf))
    return module, "bench", conf


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set variables for the workers (they inherit them), restored afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Write the files and tables under each key, then time opens and cold scans."""
    files = options.pick(300, 2_000, options.rows if options.rows and options.rows < 100_000
                         else None)
    rows = options.pick(200_000, 10_000_000, options.rows if options.rows and
                        options.rows >= 100_000 else None)
    repeats = options.pick(3, 5, options.repeats)
    NOTES.clear()
    with experiment_dir(options, "keys") as workdir, \
            _environment(**{PIN_ENV: os.urandom(8).hex()}):
        token = _token(str(workdir))
        if token is None:
            record(Skipped(EXPERIMENT, "pkcs11 (SoftHSM2)", "SoftHSM2 is not installed",
                           "apt-get install softhsm2"))
        with contextlib.ExitStack() as servers, \
                _environment(**({"SOFTHSM2_CONF": token[2]} if token else {}), **_AWS_ENV):
            kmip = kms = None
            try:
                kmip_root = workdir / "kmip-server"
                kmip_root.mkdir()
                kmip = {"root": str(kmip_root), "port": servers.enter_context(
                    key_servers.kmip_server(kmip_root))}
            except key_servers.ServerMissing as exc:
                record(Skipped(EXPERIMENT, "kmip (PyKMIP)", str(exc), exc.hint))
            try:
                kms = servers.enter_context(key_servers.moto_kms())
            except key_servers.ServerMissing as exc:
                record(Skipped(EXPERIMENT, "aws-kms (moto)", str(exc), exc.hint))
            progress(f"keys: writing {files} files and {rows:,} rows under each key", 0, 1)
            run_worker(ensure_cleanup(options), "cryptdisk.bench._bodies_keys:prepare", dict(
                workdir=str(workdir), module=token[0] if token else None,
                label=token[1] if token else None, files=files, rows=rows, kmip=kmip,
                kms_endpoint=kms))
            prepared = json.loads((workdir / "prepared.json").read_text())
            opens, scans = [], []
            for name, item in prepared.items():
                baseline = None if name == "local key file" else "local key file"
                opens.append(Strategy(name, "cryptdisk.bench._bodies_keys:open_files", dict(
                    config=item["config"], root=item["files"], files=files),
                    baseline=baseline))
                scans.append(Strategy(name, "cryptdisk.bench._bodies_keys:scan_table", dict(
                    config=item["config"], db=item["db"]), baseline=baseline))
            parts = next(iter(prepared.values()))["parts"]
            NOTES.append(f"opens: {files} files of 100 bytes per key; each run a fresh process "
                         "(keyring loaded, caches empty). cold scan: a table of "
                         f"{rows:,} BIGINT rows in {parts} part(s) on an encrypted local disk "
                         "(plus the catalog), summed by a fresh process. SoftHSM2 is a "
                         "software token in the same process: a network HSM adds its round "
                         "trip to every provider call, which the wrapped key pays once per "
                         "process. PyKMIP's server and moto's KMS run on this machine "
                         "(loopback; their CPU is not in the workers' CPU figures): a "
                         "remote server adds the network round trip to each call.")
            interleave(options, EXPERIMENT, opens, record, progress, "keys: opens", repeats)
            interleave(options, EXPERIMENT, scans, record, progress, "keys: cold scan",
                       repeats)
