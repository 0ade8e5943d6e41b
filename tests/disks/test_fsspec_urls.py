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
    {"token": SECRET}])
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
