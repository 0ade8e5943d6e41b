"""Loading configs: disks, keys and policies, and errors that name the file and line."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from cryptdisk.config import load_config
from cryptdisk.disks import EncryptedDisk, FsspecDisk, LocalDisk
from cryptdisk.errors import (
    ConfigError,
    InvalidKeyError,
    KeyringError,
    MissingEnvironmentVariableError,
    PolicyError,
)

K1 = "11" * 32
K2 = "22" * 32

FULL = f"""
[keyring]
current_key_id = 2
[[keyring.keys]]
id = 1
hex = "{K1}"
[[keyring.keys]]
id = 2
hex = "{K2}"

[disks.raw]
type = "local"
path = "raw"

[disks.mem]
type = "fsspec"
url = "memory://cfgtest"

[disks.secure]
type = "encrypted"
disk = "raw"
path = "enc/"
keys = [1, 2]

[disks.own]
type = "encrypted"
disk = "mem"
current_key_id = 5
segment_size = 4096
[[disks.own.keys]]
id = 5
from_env = "CD_TEST_KEY5"
[[disks.own.keys]]
id = 6
hex = "{"33" * 16}"

[policies.tiered]
[[policies.tiered.volumes]]
name = "hot"
disks = ["secure", "own"]
[[policies.tiered.volumes]]
name = "cold"
disks = ["raw"]
"""


def write(tmp_path: Path, text: str, name: str = "c.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_full_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CD_TEST_KEY5", "44" * 32)
    cfg = load_config(write(tmp_path, FULL))
    assert set(cfg.disks) == {"raw", "mem", "secure", "own", "default"}
    raw, secure, own = cfg.disks["raw"], cfg.disks["secure"], cfg.disks["own"]
    assert isinstance(raw, LocalDisk) and raw.root == str(tmp_path / "raw")
    assert isinstance(cfg.disks["mem"], FsspecDisk)
    assert isinstance(secure, EncryptedDisk) and secure.inner is raw
    assert secure.keyring.current_key_id == 2 and secure.keyring.ids == [1, 2]
    assert isinstance(own, EncryptedDisk) and own.keyring.current_key_id == 5
    assert own.segment_size == 4096
    assert cfg.keyring is not None and cfg.keyring.ids == [1, 2]
    # Files go where the policy says: first volume, round robin.
    tiered = cfg.policy("tiered")
    assert [tiered.choose_disk().name for _ in range(4)] == ["secure", "own", "secure", "own"]
    assert [v.name for v in tiered.volumes] == ["hot", "cold"]
    assert cfg.policy("default").choose_disk() is cfg.disks["default"]
    secure.write_bytes("t/x", b"hello")
    assert (tmp_path / "raw" / "enc" / "t" / "x").read_bytes()[:8] == b"CRYPTDSK"
    with pytest.raises(PolicyError, match="no storage policy named 'nope'"):
        cfg.policy("nope")
    with pytest.raises(TypeError):
        pickle.dumps(cfg)


def test_default_disk_and_policy(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[disks.a]\ntype = 'local'\npath = '/tmp/a'\n"))
    default = cfg.disks["default"]
    assert isinstance(default, LocalDisk) and default.root == str(tmp_path / "data")
    assert not (tmp_path / "data").exists()  # created on first write only
    assert cfg.keyring is None
    assert cfg.policies["default"].volumes[0].disks == [default]


@pytest.mark.parametrize(("text", "error", "message", "line"), [
    ("[disks.e]\ntype = 'encrypted'\ndisk = 'nowhere'\nkeys = [{id = 1, hex = '" + K1 + "'}]\n",
     ConfigError, "unknown disk 'nowhere'", "line 1"),
    ("[disks.a]\ntype = 'ftp'\n", ConfigError, "unknown type 'ftp'", "line 1"),
    ("\n\n[disks.a]\ntype = 'local'\npath = 'x'\ncolour = 'red'\n", ConfigError,
     "unknown setting(s) colour", "line 3"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "[[disks.e.keys]]\nid=1\nhex='" + K1 + "'\n[[disks.e.keys]]\nid=1\nhex='" + K2 + "'\n",
     ConfigError, "duplicate key id 1", "line 10"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "[[disks.e.keys]]\nid=1\nhex='abcd'\n", InvalidKeyError, "4 hex digits", "line 7"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "[[disks.e.keys]]\nid=1\nfrom_env='CD_TEST_UNSET_VAR'\n",
     MissingEnvironmentVariableError, "CD_TEST_UNSET_VAR is not set", "line 7"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = '" + K1 + "'\n[[keyring.keys]]\nid = 1\n"
     "hex = '" + K2 + "'\n", ConfigError, "duplicate key id 1", "line 5"),
    ("[disks.a]\ntype='local'\npath='x'\n[policies.p]\n[[policies.p.volumes]]\nname='v'\n"
     "disks=['a', 'ghost']\n", ConfigError, "unknown disk 'ghost'", "line 5"),
    ("[disks.a]\ntype='fsspec'\nurl='memory://x'\nstorage_options={secret_access_key='s'}\n",
     ConfigError, "looks like a credential", "line 1"),
    ("[disks.a]\ntype='encrypted'\ndisk='b'\nkeys=[{id=1,hex='" + K1 + "'}]\n"
     "[disks.b]\ntype='encrypted'\ndisk='a'\nkeys=[{id=1,hex='" + K1 + "'}]\n",
     ConfigError, "wraps itself", "line"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\nkeys=[3]\n",
     ConfigError, "no keys|key id 3", "line 4"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "segment_size=1000\nkeys=[{id=1,hex='" + K1 + "'}]\n", ConfigError, "power of two",
     "line 4"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = 'abcd'\n", InvalidKeyError, "4 hex digits",
     "line 2"),
    ("[extra]\nx=1\n", ConfigError, "unknown section", "top level"),
    ("not toml [", ConfigError, "not valid TOML", ""),
    # a key typed where a variable's name or a key id belongs is not quoted back
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "[[disks.e.keys]]\nid=1\nfrom_env='" + K1 + "'\n",
     MissingEnvironmentVariableError, "from_env takes the NAME of an environment variable",
     "line 7"),
    ("[disks.a]\ntype='local'\npath='x'\n[disks.e]\ntype='encrypted'\ndisk='a'\n"
     "current_key_id='" + K1 + "'\nkeys=[{id=1,hex='" + K1 + "'}]\n",
     ConfigError, "current_key_id = a string of 64 characters (not shown)", "line 4"),
    ("[keyring]\ncurrent_key_id = '" + K1 + "'\n[[keyring.keys]]\nid = 1\nhex = '" + K1
     + "'\n", ConfigError, "current_key_id = a string of 64 characters (not shown)",
     "[keyring]"),
])
def test_errors_name_file_and_line(tmp_path: Path, text: str, error: type[Exception],
                                   message: str, line: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(error) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.count(path) == 1, msg  # located once, not once per layer it passed
    assert line in msg
    import re

    assert re.search(message.replace("(", r"\(").replace(")", r"\)"), msg), msg
    assert K1 not in msg and K2 not in msg


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_clickhouse_disk_keys_accept_clickhouse_sizes(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[disks.a]\ntype='local'\npath='x'\n[disks.ch]\n"
                            "type='clickhouse'\ndisk='a'\nalgorithm='AES_192_CTR'\n"
                            "current_key_id=3\n[[disks.ch.keys]]\nid=3\nhex='" + "ab" * 24
                            + "'\n[[disks.ch.keys]]\nid=4\nraw='0123456789abcdef'\n"))
    ch = cfg.disks["ch"]
    assert ch.is_encrypted and ch.type == "clickhouse"
    assert sorted(k.key_id for k in cfg.clickhouse_keys()) == [3, 4]


def test_keyring_errors_are_keyring_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "[keyring]\ncurrent_key_id = 9\n[[keyring.keys]]\nid = 1\nhex = '"
                 + K1 + "'\n")
    with pytest.raises((ConfigError, KeyringError), match="current_key_id"):
        load_config(path)


XML = """<clickhouse><storage_configuration>
  <disks>
    <raw><type>local</type><path>{root}/</path></raw>
    <enc><type>encrypted</type><disk>{inner}</disk><path>enc/</path>
         <key_hex id="3" from_env="CD_TEST_CH_KEY"/><key id="4">0123456789abcdef</key>
         <current_key_id>3</current_key_id><algorithm>aes_128_ctr</algorithm></enc>
  </disks>
  <policies><p><volumes><v1><disk>enc</disk></v1><v2><disk>raw</disk></v2></volumes></p>
  </policies>
