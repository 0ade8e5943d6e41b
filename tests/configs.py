"""Config text the tests of several packages share."""

from __future__ import annotations


def encrypted_over_local(key_hex: str, secure: str = "", rest: str = "", *,
                         current_key_id: bool = False) -> str:
    """TOML: a keyring of key 1 (``key_hex``), disk ``raw`` (local, ``raw``) and disk
    ``secure`` (encrypted over raw in ``enc/``, plus the ``secure`` lines), then ``rest``."""
    return f"""
[keyring]
{"current_key_id = 1" if current_key_id else ""}
[[keyring.keys]]
id = 1
hex = "{key_hex}"

[disks.raw]
type = "local"
path = "raw"

[disks.secure]
type = "encrypted"
disk = "raw"
path = "enc/"
{secure}
{rest}"""
