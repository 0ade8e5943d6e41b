"""The aws-kms provider against moto's KMS in server mode on loopback."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import cryptdisk
from cryptdisk.errors import ConfigError, KeyFileError, KeyProviderError
from cryptdisk.format import Header
from cryptdisk.keys import Keyring, ProviderKey
from cryptdisk.keys.providers import create_aws_kms_key, create_aws_kms_wrapped_key

from .conftest import SECURE_STORE, assert_a_database_round_trips, write

SECRET = "aws-secret-do-not-leak-0815"
ENV = {"AWS_ACCESS_KEY_ID": "AKIDTESTING", "AWS_SECRET_ACCESS_KEY": SECRET,
       "AWS_DEFAULT_REGION": "us-east-1"}


#: the running moto server of the ``kms`` fixture (a test may stop it)
RUNNING: list = []


@pytest.fixture
def kms(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """moto's server on a free loopback port: (endpoint, a new KMS key's id)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    RUNNING[:] = [server]
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
        key = client.create_key(KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["KeyId"]
        yield endpoint, key
    finally:
        server.stop()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic under the test's control (``clock[0]`` is now): the age of the
    unwrapped key is read from it."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def _entry(endpoint: str, kms_key: str, key_id: int = 6, extra: str = "") -> str:
    return (f'[[keyring.keys]]\nid = {key_id}\nsource = "aws-kms"\nkms_key = "{kms_key}"\n'
            f'wrapped_key = "k{key_id}.kms"\nregion = "us-east-1"\nendpoint = "{endpoint}"\n'
            f"timeout = 2\n{extra}")


def _ring(tmp_path: Path, endpoint: str, kms_key: str, key_id: int = 6,
          extra: str = "") -> Keyring:
    return Keyring.from_config(write(tmp_path, "[keyring]\n" + _entry(endpoint, kms_key, key_id,
                                                                        extra)))


def test_a_file_under_a_kms_wrapped_key(tmp_path, kms):
    endpoint, kms_key = kms
    wrapped = tmp_path / "k6.kms"
    create_aws_kms_wrapped_key(wrapped, kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    assert oct(wrapped.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(KeyProviderError, match="refusing to overwrite"):
        create_aws_kms_wrapped_key(wrapped, kms_key, key_id=6, region="us-east-1",
                                   endpoint=endpoint)
    ring = _ring(tmp_path, endpoint, kms_key)
    key = ring.current_key()
    assert isinstance(key, ProviderKey) and key.source == "aws-kms"
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"under kms" * 100)
    header = Header.parse(path.read_bytes()[:128])
    assert header.key_id == 6 and header.key_check == key.check_value
    ring.close()
    assert key.provider._kek is None  # closing forgot the unwrapped key
    again = _ring(tmp_path, endpoint, kms_key)  # another process would do the same
    with cryptdisk.open(path, "rb", keyring=again) as f:
        assert f.read() == b"under kms" * 100


def test_create_aws_kms_key_makes_a_usable_key_and_refusals_are_clear(tmp_path, kms):
    endpoint, _ = kms
    made = create_aws_kms_key(region="us-east-1", endpoint=endpoint)
    client = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    meta = client.describe_key(KeyId=made)["KeyMetadata"]
    assert meta["KeyUsage"] == "ENCRYPT_DECRYPT" and meta["Enabled"]
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", made, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    ring = _ring(tmp_path, endpoint, made)
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"new kms key")
    with cryptdisk.open(path, "rb", keyring=ring) as f:
        assert f.read() == b"new kms key"
    ring.close()
    RUNNING[0].stop()
    with pytest.raises(KeyProviderError, match="CreateKey failed") as err:
        create_aws_kms_key(region="us-east-1", endpoint=endpoint, timeout=1)
    assert SECRET not in str(err.value)


def test_the_unwrapped_key_is_kept_for_kek_seconds_then_zeroed_and_unwrapped_again(
        tmp_path, kms, clock):
    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    key = _ring(tmp_path, endpoint, kms_key, extra="kek_seconds = 60\ncache_entries = 0\n"
                ).current_key()
    provider = key.provider
    assert provider.unwraps == 1
    held = provider._kek
    blobs = [key.wrap(bytes([i]) * 32, b"x" * 48) for i in range(20)]
    assert [key.unwrap(b, b"x" * 48) for b in blobs] == [bytes([i]) * 32 for i in range(20)]
    assert provider.unwraps == 1  # one KMS call for 40 seals and opens
    clock[0] += 60
    assert key.unwrap(blobs[0], b"x" * 48) == bytes(32)
    assert provider.unwraps == 2 and held == bytearray(len(held))


def test_a_wrapped_key_is_bound_to_its_keyring_id(tmp_path, kms):
    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=5, region="us-east-1",
                               endpoint=endpoint)
    with pytest.raises(KeyProviderError, match=r"Decrypt of .* failed") as info:
        _ring(tmp_path, endpoint, kms_key, key_id=6)
    assert "InvalidCiphertext" in str(info.value)  # KMS refused the context, not the network


