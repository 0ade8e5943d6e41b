"""A config holding keys inline that group or others may read is reported (not refused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptdisk.keys import Key, config_exposure, write_key_file

HEX = "00112233445566778899aabbccddeeff" * 2
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CRYPTDISK_KEYRING"}
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=dict(env, PYTHONPATH=SRC), cwd=cwd, timeout=120)


def test_the_cli_warns_about_a_readable_config_with_inline_keys(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keyring]\n[[keyring.keys]]\nid = 1\nhex = "{HEX}"\n')
    cfg.chmod(0o644)
    (tmp_path / "plain").write_bytes(b"x" * 10)
    done = _run("encrypt", "plain", "a.cd", "-c", "c.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ("cryptdisk: warning: c.toml holds key material (hex in keyring.keys id 1) and "
            "group or others may read it (mode 0644)") in done.stderr
    assert "cryptdisk: hint: chmod 600 c.toml" in done.stderr and HEX not in done.stderr
    listed = _run("keys", "list", "-c", "c.toml", cwd=tmp_path)
    assert listed.returncode == 0 and "holds key material" in listed.stderr

    cfg.chmod(0o600)
    done = _run("encrypt", "plain", "b.cd", "-c", "c.toml", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""

    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n')
    cfg.chmod(0o644)  # a reference to a key file exposes nothing
    done = _run("encrypt", "plain", "c.cd", "-c", "c.toml", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""


def test_disk_keys_and_clickhouse_xml_are_found_too(tmp_path):
    toml = tmp_path / "d.toml"
    toml.write_text('[disks.ch]\ntype = "clickhouse"\ndisk = "x"\n[[disks.ch.keys]]\nid = 3\n'
                    'raw = "0123456789abcdef"\n')
    toml.chmod(0o640)
    said = config_exposure(toml)
    assert said and "raw in disks.ch.keys id 3" in said and "mode 0640" in said
    assert "0123456789abcdef" not in said
    xml = tmp_path / "s.xml"
    body = ('<clickhouse><storage_configuration><disks><enc><type>encrypted</type>'
            '<disk>d</disk>{}</enc></disks></storage_configuration></clickhouse>')
    xml.write_text(body.format(f"<key_hex id='1'>{HEX}</key_hex>"))
    xml.chmod(0o604)
    assert "<key_hex> in the XML" in (config_exposure(xml) or "")
    xml.write_text(body.format("<key_hex id='1' from_env='K'/>"))
    assert config_exposure(xml) is None
    xml.write_text('<!DOCTYPE x [<!ENTITY e "k">]><clickhouse><key>&e;</key></clickhouse>')
    assert config_exposure(xml) is None  # no entity is expanded; loading reports the DTD
