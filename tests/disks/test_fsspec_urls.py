"""No credential in a URL or in storage_options: refused, never masked (docs/disks.md,
Credentials and URLs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryptdisk.disks import FsspecDisk, check_url
from cryptdisk.errors import ConfigError

SECRET = "s3cr3t-do-not-leak"


@pytest.mark.parametrize("url", [
    f"memory://user:{SECRET}@x/y", f"ftp://user:{SECRET}@host/dir", f"s3://{SECRET}@bucket/p",
    f"https://host/d?X-Amz-Signature={SECRET}", f"https://host/d?sv=1&sig={SECRET}",
    f"https://host/d?access_token={SECRET}#frag"])
def test_fsspec_disk_refuses_credentials_in_its_url_without_quoting_them(url: str) -> None:
    with pytest.raises(ConfigError, match="may not hold credentials") as info:
        FsspecDisk("m", url)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert "environment" in (info.value.hint or "")


@pytest.mark.parametrize("options", [
    {"endpoint_url": f"http://AKID:{SECRET}@127.0.0.1:9000"},
    {"client_kwargs": {"endpoint_url": f"http://AKID:{SECRET}@127.0.0.1:9000"}},
    {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}},
    {"mirrors": ["http://a.example/", f"http://u:{SECRET}@b.example/"]},
    {"token": SECRET},
    # adlfs: an Azure Storage connection string holds the account key or a SAS
    {"connection_string": "DefaultEndpointsProtocol=https;AccountName=a;"
                          f"AccountKey={SECRET};EndpointSuffix=core.windows.net"},
    {"client_kwargs": {"conn": f"BlobEndpoint=https://a.example/;SharedAccessSignature={SECRET}"}},
])
def test_fsspec_disk_refuses_credentials_in_storage_options(options: dict) -> None:
    with pytest.raises(ConfigError) as info:
        FsspecDisk("m", "memory://x/y", options)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


def test_plain_urls_and_options_are_taken_and_shown_as_they_are() -> None:
    check_url("https://host/d?versionId=3&region=eu")
    check_url("/a@b/c")  # a local path
    disk = FsspecDisk("m", "memory://x/y", {"endpoint_url": "http://127.0.0.1:9000",
                                            "config_kwargs": {"signature_version": "s3v4"}})
    assert disk.path == "memory://x/y/" and "memory://x/y" in repr(disk)


def test_a_config_with_credentials_in_a_disk_url_fails_naming_the_line_not_the_secret(
        tmp_path: Path) -> None:
    from cryptdisk.config import load_config

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[disks.s3]\ntype = "fsspec"\nurl = "memory://AKID:{SECRET}@b/p"\n')
    with pytest.raises(ConfigError, match="may not hold credentials") as info:
        load_config(cfg)
    assert SECRET not in str(info.value) and "c.toml" in str(info.value)


def test_a_file_url_disk_makes_its_directories_0700_and_files_0600_as_a_local_disk(
        tmp_path: Path) -> None:
    """An fsspec file:// disk made its directories with fsspec's makedirs and its files with
    a copy, both under the process umask (0755 and 0644 under umask 022: the names and
    sizes of an encrypted disk's files readable by everyone), where a local disk makes
    them 0700 and 0600. Now both disks leave the same modes, writes and renames alike."""
    import os

    from cryptdisk.disks import LocalDisk

    old = os.umask(0o022)
    try:
        disks = {"fsspec": FsspecDisk("f", (tmp_path / "f" / "root").as_uri()),
                 "local": LocalDisk("l", str(tmp_path / "l" / "root"))}
        for disk in disks.values():
            with disk.open_write("a/b/c.bin") as f:
                f.write(b"payload")
            disk.rename("a/b/c.bin", "d/e/c.bin")
    finally:
        os.umask(old)
    modes = {}
    for kind in disks:
        top = tmp_path / kind[0]
        modes[kind] = {str(p.relative_to(top)): oct(p.stat().st_mode & 0o777)
                       for p in sorted(top.rglob("*"))}
    assert modes["fsspec"] == modes["local"]
    assert modes["fsspec"] == {"root": "0o700", "root/a": "0o700", "root/a/b": "0o700",
                               "root/d": "0o700", "root/d/e": "0o700",
                               "root/d/e/c.bin": "0o600"}
    with disks["fsspec"].open_read("d/e/c.bin") as f:
        assert f.read() == b"payload"
