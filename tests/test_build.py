"""setup.py: an install without a C compiler or headers goes on, and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = "apt-get install gcc libssl-dev libsqlite3-dev libgcrypt20-dev"


def _tree(tmp_path: Path) -> Path:
    """setup.py and the C sources alone (no pyproject.toml: any setuptools reads it)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "csrc", tree / "csrc")
    shutil.copy(ROOT / "setup.py", tree / "setup.py")
    (tree / "cryptdisk" / "sqlite").mkdir(parents=True)  # where --inplace puts it here
    return tree


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("case", ["no compiler", "no headers", "compile error"])
def test_a_c_vfs_that_cannot_be_built_is_a_visible_warning_not_a_failure(tmp_path, case):
    tree = _tree(tmp_path)
    real = shutil.which("cc") or shutil.which("gcc") or "cc"
    cc = {
        "no compiler": str(tmp_path / "missing-cc"),
        # finds no header at all
        "no headers": _script(tmp_path / "cc-no-headers", "exit 1\n"),
        # finds the headers (-E) but fails to compile anything
        "compile error": _script(tmp_path / "cc-fails",
                                 f'for a in "$@"; do [ "$a" = -E ] && exec {real} "$@"; done\n'
                                 'echo "cc: error: simulated" >&2; exit 1\n'),
    }[case]
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CFLAGS", "LDSHARED")}
    env.update(CC=cc, LDSHARED=f"{cc} -shared", CRYPTDISK_CIPHER="openssl")
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cryptdisk: WARNING: the C VFS of cryptdisk.sqlite was not built" in done.stderr
    expected = {"no compiler": "no C compiler", "no headers": "headers not found",
                "compile error": "the build failed"}[case]
    assert expected in done.stderr
    assert FIX in done.stderr and "Python VFS" in done.stderr
    assert not list(tree.rglob("_cvfs*.so"))
    # the format's segment loops: not built either, said so, with the fallback named
    assert "cryptdisk: WARNING: the C segment loops of cryptdisk.format was not built" in \
        done.stderr
    assert "one cryptography call per 64 KiB segment" in done.stderr
    assert not list(tree.rglob("_cseal*.so"))


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it():
    """The table form (license = {text = ...}) is deprecated by setuptools; the SPDX string
    needs setuptools 77 or later (PEP 639)."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    requires = meta["build-system"]["requires"]
    setuptools = [r.replace(" ", "") for r in requires if r.startswith("setuptools")]
    assert setuptools and setuptools[0].startswith("setuptools>="), requires
    assert int(setuptools[0].split(">=")[1].split(".")[0]) >= 77, requires