</storage_configuration></clickhouse>
"""


@pytest.mark.parametrize("name", ["storage.xml", "storage.conf"])
def test_clickhouse_xml_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               name: str) -> None:
    monkeypatch.setenv("CD_TEST_CH_KEY", "00112233445566778899aabbccddeeff")
    path = write(tmp_path, XML.format(root=tmp_path / "d", inner="raw"), name)
    cfg = load_config(path)  # by extension, or by content starting with '<'
    enc = cfg.disks["enc"]
    assert enc.type == "clickhouse" and enc.path == f"{tmp_path}/d/enc/"
    assert sorted(k.key_id for k in cfg.clickhouse_keys()) == [3, 4]
    assert [v.name for v in cfg.policy("p").volumes] == ["v1", "v2"]
    enc.write_bytes("f.bin", b"through ClickHouse's format")
    assert (tmp_path / "d" / "enc" / "f.bin").read_bytes()[:3] == b"ENC"
    assert enc.read_bytes("f.bin") == b"through ClickHouse's format"


def test_clickhouse_xml_errors_name_the_element(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CD_TEST_CH_KEY", "00112233445566778899aabbccddeeff")
    path = write(tmp_path, XML.format(root=tmp_path, inner="ghost"), "s.xml")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert path in str(info.value) and "<enc>" in str(info.value)
    assert "unknown disk 'ghost'" in str(info.value)
    monkeypatch.delenv("CD_TEST_CH_KEY")
    with pytest.raises((ConfigError, MissingEnvironmentVariableError), match="CD_TEST_CH_KEY"):
        load_config(write(tmp_path, XML.format(root=tmp_path, inner="raw"), "s2.xml"))
    # the key itself where its variable's name belongs: refused without quoting it
    text = XML.format(root=tmp_path, inner="raw").replace('"CD_TEST_CH_KEY"', f'"{K1}"')
    assert K1 in text
    with pytest.raises(MissingEnvironmentVariableError) as missing:
        load_config(write(tmp_path, text, "s3.xml"))
    said = f"{missing.value}\n{missing.value.hint}\n{missing.value.variable}"
    assert "not a variable name" in said and K1 not in said


def test_disk_types_build_themselves_from_the_config(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """load_config dispatches each [disks.NAME] through DISK_TYPES to the type's from_config;
    a new type (here a local disk under another name) needs no change to the loader."""
    from cryptdisk.disks import DISK_TYPES

    class Scratch(LocalDisk):
        type = "scratch"
        config_settings = frozenset({"type", "dir"})

        @classmethod
        def from_config(cls, name, spec, where, config):
            return cls(name, Path(config.base) / config.string(spec, "dir", where))

    monkeypatch.setitem(DISK_TYPES, "scratch", Scratch)
    cfg = load_config(write(tmp_path, "[disks.s]\ntype = 'scratch'\ndir = 'here'\n"
                                      "[disks.e]\ntype='encrypted'\ndisk='s'\n"
                                      "keys=[{id=1,hex='" + K1 + "'}]\n"))
    assert isinstance(cfg.disks["s"], Scratch) and cfg.disks["s"].root == str(tmp_path / "here")
    assert cfg.disks["e"].inner is cfg.disks["s"]
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) path for a scratch disk"):
        load_config(write(tmp_path, "[disks.s]\ntype = 'scratch'\npath = 'x'\n"))
    with pytest.raises(ConfigError, match="missing setting 'dir'"):
        load_config(write(tmp_path, "[disks.s]\ntype = 'scratch'\n"))
