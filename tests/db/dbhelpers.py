"""Helpers shared by the database tests (a unique module name, unlike ``conftest``)."""

import os
import subprocess
import sys

from cryptdisk.format import HEADER_SIZE
from cryptdisk.keys import Key, write_key_file

SCHEMA = "(c_int BIGINT, c_str VARCHAR, c_float DOUBLE)"


def gen(n: int, start: int = 0) -> str:
    return f"SELECT i::BIGINT, md5(i::VARCHAR), i / 7 FROM range({start}, {start + n}) r(i)"


def write_config(tmp_path, key_ids, current, name="c.toml", plain=True):
    """A TOML config with key files k<ID>.hex (created once) and disks/policies."""
    lines = ["[keyring]", f"current_key_id = {current}"]
    for kid in key_ids:
        kf = tmp_path / f"k{kid}.hex"
        if not kf.exists():
            write_key_file(kf, Key.generate(kid))
        lines += ["[[keyring.keys]]", f"id = {kid}", f'file = "k{kid}.hex"']
    lines += ["[disks.secure_local]", 'type = "local"', 'path = "store/secure"',
              "[disks.secure]", 'type = "encrypted"', 'disk = "secure_local"',
              "[disks.open]", 'type = "local"', 'path = "store/open"',
              "[policies.default]", 'volumes = [{ name = "main", disks = ["secure"] }]']
    if plain:
        lines += ["[policies.plain]", 'volumes = [{ name = "main", disks = ["open"] }]']
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def flip_segment_byte(path, index: int, segment: int) -> None:
    """Change one byte of sealed file ``path``'s segment ``index`` (segments of
    ``segment`` plaintext bytes, each followed by its 16-byte tag)."""
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + index * (segment + 16) + 9] ^= 1
    path.write_bytes(bytes(data))


def run_cli(*args):
    """``python -m cryptdisk ARGS`` of this checkout's source, in a child process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "src"),
         os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=120)