def test_kms_unreachable_or_refusing_is_a_clear_error_without_credentials(tmp_path, kms):
    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    errors = []
    with pytest.raises(KeyProviderError, match="Decrypt") as info:
        _ring(tmp_path, "http://127.0.0.1:9", kms_key)  # nothing listens on port 9
    errors.append(info.value)
    (tmp_path / "k6.kms").write_bytes(b"bm90IGEga21zIGJsb2I=\n")
    with pytest.raises(KeyProviderError, match="Decrypt") as info:
        _ring(tmp_path, endpoint, kms_key)
    errors.append(info.value)
    os.remove(tmp_path / "k6.kms")
    with pytest.raises(KeyProviderError, match="cannot be read") as info:
        _ring(tmp_path, endpoint, kms_key)
    errors.append(info.value)
    assert all(str(tmp_path / "cryptdisk.toml") in str(e) for e in errors)
    assert not [e for e in errors if SECRET in str(e) or SECRET in repr(e)]


def test_credentials_are_never_config_fields(tmp_path, kms):
    endpoint, kms_key = kms
    with pytest.raises(ConfigError, match="does not take aws_secret_access_key"):
        _ring(tmp_path, endpoint, kms_key, extra=f'aws_secret_access_key = "{SECRET}"\n')


def test_an_endpoint_holding_credentials_is_refused_without_quoting_it(tmp_path, kms):
    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    with pytest.raises(ConfigError, match="endpoint may not hold credentials") as info:
        _ring(tmp_path, endpoint.replace("http://", f"http://AKIDTESTING:{SECRET}@"), kms_key)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


def test_a_database_whose_key_is_wrapped_by_kms(tmp_path, kms):
    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    cfg = write(tmp_path, "[keyring]\n" + _entry(endpoint, kms_key) + SECURE_STORE)
    assert_a_database_round_trips(tmp_path, cfg, rows=500, key_id=6)


def test_kms_stopped_mid_operation_fails_after_retries_and_recovers(tmp_path, kms, clock):
    """moto's server is stopped after the key was unwrapped; once the unwrapped key expires
    the next unwrap retries, gives up with a clear transient error, and works again once a
    server answers on the endpoint."""
    from moto.server import ThreadedMotoServer

    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    key = _ring(tmp_path, endpoint, kms_key, extra="kek_seconds = 60\ncache_entries = 0\n"
                "retries = 2\nretry_seconds = 0.05\n").current_key()
    blob = key.wrap(b"k" * 32, b"x" * 48)
    port = int(endpoint.rsplit(":", 1)[1])
    RUNNING[0].stop()  # the fixture's server (its stop() at teardown is then a no-op)
    assert key.unwrap(blob, b"x" * 48) == b"k" * 32  # the unwrapped key is still held
    clock[0] += 60
    with pytest.raises(KeyProviderError, match="gave up after 3 attempts") as info:
        key.unwrap(blob, b"x" * 48)
    assert info.value.transient and SECRET not in str(info.value)
    again = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    again.start()
    try:
        assert key.unwrap(blob, b"x" * 48) == b"k" * 32
    finally:
        again.stop()
        key.close()


