"""The public surface: what each package exports, and that private modules stay private."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cryptdisk
import cryptdisk.db
import cryptdisk.disks
import cryptdisk.keys

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_database_is_exported_at_the_root_without_importing_the_db_on_import():
    assert cryptdisk.Database is cryptdisk.db.Database and "Database" in cryptdisk.__all__
    code = "import sys, cryptdisk; print('cryptdisk.db' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": SRC, "PATH": ""}, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_the_two_cache_defaults_have_names_that_say_which_cache():
    assert cryptdisk.db.DEFAULT_COLUMN_CACHE_BYTES == 768 << 20  # the database's column cache
    assert cryptdisk.disks.DEFAULT_READ_CACHE_BYTES == 256 << 20  # an encrypted disk's reads
    assert not hasattr(cryptdisk.db, "DEFAULT_CACHE_BYTES")
    assert not hasattr(cryptdisk.disks, "DEFAULT_CACHE_BYTES")


def test_keys_exports_no_toml_helper():
    assert "table_line" not in cryptdisk.keys.__all__
    assert not hasattr(cryptdisk.keys, "table_line")


def test_every_error_class_is_drawn_in_the_one_hierarchy():
    import re

    import cryptdisk.errors as errors
    from cryptdisk.server._users import UsersJournalMismatch

    classes = {name for name in errors.__all__
               if isinstance(getattr(errors, name), type)
               and issubclass(getattr(errors, name), errors.CryptdiskError)}
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or "")) | {"CryptdiskError"}
    assert classes == drawn
    assert UsersJournalMismatch is errors.UsersJournalMismatch is cryptdisk.UsersJournalMismatch
    assert issubclass(UsersJournalMismatch, errors.ServerError)
