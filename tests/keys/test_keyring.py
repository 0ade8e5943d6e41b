"""Keys, key sources and the keyring config: errors, secrecy, rotation lookups."""

from __future__ import annotations

import copy
import os
import pickle
import sys
from pathlib import Path

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.errors import (
    ConfigError,
    InvalidKeyError,
    KeyCommandError,
    KeyFileError,
    KeyFilePermissionError,
    KeyNotFoundError,
    MissingEnvironmentVariableError,
    WrongKeyError,
)
from cryptdisk.keys import key_from_command, key_from_env, key_from_file, write_key_file

HEX = "00112233445566778899aabbccddeeff" * 2


def test_key_never_shows_material():
    key = Key(5, bytes.fromhex(HEX))
    for text in (repr(key), str(key), repr(Keyring([key])), f"{key}"):
        assert HEX[:16] not in text and "0011" not in text
    assert "id=5" in repr(key) and "AES-256-GCM" in repr(key)
    assert not any(not a.startswith("_") and a not in ("source",) and isinstance(
        getattr(key, a), (bytes, bytearray)) and getattr(key, a) == bytes.fromhex(HEX)
        for a in dir(key))


def test_keys_and_keyrings_refuse_pickling():
    key = Key(1, bytes(32))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(Keyring([key]))
    assert copy.deepcopy(key) is key


def test_bytearray_material_is_copied():
    material = bytearray(os.urandom(32))
    key = Key(1, material)
    data = b"x"
    wrapped = key.wrap(data, b"ad")
    material[:] = bytes(32)  # the caller wipes its buffer
    assert key.unwrap(wrapped, b"ad") == data


@pytest.mark.parametrize("size", [0, 15, 17, 24, 31, 33, 64])
def test_bad_key_lengths(size):
    with pytest.raises(InvalidKeyError, match="16 or 32 bytes"):
        Key(1, bytes(size))


def test_bad_key_types_and_ids():
    with pytest.raises(TypeError):
        Key("1", bytes(32))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Key(-1, bytes(32))
    with pytest.raises(ValueError):
        Key(2**64, bytes(32))
    with pytest.raises(TypeError):
        Key(1, "00" * 32)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError, match="needs 32"):
        Key(1, bytes(16), algorithm="aes-256-gcm")


def test_keyring_lookup_and_current():
    k1, k2 = Key(1, os.urandom(32)), Key(2, os.urandom(16))
    ring = Keyring([k1, k2], current_key_id=2)
    assert ring.current_key() is k2 and ring.key_by_id(1) is k1
    with pytest.raises(KeyNotFoundError, match="no key with id 3") as info:
        ring.key_by_id(3)
    assert info.value.key_id == 3
    with pytest.raises(ValueError, match="duplicate"):
        Keyring([k1, Key(1, os.urandom(32))])
    with pytest.raises(KeyNotFoundError):
        Keyring([k1], current_key_id=9)


def test_wrong_key_with_the_right_id_is_told_apart(tmp_path):
    path = tmp_path / "f"
    with cryptdisk.open(path, "wb", keyring=Keyring([Key(1, os.urandom(32))])) as f:
        f.write(b"data")
    with pytest.raises(WrongKeyError, match="not the key this file was encrypted with"):
        cryptdisk.open(path, "rb", keyring=Keyring([Key(1, os.urandom(32))]))
    with pytest.raises(KeyNotFoundError, match="no key with id 1"):
        cryptdisk.open(path, "rb", keyring=Keyring([Key(2, os.urandom(32))]))


def test_key_from_env(monkeypatch):
    monkeypatch.setenv("CD_TEST_KEY", HEX)
    assert key_from_env("CD_TEST_KEY") == bytes.fromhex(HEX)
    monkeypatch.delenv("CD_TEST_KEY")
    with pytest.raises(MissingEnvironmentVariableError, match="CD_TEST_KEY is not set"):
        key_from_env("CD_TEST_KEY")
    monkeypatch.setenv("CD_TEST_KEY", "")
    with pytest.raises(MissingEnvironmentVariableError, match="empty"):
        key_from_env("CD_TEST_KEY")
    monkeypatch.setenv("CD_TEST_KEY", "abc")
    with pytest.raises(InvalidKeyError) as info:
        key_from_env("CD_TEST_KEY")
    assert "abc" not in str(info.value)


@pytest.mark.parametrize("given", [HEX, "0x" + HEX, "correct horse battery staple",
                                   "pass:" + HEX[:20]])
