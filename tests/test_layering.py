"""Imports flow one way: format -> keys -> disks -> config -> db / sqlite -> server, fields,
backup -> bench -> cli (docs/architecture.md), and no package reaches into another's
private modules. Every import counts, also one inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cryptdisk"

#: Layer of each top-level module or package of cryptdisk; an import must go to a lower one.
RANK = {
    "errors": 0, "_json": 0, "_durable": 0, "_flocks": 0, "_sqlitefiles": 0,
    "format": 1,
    "keys": 2,
    "disks": 3,
    "config": 4,
    "db": 5, "sqlite": 5, "fs": 5,
    "(root)": 5.5,  # the easy tier: cryptdisk.open, cryptdisk.connect, over format/keys/db
    "server": 6, "fields": 6, "backup": 6, "dask": 6,
    "bench": 7,
    "cli": 8,
    "__main__": 9,
}
ANYWHERE = {("(root)", "__version__")}  # a constant anyone may read


def _imports(path: Path) -> list[tuple[int, list[str]]]:
    """(line, target) for each cryptdisk name ``path`` imports; target is a dotted path as a
    list without the leading ``cryptdisk``, ending in the name imported (``from X import
    name`` gives X + [name]; ``import X`` gives X + ["*"])."""
    package = list(path.relative_to(PACKAGE).with_suffix("").parts)[:-1]  # __init__ too
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                module = base + (node.module.split(".") if node.module else [])
            elif (node.module or "").split(".")[0] == "cryptdisk":
                module = node.module.split(".")[1:]  # type: ignore[union-attr]
            else:
                continue
            out += [(node.lineno, [*module, a.name]) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, [*a.name.split(".")[1:], "*"]) for a in node.names
                    if a.name.split(".")[0] == "cryptdisk"]  # "*": the module itself
    return out


def _layer(parts: list[str]) -> str:
    return parts[0] if parts and parts[0] in RANK else "(root)"


def _modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, "the scan found too few modules (is the path right?)"
    return found


def _where(path: Path) -> tuple[str, list[str]]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return (_layer(parts) if len(parts) > 1 or parts[0] in RANK else "(root)"), parts


def test_every_top_level_module_has_a_layer():
    top = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert top - set(RANK) == set(), "add the new module or package to RANK (and the docs)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_to_lower_layers_only(path):
    layer, _parts = _where(path)
    wrong = []
    for line, target in _imports(path):
        other = _layer(target)
        if other == layer or (other, target[-1]) in ANYWHERE:
            continue
        if RANK[other] >= RANK[layer]:
            wrong.append(f"line {line}: {layer} imports {'.'.join(target)} ({other})")
    assert wrong == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_packages_private_module(path):
    layer, _parts = _where(path)
    # A private module on the way (``from ..keys._key import Key``) or imported by name
    # (``from ..sqlite import _native``), or a private name of another package.
    wrong = [f"line {line}: {'.'.join(target)}" for line, target in _imports(path)
             if _layer(target) != layer
             and any(p.startswith("_") and not p.startswith("__") for p in target[1:])]
    assert wrong == []


def test_the_demo_does_not_import_the_benchmark_suite():
    demo = PACKAGE / "cli" / "demo.py"
    assert [t for _line, t in _imports(demo) if _layer(t) == "bench"] == []


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The scan itself works: a format module importing keys is caught."""
    fake = tmp_path / "cryptdisk"
    (fake / "format").mkdir(parents=True)
    bad = fake / "format" / "_bad.py"
    bad.write_text("def f():\n    from ..keys._key import Key\n    from .. import open\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE", fake)
    assert _imports(bad) == [(2, ["keys", "_key", "Key"]), (3, ["open"])]
    with pytest.raises(AssertionError):
        test_imports_go_to_lower_layers_only(bad)
    with pytest.raises(AssertionError):
        test_no_module_imports_another_packages_private_module(bad)
    by_name = fake / "format" / "_by_name.py"  # a private module imported as a name
    by_name.write_text("from ..errors import CryptdiskError\nfrom ..errors import _private\n")
    assert _imports(by_name) == [(1, ["errors", "CryptdiskError"]), (2, ["errors", "_private"])]
    with pytest.raises(AssertionError, match=r"errors\._private"):
        test_no_module_imports_another_packages_private_module(by_name)
