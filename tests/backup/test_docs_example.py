"""docs/backup.md's command example runs as written, in order, on the files the README
makes (sales.db without a config, app.db under cryptdisk.toml's keyring)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cryptdisk
import cryptdisk.sqlite
from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file
from cryptdisk.keys._key import key_check_value

from ..test_readme import readme_blocks

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
file = "cryptdisk.key"
"""


def test_the_backup_page_example_runs_as_written(tmp_path: Path) -> None:
    (block,) = [b for b in readme_blocks((ROOT / "docs" / "backup.md").read_text())
                if b.language == "sh"]
    write_key_file(tmp_path / "cryptdisk.key", Key.generate(1))
    (tmp_path / "cryptdisk.toml").write_text(CONFIG)
    db = cryptdisk.connect(tmp_path / "sales.db")
    db.sql("CREATE TABLE t (a BIGINT, b VARCHAR) ORDER BY a")
    db.sql("INSERT INTO t SELECT range, range::VARCHAR FROM range(1000)")
    db.close()
    app = cryptdisk.sqlite.connect(tmp_path / "app.db",
                                   keyring=Keyring.from_config(tmp_path / "cryptdisk.toml"))
    app.execute("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('hi')")
    app.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTDISK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"),
                                                    os.environ.get("PYTHONPATH")) if p)
    bin_dir = tmp_path / "bin"  # `cryptdisk` is this source tree's
    bin_dir.mkdir()
    (bin_dir / "cryptdisk").write_text(f'#!/bin/sh\nexec {sys.executable} -m cryptdisk "$@"\n')
    (bin_dir / "cryptdisk").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "-e", "-c", block.code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    for name in ("sales-restored.db", "old.db"):
        with cryptdisk.connect(tmp_path / name, read_only=True) as restored:
            assert restored.query("SELECT count(*), sum(a) FROM t") == [(1000, 499500)]
    ops = key_check_value(key_from_file(tmp_path / "ops.key")).hex()
    assert done.stdout.splitlines()[-2:] == ["passphrase (argon2id, 65536 KiB, 3 passes)",
                                             f"keyring key id 1 (check value {ops})"]