def test_a_key_given_where_a_variable_name_belongs_is_not_echoed(tmp_path, given):
    """``from_env = "<the key itself>"`` (the value where its variable's name belongs) is
    refused without printing it: the error named the 'variable', i.e. showed the key (and
    its hint, an ``export`` line, showed it a second time)."""
    config = tmp_path / "c.toml"
    config.write_text(f"[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n"
                      f"from_env = '{given}'\n")
    config.chmod(0o600)
    with pytest.raises(MissingEnvironmentVariableError) as info:
        Keyring.from_config(str(config))
    said = f"{info.value}\n{info.value.hint}\n{info.value.variable}\n{info.value!r}"
    assert given not in said and HEX[:16] not in said and "horse" not in said
    assert "line 3" in str(info.value) and "not a variable name" in str(info.value)
    if given == HEX:  # the Python API too
        with pytest.raises(MissingEnvironmentVariableError) as info:
            key_from_env(given)
        assert HEX[:16] not in f"{info.value}\n{info.value.hint}"


def test_key_file_round_trip_and_permissions(tmp_path):
    path = tmp_path / "k.hex"
    material = os.urandom(32)
    write_key_file(path, material, key_id=4)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert key_from_file(path) == material
    with pytest.raises(KeyFileError, match="already exists"):
        write_key_file(path, material)
    path.chmod(0o640)
    with pytest.raises(KeyFilePermissionError, match="group or others") as info:
        key_from_file(path)
    assert material.hex() not in str(info.value)
    with pytest.raises(KeyFileError, match="does not exist"):
        key_from_file(tmp_path / "missing")
    bad = tmp_path / "bad.hex"
    bad.write_text("# two keys\n" + HEX + "\n" + HEX + "\n")
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="exactly one line"):
        key_from_file(bad)
    short = tmp_path / "short.hex"
    short.write_text("abcd\n")
    short.chmod(0o600)
    with pytest.raises(InvalidKeyError, match="hex digits"):
        key_from_file(short)


