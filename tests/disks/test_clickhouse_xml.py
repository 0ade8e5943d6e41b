"""ClickHouse storage_configuration XML read as cryptdisk's TOML config dict."""

from __future__ import annotations

import os
import tomllib

import pytest

from cryptdisk.disks._clickhouse_xml import parse_clickhouse_storage_xml as parse
from cryptdisk.errors import ConfigError
from cryptdisk.format.clickhouse import ch_key_finder, open_clickhouse
from tests.format.chdb_util import needs_chdb, run_session, storage_xml

HEX = "00112233445566778899aabbccddeeff"

FULL = f"""<?xml version="1.0"?>
<clickhouse>
  <logger><level>trace</level></logger>
  <storage_configuration>
    <disks>
      <default><keep_free_space_bytes>1024</keep_free_space_bytes></default>
      <disk1><path>/var/lib/ch/disk1/</path></disk1>
      <disk2><type>local</type><path>/var/lib/ch/disk2/</path></disk2>
      <enc>
        <type>encrypted</type>
        <disk>disk1</disk>
        <path>encrypted/</path>
        <key_hex id="0">{HEX}</key_hex>
        <key_hex id="1" from_env="CH_KEY_1"/>
        <key id="2">abcdefghijklmnop</key>
        <key id="3" from_env="CH_RAW_KEY"/>
        <current_key_id>1</current_key_id>
        <algorithm>aes_256_ctr</algorithm>
        <use_fake_transaction>true</use_fake_transaction>
      </enc>
    </disks>
    <policies>
      <tiered>
        <volumes>
          <hot><disk>enc</disk><max_data_part_size_bytes>1000</max_data_part_size_bytes></hot>
          <cold><disk>disk1</disk><disk>disk2</disk></cold>
        </volumes>
        <move_factor>0.2</move_factor>
      </tiered>
    </policies>
  </storage_configuration>
</clickhouse>
"""

EQUIVALENT_TOML = f"""
[disks.disk1]
type = "local"
path = "/var/lib/ch/disk1/"

[disks.disk2]
type = "local"
path = "/var/lib/ch/disk2/"

[disks.enc]
type = "clickhouse"
disk = "disk1"
path = "encrypted/"
algorithm = "AES_256_CTR"
current_key_id = 1
[[disks.enc.keys]]
id = 0
hex = "{HEX}"
[[disks.enc.keys]]
id = 1
from_env = "CH_KEY_1"
[[disks.enc.keys]]
id = 2
raw = "abcdefghijklmnop"
[[disks.enc.keys]]
id = 3
raw_from_env = "CH_RAW_KEY"

[policies.tiered]
[[policies.tiered.volumes]]
name = "hot"
disks = ["enc"]
[[policies.tiered.volumes]]
name = "cold"
disks = ["disk1", "disk2"]
"""


def test_full_config_equals_the_toml_equivalent(tmp_path):
    p = tmp_path / "storage.xml"
    p.write_text(FULL)
    assert parse(p) == tomllib.loads(EQUIVALENT_TOML)
    assert parse(str(p)) == parse(FULL) == parse(FULL.encode())


@pytest.mark.parametrize("root", ["clickhouse", "yandex", None])
def test_roots(root):
    body = "<storage_configuration><disks><d><path>/x/</path></d></disks></storage_configuration>"
    text = f"<{root}>{body}</{root}>" if root else body
    assert parse(text) == {"disks": {"d": {"type": "local", "path": "/x/"}}}


def _enc(keys: str, extra: str = "") -> str:
    return (f"<clickhouse><storage_configuration><disks><e><type>encrypted</type>"
            f"<disk>d</disk>{keys}{extra}</e></disks></storage_configuration></clickhouse>")


def test_single_key_without_id_is_id_zero_and_algorithm_defaults():
    spec = parse(_enc(f"<key_hex>{HEX}</key_hex>"))["disks"]["e"]
    assert spec == {"type": "clickhouse", "disk": "d", "algorithm": "AES_128_CTR",
                    "keys": [{"id": 0, "hex": HEX}]}


