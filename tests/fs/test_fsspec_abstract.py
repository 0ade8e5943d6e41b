"""fsspec's own conformance suite (``fsspec.tests.abstract``) over ``cryptdisk://``.

Run as s3fs and fsspec's local filesystem run it: the fixtures name the
filesystem, a scratch directory on it and how paths join; fsspec's classes
bring the tests (copy, get, put, open, pipe). The filesystem is an encrypted
disk over a local directory, and an encrypted disk over S3 (moto's server).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fsspec.tests import abstract

from cryptdisk.fs import CryptdiskFileSystem

from ..disks.s3server import make_bucket, s3_server
from .conftest import KEY_HEX

BUCKET = "cryptdisk-fs-abstract"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        yield endpoint


def _config(tmp: Path, inner: str) -> str:
    path = tmp / "cryptdisk.toml"
    path.write_text(f"""
[keyring]
[[keyring.keys]]
id = 1
hex = "{KEY_HEX}"

{inner}

[disks.secure]
type = "encrypted"
disk = "raw"
path = "enc/"
segment_size = 4096
""")
    return str(path)


def _local_config(tmp: Path, _s3: Callable[[], str]) -> str:
    return _config(tmp, '[disks.raw]\ntype = "local"\npath = "raw"')


def _s3_config(tmp: Path, s3: Callable[[], str]) -> str:
    return _config(tmp, f"""[disks.raw]
type = "fsspec"
url = "s3://{BUCKET}/{uuid.uuid4().hex}"
storage_options = {{ endpoint_url = "{s3()}" }}""")


CONFIGS = {"encrypted-local": _local_config, "encrypted-s3": _s3_config}


class CryptdiskFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    """``fs`` is ``cryptdisk://`` with an encrypted disk ``secure``; scratch space below it."""

    @pytest.fixture(params=sorted(CONFIGS))
    def fs(self, request: pytest.FixtureRequest, tmp_path: Path) -> CryptdiskFileSystem:
        config = CONFIGS[request.param](
            tmp_path, lambda: str(request.getfixturevalue("s3_endpoint")))
        return CryptdiskFileSystem(config=config, skip_instance_cache=True)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self) -> str:
        return "secure/scratch"

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        # Directories are implicit, as in object stores: one exists while it holds a file.
        return False


class TestCryptdiskCopy(abstract.AbstractCopyTests, CryptdiskFixtures):  # type: ignore[misc]
    pass


class TestCryptdiskGet(abstract.AbstractGetTests, CryptdiskFixtures):  # type: ignore[misc]
    pass


class TestCryptdiskPut(abstract.AbstractPutTests, CryptdiskFixtures):  # type: ignore[misc]
    pass


class TestCryptdiskOpen(abstract.AbstractOpenTests, CryptdiskFixtures):  # type: ignore[misc]
    pass


class TestCryptdiskPipe(abstract.AbstractPipeTests, CryptdiskFixtures):  # type: ignore[misc]
    pass