def test_key_from_command():
    assert key_from_command([sys.executable, "-c", f"print('{HEX}')"]) == bytes.fromhex(HEX)
    with pytest.raises(KeyCommandError, match="exited with status 3"):
        key_from_command([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(KeyCommandError, match="not found"):
        key_from_command(["/nonexistent/keytool"])
    with pytest.raises(InvalidKeyError):
        key_from_command([sys.executable, "-c", "print('not-a-key')"])


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cryptdisk.toml"
    path.write_text(body)
    return path


def test_config_all_sources(tmp_path, monkeypatch):
    write_key_file(tmp_path / "k3.hex", os.urandom(32))
    monkeypatch.setenv("CD_K2", os.urandom(16).hex())
    cfg = _config(tmp_path, f"""
[keyring]
current_key_id = 2

[[keyring.keys]]
id = 1
hex = "{HEX}"

[[keyring.keys]]
id = 2
from_env = "CD_K2"

[[keyring.keys]]
id = 3
file = "k3.hex"

[[keyring.keys]]
id = 4
command = ["{sys.executable}", "-c", "print('{HEX}')"]
""")
    ring = Keyring.from_config(cfg)
    assert ring.ids == [1, 2, 3, 4] and ring.current_key_id == 2
    assert ring.current_key().algorithm.label == "AES-128-GCM"
    assert [k.source for k in ring] == ["hex", "env", "file", "command"]


@pytest.mark.parametrize("body, message", [
    ("[keyring]\n", "no keys"),
    ("x = 1\n", "no \\[keyring\\] section"),
    ("[keyring\n", "not valid TOML"),
    ("[keyring]\ncolour = 1\n[[keyring.keys]]\nid = 1\nhex = '" + HEX + "'\n", "unknown setting"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = '" + HEX + "'\n[[keyring.keys]]\nid = 1\nhex = '"
     + HEX + "'\n", "duplicate key id 1"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = 'abcd'\n", "hex digits"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\n", "exactly one of"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = '" + HEX + "'\nfile = 'x'\n", "exactly one of"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nfrom_env = 'CD_UNSET_VAR_XYZ'\n", "not set"),
    ("[keyring]\ncurrent_key_id = 5\n[[keyring.keys]]\nid = 1\nhex = '" + HEX + "'\n",
     "current_key_id = 5"),
    ("[keyring]\n[[keyring.keys]]\nid = 'one'\nhex = '" + HEX + "'\n", "integer id"),
    ("[keyring]\n[[keyring.keys]]\nid = 1\nhex = '" + HEX + "'\nsecret = 2\n", "unknown field"),
])
def test_config_errors_name_the_file_and_place(tmp_path, body, message):
    cfg = _config(tmp_path, body)
    with pytest.raises(Exception, match=message) as info:
        Keyring.from_config(cfg)
    assert str(cfg) in str(info.value)
    assert HEX not in str(info.value)
    assert isinstance(info.value, cryptdisk.CryptdiskError)


def test_config_error_points_at_the_line(tmp_path):
    cfg = _config(tmp_path, "[keyring]\ncurrent_key_id = 1\n\n[[keyring.keys]]\nid = 1\n"
                  f"hex = '{HEX}'\n\n[[keyring.keys]]\nid = 2\nhex = 'zz'\n")
    with pytest.raises(InvalidKeyError, match="line 8"):
        Keyring.from_config(cfg)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Keyring.from_config(tmp_path / "nope.toml")


def test_derive_is_hkdf_sha256_and_separates_purposes():
    import hashlib
    import hmac

    material = bytes(range(32))
    key = Key(1, material)
    # RFC 5869 by hand: no salt means a salt of HashLen zeros.
    prk = hmac.new(b"\0" * 32, material, hashlib.sha256).digest()
    t1 = hmac.new(prk, b"purpose A" + b"\x01", hashlib.sha256).digest()
    t2 = hmac.new(prk, t1 + b"purpose A" + b"\x02", hashlib.sha256).digest()
    assert key.derive(b"purpose A", 64) == t1 + t2
    assert key.derive(b"purpose A", 16) == t1[:16]
    assert key.derive(b"purpose B", 64) != key.derive(b"purpose A", 64)
    assert Key(2, material).derive(b"purpose A") == key.derive(b"purpose A")  # material only
    with pytest.raises(ValueError, match="purpose"):
        key.derive(b"")
    with pytest.raises(ValueError, match="purpose"):
        key.derive("text")  # type: ignore[arg-type]


def test_file_stamp_sees_an_edit_in_place_of_the_same_size_and_time(tmp_path):
    from cryptdisk.keys import file_stamp

    cfg = _config(tmp_path, "[keyring]\ncurrent_key_id = 1\n")
    before = file_stamp(str(cfg))
    st = os.stat(cfg)
    cfg.write_text("[keyring]\ncurrent_key_id = 2\n")  # same inode, same size
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same time: one clock tick
    after = file_stamp(str(cfg))
    assert before is not None and after is not None
    assert before[:3] == after[:3]  # the stat alone cannot tell them apart
    assert before != after
    assert file_stamp(str(cfg)) == after  # unchanged: the same stamp
    old = st.st_mtime_ns - 10**10  # settled (changed 10 s before): read once, then a stat
    os.utime(cfg, ns=(old, old))
    settled = file_stamp(str(cfg))
    assert settled is not None and settled != after and settled[3] == after[3]
    opened = []
    real_open = open

    def counting_open(*args, **kwargs):
        opened.append(args[0])
        return real_open(*args, **kwargs)

    import builtins

    builtins.open = counting_open
    try:
        assert file_stamp(str(cfg)) == settled
    finally:
        builtins.open = real_open
    assert opened == []  # the same stat as when read settled: the same bytes
    assert file_stamp(str(tmp_path / "nope.toml")) is None
    # the digest is keyed: the stamp holds no plain hash of the file's bytes
    import hashlib

    digest = after[3]
    data = cfg.read_bytes()
    assert digest not in (hashlib.sha256(data).digest()[:16],
                          hashlib.blake2b(data, digest_size=16).digest())


def test_following_keyring_sees_an_edit_in_place_of_the_same_size_and_time(tmp_path):
    from cryptdisk.keys import FollowingKeyring

    text = (f"[keyring]\ncurrent_key_id = 1\n\n[[keyring.keys]]\nid = 1\nhex = '{HEX}'\n\n"
            f"[[keyring.keys]]\nid = 2\nhex = '{HEX[::-1]}'\n")
    cfg = _config(tmp_path, text)
    ring = FollowingKeyring(cfg)
    assert ring.current_key_id == 1
    st = os.stat(cfg)
    cfg.write_text(text.replace("current_key_id = 1", "current_key_id = 2"))
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ring.current_key_id == 2