def test_keys_without_id_follow_explicit_ids_and_current_key_is_matched():
    spec = parse(_enc(f'<key id="5">0123456789abcdef</key><key_hex>{HEX}</key_hex>'
                      f"<key_hex>{'ab' * 16}</key_hex>",
                      f"<current_key_hex>{HEX.upper()}</current_key_hex>"))["disks"]["e"]
    assert [k["id"] for k in spec["keys"]] == [5, 6, 7]
    assert spec["current_key_id"] == 6
    raw_current = parse(_enc(f"<key>0123456789abcdef</key><key_hex>{HEX}</key_hex>",
                             "<current_key>0123456789abcdef</current_key>"))
    assert raw_current["disks"]["e"]["current_key_id"] == 0


def test_from_env_on_plain_settings_is_resolved(monkeypatch):
    monkeypatch.setenv("CH_DISK_PATH", "/from/env/")
    text = ('<storage_configuration><disks><d><path from_env="CH_DISK_PATH"/></d></disks>'
            "</storage_configuration>")
    assert parse(text)["disks"]["d"]["path"] == "/from/env/"
    monkeypatch.delenv("CH_DISK_PATH")
    with pytest.raises(ConfigError, match="CH_DISK_PATH is not set"):
        parse(text)


SECRET = "s3cr3t-key-16chr"


