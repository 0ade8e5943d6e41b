"""``cryptdisk demo --files``: the file format on its own. Encrypt a dataset, inspect it,
read it back at random offsets, show that the bytes on disk are ciphertext, catch
tampering, and rotate the key."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
from typing import Any

from .. import open as cd_open
from ..errors import AuthenticationError, CryptdiskError
from ..format import Algorithm
from ..keys import Key, Keyring, rewrap_tree

__all__ = ["run_file_demo"]


def _dataset(rows: int) -> bytes:
    """CSV rows of the OLAP experiment: c_int, c_str (md5 hex of n), c_float."""
    out = ["c_int,c_str,c_float\n"]
    for n in range(rows):
        digest = hashlib.md5(str(n).encode(), usedforsecurity=False).hexdigest()
        h = int(digest[:16], 16) - (1 << 63)
        out.append(f"{h},{digest},{n / (h or 1) * 1e7:.6f}\n")
    return "".join(out).encode()


def _hexdump(data: bytes, width: int = 16) -> str:
    rows = []
    for i in range(0, len(data), width):
        chunk = data[i : i + width]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"    {i:08x}  {chunk.hex(' '):<{width * 3}} {text}")
    return "\n".join(rows)


#: the file that marks a --dir as the demo's own: only there does it replace what it made
DEMO_MARKER = ".cryptdisk-demo"


def claim_workdir(workdir: str, names: tuple[str, ...]) -> None:
    """Make ``workdir`` the demo's: the files ``names`` it writes there may be replaced only
    when an earlier demo made them (its marker is there); anyone else's file of such a name
    (a database called ``demo.db``, with its key) is refused, never deleted."""
    os.makedirs(workdir, exist_ok=True)
    marker = os.path.join(workdir, DEMO_MARKER)
    if not os.path.exists(marker):
        taken = [n for n in names if os.path.lexists(os.path.join(workdir, n))]
        if taken:
            raise CryptdiskError(
                f"{os.path.join(workdir, taken[0])} exists and was not made by cryptdisk "
                "demo; refusing to replace it", hint="give --dir a new or empty directory")
        with open(marker, "w") as f:
            f.write("made by cryptdisk demo, which replaces its own files here when it runs "
                    "again\n")


def run_file_demo(rows: int, directory: str | None = None) -> int:
    from rich.console import Console

    con = Console(highlight=False)
    workdir = directory or tempfile.mkdtemp(prefix="cryptdisk-demo-")
    claim_workdir(workdir, ("dataset.csv", "dataset.csv.cd", "tampered.cd"))
    try:
        _run(con, workdir, rows)
    finally:
        if not directory:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _run(con: Any, workdir: str, rows: int) -> None:
    con.rule("[bold]cryptdisk demo: authenticated encryption at rest")
    old = Key.generate(1)
    keyring = Keyring([old])
    con.print(f"1. A keyring with one key: {keyring!r}, {old!r} (repr shows no key material)")

    data = _dataset(rows)
    plain_path = os.path.join(workdir, "dataset.csv")
    enc_path = os.path.join(workdir, "dataset.csv.cd")
    with open(plain_path, "wb") as f:
        f.write(data)
    t0 = time.perf_counter()
    with cd_open(enc_path, "wb", keyring=keyring) as f:
        f.write(data)
    t_enc = time.perf_counter() - t0
    size = os.path.getsize(enc_path)
    con.print(f"2. Encrypted {rows:,} rows ({len(data) / 1e6:.1f} MB) in {t_enc * 1e3:.1f} ms "
              f"-> {size:,} bytes on disk (+{size - len(data):,}: 128-byte header and a 16-byte "
              "tag per 64 KiB segment)")

    from ..disks import describe

    info = describe(enc_path)
    con.print("3. [bold]cryptdisk inspect[/]: " + ", ".join(
        f"{k}={info[k]}" for k in ("format", "kind", "algorithm", "key_id", "segment_size",
                                   "plaintext_size")))

    rng = random.Random(7)
    t0 = time.perf_counter()
    checks = 200
    with cd_open(enc_path, "rb", keyring=keyring) as f:
        for _ in range(checks):
            off = rng.randrange(len(data))
            n = rng.randrange(1, 4096)
            f.seek(off)
            assert f.read(n) == data[off : off + n]
    t_rand = (time.perf_counter() - t0) / checks
    con.print(f"4. {checks} random reads at random offsets matched the plaintext "
              f"({t_rand * 1e6:.0f} us each; a read decrypts only the segments it touches)")

    with open(enc_path, "rb") as f:
        head = f.read(HEAD_BYTES)
    con.print("5. Bytes on disk: the plaintext starts with 'c_int,c_str,c_float'; the file is:")
    con.print(_hexdump(head), markup=False)
    found = data[:20] in open(enc_path, "rb").read()
    con.print(f"   plaintext found in the encrypted file: {found}")

    tampered = os.path.join(workdir, "tampered.cd")
    raw = bytearray(open(enc_path, "rb").read())
    raw[len(raw) // 2] ^= 0x01
    with open(tampered, "wb") as f:
        f.write(raw)
    try:
        with cd_open(tampered, "rb", keyring=keyring) as f:
            f.verify()
        con.print("6. [red]tampering was NOT detected[/]")
    except AuthenticationError as exc:
        con.print(f"6. Flipped one bit in a copy -> [bold]{type(exc).__name__}[/]: {exc}")

    new = Key.generate(2, Algorithm.AES_256_GCM)
    rotated = Keyring([old, new], current_key_id=2)
    t0 = time.perf_counter()
    summary = rewrap_tree([enc_path], rotated)
    t_rot = time.perf_counter() - t0
    with cd_open(enc_path, "rb", keyring=Keyring([new])) as f:
        ok = f.read() == data
    con.print(f"7. Rotated to key 2 by rewrapping {summary.rewrapped} header in "
              f"{t_rot * 1e3:.2f} ms (no data rewritten); readable with only the new key: {ok}")
    con.rule("done")


HEAD_BYTES = 160
