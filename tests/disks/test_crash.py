"""A process killed (SIGKILL) while writing through a disk leaves the old file or none.

The child rewrites one file over and over, each version a different, self-
checking content, and reports its progress: after each block it writes (then it
waits for the parent's go-ahead), before it publishes a version and after. The
parent kills it at chosen reports (mid-write, mid-publish, just after) and checks
that what remains is one whole version, and that no temporary file is listed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.disks import Disk, EncryptedDisk, FsspecDisk, LocalDisk

from .conftest import BUCKET

#: The source tree of the cryptdisk being tested, for child processes.
SRC_ROOT = str(Path(cryptdisk.__file__).resolve().parents[1])
KEY_HEX = "5a" * 32
SIZE = 3_000_000  # bytes per version

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from cryptdisk import Key, Keyring
from cryptdisk.disks import EncryptedDisk, FsspecDisk, LocalDisk
spec = json.loads(sys.argv[2])
if spec["kind"] == "s3":
    disk = FsspecDisk("s3", spec["url"], {"endpoint_url": spec["endpoint"]})
else:
    disk = LocalDisk("raw", spec["root"])
if spec["encrypted"]:
    disk = EncryptedDisk("e", disk, Keyring([Key(1, bytes.fromhex(spec["key"]))]),
                         segment_size=4096)
version = 1


def report(line, wait=True):
    print(line, flush=True)
    if wait:
        sys.stdin.readline()  # the parent's go-ahead (or SIGKILL)


while True:
    block = version.to_bytes(4, "little") * 16384   # 64 KiB of the version number
    with disk.open_write("f") as f:
        for i in range(spec["size"] // len(block)):
            f.write(block)
            report(f"block {version} {i}")
        report(f"publishing {version}", wait=False)  # close() publishes: killed in it, or after
    report(f"published {version}")
    version += 1
"""


def make(kind: str, encrypted: bool, tmp: Path, endpoint: str | None) -> tuple[Disk, dict]:
    spec: dict = {"kind": kind, "encrypted": encrypted, "key": KEY_HEX, "size": SIZE}
    if kind == "s3":
        spec.update(url=f"s3://{BUCKET}/crash-{tmp.name}", endpoint=endpoint)
        disk: Disk = FsspecDisk("s3", spec["url"], {"endpoint_url": endpoint})
    else:
        spec["root"] = str(tmp / "root")
        disk = LocalDisk("raw", spec["root"])
    if encrypted:
        disk = EncryptedDisk("e", disk, Keyring([Key(1, bytes.fromhex(KEY_HEX))]),
                             segment_size=4096)
    return disk, spec


def check_whole(disk: Disk) -> int:
    """The file is one whole version (or absent); returns the version (0 if absent)."""
    if not disk.exists("f"):
        return 0
    data = disk.read_bytes("f")
    assert len(data) == SIZE - SIZE % 65536, f"partial file: {len(data)} bytes"
    version = data[:4]
    assert data == version * (len(data) // 4), "mixed versions in one file"
    return int.from_bytes(version, "little")


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "encrypted"), [("local", False), ("local", True),
                                                 ("s3", True)])
def test_sigkill_leaves_old_or_new_never_partial(kind: str, encrypted: bool, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    endpoint = request.getfixturevalue("s3_endpoint") if kind == "s3" else None
    disk, spec = make(kind, encrypted, tmp_path, endpoint)
    env = {**os.environ}
    seen_versions = []
    stray = 0
    # SIZE // 64 KiB = 45 blocks a version: mid-write (first, middle, last block),
    # mid-publish (close: flush, fsync, rename or upload), after it, in the next version.
    for stop in ["block 1 0", "block 1 20", "block 1 44", "publishing 1", "published 1",
                 "block 2 10"]:
        child = subprocess.Popen([sys.executable, "-c", CHILD, SRC_ROOT, json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                 text=True)
        assert child.stdout is not None and child.stdin is not None
        try:
            for line in child.stdout:
                if line.strip() == stop:
                    break
                if not line.startswith("publishing"):
                    child.stdin.write("\n")
                    child.stdin.flush()
            else:
                raise AssertionError(f"the child ended before reporting {stop!r}")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            child.stdin.close()
        assert child.returncode == -signal.SIGKILL
        seen_versions.append(check_whole(disk))
        assert disk.list() in ([], ["f"]), disk.list()
        if kind == "local":
            stray += len(list((tmp_path / "root").glob(".f.*.cdtmp")))
    print("versions left after each kill:", seen_versions, "stray temps:", stray)
    # The kills landed at different moments; at least one left a published file.
    assert any(seen_versions), seen_versions
    if kind == "local":
        assert stray > 0, "no kill landed mid-write; the test proved nothing"
        root = LocalDisk("raw", tmp_path / "root")
        assert root.remove_stale_temps(max_age=3600) == 0  # young: may still be written
        assert root.remove_stale_temps(max_age=-1) > 0
        assert not list((tmp_path / "root").glob(".f.*.cdtmp"))