def test_promote_while_kms_is_down_says_nothing_was_rewrapped_and_resumes(tmp_path, kms):
    """A promote whose keyring cannot load (KMS unreachable) says no file was rewrapped and
    that the same command resumes; with KMS back, it does."""
    import subprocess
    import sys

    from moto.server import ThreadedMotoServer

    from cryptdisk.keys import Key, write_key_file

    endpoint, kms_key = kms
    create_aws_kms_wrapped_key(tmp_path / "k6.kms", kms_key, key_id=6, region="us-east-1",
                               endpoint=endpoint)
    write_key_file(tmp_path / "k7.hex", Key.generate(7))
    cfg = write(tmp_path, "[keyring]\ncurrent_key_id = 6\n"
                + _entry(endpoint, kms_key, 6, "retries = 1\nretry_seconds = 0.05\n")
                + '[[keyring.keys]]\nid = 7\nfile = "k7.hex"\n')
    data = tmp_path / "data"
    data.mkdir()
    ring = Keyring.from_config(cfg)
    for i in range(3):
        with cryptdisk.open(data / f"f{i}", "wb", keyring=ring) as f:
            f.write(b"x" * 100)
    ring.close()
    port = int(endpoint.rsplit(":", 1)[1])
    RUNNING[0].stop()
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = dict(os.environ, PYTHONPATH=src)
    argv = [sys.executable, "-m", "cryptdisk", "keys", "promote", "7", "-c", cfg, str(data)]
    down = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert "gave up after 2 attempts" in down.stderr
    assert (f"no file under {data} was rewrapped; key 7 is current in {cfg}: run the same "
            "command again once its keys load") in down.stderr, down.stderr
    assert SECRET not in down.stdout + down.stderr
    ids = {Header.parse((data / f"f{i}").read_bytes()[:128]).key_id for i in range(3)}
    assert ids == {6}
    again = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    again.start()
    try:
        up = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    finally:
        again.stop()
    assert up.returncode == 0, up.stderr
    assert "rewrapped 3 file(s) under key 7" in up.stdout
    ids = {Header.parse((data / f"f{i}").read_bytes()[:128]).key_id for i in range(3)}
    assert ids == {7}


def test_a_missing_directory_is_named_before_kms_is_asked(tmp_path, kms, monkeypatch):
    endpoint, kms_key = kms
    target = tmp_path / "keys" / "k6.kms"
    calls: list[str] = []
    monkeypatch.setattr("cryptdisk.keys.providers._aws_kms._client",
                        lambda *a: calls.append("client"))
    with pytest.raises(KeyFileError) as err:
        create_aws_kms_wrapped_key(target, kms_key, key_id=6, region="us-east-1",
                                   endpoint=endpoint)
    assert str(err.value) == (f"cannot write the wrapped key file {target}: the directory "
                              f"{tmp_path / 'keys'} does not exist")
    assert "mkdir -m 700" in (err.value.hint or "")
    assert calls == [] and not (tmp_path / "keys").exists()


def test_the_docs_example_runs_as_written(tmp_path, kms, monkeypatch):
    """docs/keys.md's snippet, against moto's KMS (boto3 finds it by AWS_ENDPOINT_URL)."""
    from ...test_readme import readme_blocks

    endpoint, _ = kms
    client = boto3.client("kms", endpoint_url=endpoint, region_name="eu-central-1")
    made = client.create_key(KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["KeyId"]
    client.create_alias(AliasName="alias/cryptdisk", TargetKeyId=made)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.chdir(tmp_path)
    docs = Path(__file__).resolve().parents[3] / "docs" / "keys.md"
    (block,) = [b for b in readme_blocks(docs.read_text())
                if b.language == "python" and "create_aws_kms_wrapped_key(" in b.code]
    exec(compile(block.code, f"docs/keys.md:{block.line}", "exec"), {})
    assert oct((tmp_path / "keys").stat().st_mode & 0o777) == "0o700"
    entry = ('[[keyring.keys]]\nid = 6\nsource = "aws-kms"\nkms_key = "alias/cryptdisk"\n'
             'wrapped_key = "keys/k6.kms"\nregion = "eu-central-1"\n')
    ring = Keyring.from_config(write(tmp_path, "[keyring]\n" + entry))
    with cryptdisk.open(tmp_path / "f.cdk", "wb", keyring=ring) as f:
        f.write(b"under the alias")
    with cryptdisk.open(tmp_path / "f.cdk", "rb", keyring=ring) as f:
        assert f.read() == b"under the alias"
    ring.close()