@pytest.mark.parametrize(
    ("text", "where", "match"),
    [
        ("<clickhouse><storage_configuration><disks><foo><type>s3</type></foo></disks>"
         "</storage_configuration></clickhouse>",
         "storage_configuration/disks/foo/type", "'s3' is not supported"),
        (_enc(f'<key_hex id="1">{HEX}</key_hex><key id="1">{SECRET}</key>'),
         "storage_configuration/disks/e/key[2]", "key id 1 is used twice"),
        (_enc(f'<key_hex id="x">{HEX}</key_hex>'), "storage_configuration/disks/e/key_hex[1]",
         "unsigned integer"),
        (_enc(f"<key_hex>{SECRET}</key_hex>"), "storage_configuration/disks/e/key_hex[1]",
         "not valid hex"),
        (_enc(""), "storage_configuration/disks/e", "at least one <key>"),
        (_enc(f"<key>{SECRET}</key>", "<current_key_id>4</current_key_id>"),
         "storage_configuration/disks/e/current_key_id", "current_key_id 4"),
        (_enc(f"<key>{SECRET}</key>", f"<current_key_id>{SECRET}</current_key_id>"),
         "storage_configuration/disks/e/current_key_id",
         "unsigned integer, got a string of 16 characters"),
        (_enc(f"<key>{SECRET}</key>", f'<path from_env="{HEX}"/>'),
         "storage_configuration/disks/e/path", "not a variable name"),
        (_enc(f"<key>{SECRET}</key>", "<current_key>another-secret-1</current_key>"),
         "storage_configuration/disks/e/current_key", "not one of the disk's literal keys"),
        (_enc(f"<key>{SECRET}</key>", "<current_key_id>0</current_key_id><current_key>x"
                                      "</current_key>"),
         "storage_configuration/disks/e", "more than once"),
        (_enc(f"<key>{SECRET}</key>", "<algorithm>aes_128_gcm</algorithm>"),
         "storage_configuration/disks/e/algorithm", "aes_128_gcm"),
        (_enc(f"<key>{SECRET}</key>", "<path>no-slash</path>"),
         "storage_configuration/disks/e/path", "must end with '/'"),
        ("<clickhouse><storage_configuration><disks><e><type>encrypted</type>"
         f"<key>{SECRET}</key></e></disks></storage_configuration></clickhouse>",
         "storage_configuration/disks/e", "needs <disk>"),
        ("<storage_configuration><disks><x><type>local</type></x></disks>"
         "</storage_configuration>", "storage_configuration/disks/x", "needs <path>"),
        ("<storage_configuration><policies><p><volumes><v><disk/></v></volumes></p></policies>"
         "</storage_configuration>", "storage_configuration/policies/p/volumes/v", "<disk>"),
        ("<storage_configuration><policies><p/></policies></storage_configuration>",
         "storage_configuration/policies/p", "no volumes"),
        ("<storage_configuration><disks><a><path>/a/</path></a><a><path>/b/</path></a></disks>"
         "</storage_configuration>", "storage_configuration/disks/a", "defined twice"),
        ('<storage_configuration><disks><a><path incl="x"/></a></disks></storage_configuration>',
         "storage_configuration/disks/a/path", "incl= substitutions"),
        ("<config><storage_configuration/></config>", "config", "unexpected root"),
        ("<clickhouse><logger/></clickhouse>", "clickhouse", "no <storage_configuration>"),
    ],
)
def test_errors_name_the_element_and_never_the_key(text, where, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse(text)
    assert info.value.where == where
    assert where in str(info.value)
    assert SECRET not in str(info.value) and HEX not in str(info.value)
    assert "another-secret" not in str(info.value)


def test_malformed_xml_names_the_line(tmp_path):
    p = tmp_path / "bad.xml"
    p.write_text(f"<clickhouse>\n  <storage_configuration>\n    <key>{SECRET}</kye>\n")
    with pytest.raises(ConfigError, match="malformed XML") as info:
        parse(p)
    assert info.value.where.startswith("line 3") and info.value.path == str(p)
    assert str(p) in str(info.value) and SECRET not in str(info.value)


def test_dtd_and_entities_are_refused():
    bomb = ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><clickhouse>&b;</clickhouse>')
    with pytest.raises(ConfigError, match="DOCTYPE"):
        parse(bomb)
    with pytest.raises(ConfigError, match="undefined entity"):
        parse("<clickhouse>&xxe;</clickhouse>")


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        parse("/nonexistent/storage.xml")


# --- the same XML drives real ClickHouse, and the mapping finds the keys it used --------------


def _material(entry: dict) -> bytes:
    """Resolve a key entry as the config loader does (hex, raw, from_env, raw_from_env)."""
    if "hex" in entry:
        return bytes.fromhex(entry["hex"])
    if "raw" in entry:
        return entry["raw"].encode()
    if "from_env" in entry:
        return bytes.fromhex(os.environ[entry["from_env"]])
    return os.environ[entry["raw_from_env"]].encode()


@pytest.mark.chdb
@needs_chdb
def test_mapping_matches_what_clickhouse_does_with_the_same_xml(tmp_path, monkeypatch):
    env_key = os.urandom(32).hex()
    monkeypatch.setenv("CRYPTDISK_TEST_CH_KEY", env_key)
    disks = (
        f"<raw><path>{tmp_path}/raw/</path></raw>"
        "<a><type>encrypted</type><disk>raw</disk><path>a/</path>"
        "<key>0123456789abcdef</key></a>"  # one raw key without id: id 0, current
        "<b><type>encrypted</type><disk>raw</disk><path>b/</path>"
        f'<key_hex id="3">{HEX}</key_hex>'
        '<key_hex id="4" from_env="CRYPTDISK_TEST_CH_KEY"/>'
        "<current_key_id>4</current_key_id><algorithm>AES_256_CTR</algorithm></b>"
    )
    policies = "".join(f"<p{d}><volumes><v><disk>{d}</disk></v></volumes></p{d}>" for d in "ab")
    config = tmp_path / "config.xml"
    config.write_text(storage_xml(disks, policies))
    queries = []
    for d in "ab":
        queries += [f"CREATE TABLE t{d} (x UInt32) ENGINE = MergeTree ORDER BY x "
                    f"SETTINGS storage_policy = 'p{d}'",
                    f"INSERT INTO t{d} SELECT number FROM numbers(1234)"]
    run_session(str(tmp_path / "db"), str(config), queries)
    parsed = parse(config)
    assert parsed["policies"]["pb"] == {"volumes": [{"name": "v", "disks": ["b"]}]}
    for d in "ab":
        spec = parsed["disks"][d]
        finder = ch_key_finder({e["id"]: _material(e) for e in spec["keys"]})
        counts = []
        for dirpath, _, names in os.walk(tmp_path / "raw" / d):
            for name in names:
                with open_clickhouse(os.path.join(dirpath, name), key_for=finder) as f:
                    data = f.read()
                    if f.header is not None:
                        assert f.header.algorithm.name == spec["algorithm"]
                if name == "count.txt":
                    counts.append(data)
        assert counts == [b"1234"]
    assert parsed["disks"]["a"]["keys"] == [{"id": 0, "raw": "0123456789abcdef"}]
    assert parsed["disks"]["b"]["current_key_id"] == 4


def test_an_unknown_element_is_refused_with_its_path_and_line(tmp_path):
    p = tmp_path / "storage.xml"
    p.write_text(FULL.replace("<algorithm>aes_256_ctr</algorithm>",
                              "<algoritm>aes_256_ctr</algoritm>"))
    line = next(i for i, text in enumerate(p.read_text().splitlines(), 1) if "algoritm" in text)
    with pytest.raises(ConfigError, match="unknown element <algoritm> in encrypted disk 'enc'") \
            as info:
        parse(p)
    assert info.value.where == f"storage_configuration/disks/enc/algoritm, line {line}"
    assert f"{p}:storage_configuration/disks/enc/algoritm, line {line}:" in str(info.value)
    assert "algorithm" in info.value.hint and HEX not in str(info.value)


@pytest.mark.parametrize(("text", "where"), [
    ("<storage_configuration><disks><d><path>/x/</path><keep_free_space_byte>1"
     "</keep_free_space_byte></d></disks></storage_configuration>",
     "storage_configuration/disks/d/keep_free_space_byte, line 1"),
    ("<storage_configuration>\n<disk><d><path>/x/</path></d></disk></storage_configuration>",
     "storage_configuration/disk, line 2"),
    ("<storage_configuration><policies><p><volumes><v><disk>d</disk></v></volumes>\n"
     "<movefactor>0.1</movefactor></p></policies></storage_configuration>",
     "storage_configuration/policies/p/movefactor, line 2"),
    ("<storage_configuration><policies><p><volumes><v><disk>d</disk>\n\n<max_part>1</max_part>"
     "</v></volumes></p></policies></storage_configuration>",
     "storage_configuration/policies/p/volumes/v/max_part, line 3"),
])
def test_unknown_elements_everywhere_in_storage_configuration(text, where):
    with pytest.raises(ConfigError, match="unknown element") as info:
        parse(text)
    assert info.value.where == where


def test_settings_clickhouse_reads_are_accepted_and_ignored():
    text = ("<storage_configuration><disks>"
            "<d><path>/x/</path><keep_free_space_ratio>0.1</keep_free_space_ratio>"
            "<skip_access_check>1</skip_access_check></d></disks><policies><p><volumes><v>"
            "<disk>d</disk><prefer_not_to_merge>1</prefer_not_to_merge>"
            "<load_balancing>least_used</load_balancing></v></volumes>"
            "<move_factor>0.1</move_factor></p></policies></storage_configuration>")
    assert parse(text) == {"disks": {"d": {"type": "local", "path": "/x/"}},
                           "policies": {"p": {"volumes": [{"name": "v", "disks": ["d"]}]}}}


@pytest.mark.parametrize("keys", [
    f'<key_hex id="1">{HEX}</key_hex>',                        # one key, id 1
    f"<key_hex>{HEX}</key_hex><key>{SECRET}</key>",            # two keys without ids
    f'<key_hex id="0">{HEX}</key_hex><key id="1">{SECRET}</key>',
])
def test_a_current_key_is_required_unless_the_only_key_has_id_zero(keys):
    """ClickHouse's DiskEncrypted: 'The current key is not specified' in these cases."""
    with pytest.raises(ConfigError, match="no current key") as info:
        parse(_enc(keys))
    assert info.value.where == "storage_configuration/disks/e"
    assert "<current_key_id>" in info.value.hint
    assert SECRET not in str(info.value) and HEX not in str(info.value)
    assert parse(_enc(f'<key_hex id="0">{HEX}</key_hex>'))["disks"]["e"]["keys"][0]["id"] == 0
