"""Optional dependencies stay with the features that need them (pyproject's extras)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cryptdisk"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_psutil_is_imported_only_by_the_benchmark_suite():
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "psutil" in _imported_roots(p))
    assert users, "the scan found no psutil import at all (is the path right?)"
    assert [u for u in users if not u.startswith("bench" + os.sep)] == []


def _run_without_psutil(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE.parent), env.get("PYTHONPATH"))
                                        if p)
    blocked = "import sys; sys.modules['psutil'] = None\n"
    return subprocess.run([sys.executable, "-c", blocked + code], capture_output=True,
                          text=True, timeout=120, env=env)


def test_everything_but_the_bench_imports_without_psutil():
    r = _run_without_psutil(
        "import cryptdisk, cryptdisk.config, cryptdisk.db, cryptdisk.disks, cryptdisk.fs, "
        "cryptdisk.keys, cryptdisk.sqlite, cryptdisk.cli\n"
        "from cryptdisk.cli._app import build_parser\n"
        "build_parser().parse_args(['bench', 'crypto'])\n")
    assert r.returncode == 0, r.stderr


def test_bench_without_psutil_names_the_extra(tmp_path):
    r = _run_without_psutil(
        "from cryptdisk.cli import main\n"
        f"raise SystemExit(main(['bench', 'crypto', '--quick', '--workdir', {str(tmp_path)!r}]))\n")
    assert r.returncode == 1, r.stderr
    assert "error: cryptdisk bench needs psutil" in r.stderr
    assert "hint: pip install 'cryptdisk[bench]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_olap_without_numpy_names_the_extra(tmp_path):
    """numpy (the bench extra) hidden by a meta-path finder, as on a base install."""
    blocker = tmp_path / "block" / "sitecustomize.py"
    blocker.parent.mkdir()
    blocker.write_text(
        "import sys\n"
        "class _NoNumpy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'numpy':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoNumpy())\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(blocker.parent), str(PACKAGE.parent), env.get("PYTHONPATH")) if p)
    probe = subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True,
                           text=True, env=env, timeout=60)
    assert probe.returncode == 1 and "No module named 'numpy'" in probe.stderr
    for experiment in ("olap", "all"):
        r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", experiment, "--quick",
                            "--workdir", str(tmp_path)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 1, r.stderr
        assert f"error: cryptdisk bench {experiment} needs numpy" in r.stderr
        assert "hint: pip install 'cryptdisk[bench]'" in r.stderr
        assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr


def test_the_kms_libraries_are_imported_only_by_their_providers():
    """python-pkcs11 and boto3 (the kms extra) load only when a config names their source."""
    for root in ("pkcs11", "boto3", "kmip"):
        users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if root in _imported_roots(p))
        assert all(u.startswith(os.path.join("keys", "providers")) for u in users), users
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.modules['pkcs11'] = None; sys.modules['boto3'] = None\n"
                        "import cryptdisk, cryptdisk.keys.providers, cryptdisk.db, cryptdisk.cli\n"
                        "from cryptdisk.errors import KeyProviderError\n"
                        "from cryptdisk.keys.providers._pkcs11 import _pkcs11\n"
                        "try:\n    _pkcs11()\nexcept KeyProviderError as e:\n"
                        "    print(e.hint)\n"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "pip install 'cryptdisk[kms]'"


def test_dask_is_imported_only_by_cryptdisk_dask_and_its_benchmark():
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if _imported_roots(p) & {"dask", "distributed"})
    assert users, "the scan found no dask import at all (is the path right?)"
    assert [u for u in users if not u.startswith("dask" + os.sep)] == [
        os.path.join("bench", "_bodies_dask.py")]


def test_cryptdisk_dask_without_dask_names_the_extra(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE.parent), env.get("PYTHONPATH"))
                                        if p)
    code = ("import sys; sys.modules['dask'] = None; sys.modules['dask.dataframe'] = None\n"
            "import cryptdisk.dask\n"
            "from cryptdisk.errors import CryptdiskError\n"
            "try:\n"
            f"    cryptdisk.dask.read_table({str(tmp_path / 'db')!r}, 't')\n"
            "except CryptdiskError as e:\n"
            "    print(e.hint)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "pip install 'cryptdisk[dask]'"


def test_the_embedded_database_does_not_import_fsspec(tmp_path):
    """fsspec (50-150 ms of a process's start) loads only for a disk or filesystem that uses
    it: opening and querying a database on local disks does without."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    code = ("import sys, cryptdisk\n"
            f"db = cryptdisk.connect({str(tmp_path / 'db')!r})\n"
            "db.sql('CREATE TABLE t (k BIGINT) ORDER BY k')\n"
            "db.sql('INSERT INTO t SELECT range FROM range(10)')\n"
            "print(db.query('SELECT sum(k) FROM t WHERE k > 4'), 'fsspec' in sys.modules)\n"
            "from cryptdisk.disks import FsspecDisk\n"
            f"FsspecDisk('m', 'file://{tmp_path}')\n"
            "print('fsspec' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[(35,)] False", "True"]
