"""Whether a config file exposes key material: keys written in it, readable by others.

A key file readable by group or others is refused (:func:`~cryptdisk.keys.key_from_file`).
A config is read by more than the keys' owner (its disks and policies are shared
configuration), so one holding keys inline (``hex``, ``raw``; ClickHouse's ``<key>``,
``<key_hex>``) with such a mode is reported, not refused: :func:`config_exposure` says
what, and the ``cryptdisk`` command prints it as a warning.
"""

from __future__ import annotations

import os
import stat
import tomllib
from typing import Any

__all__ = ["config_exposure"]

_INLINE = ("hex", "raw")
_MAX_CONFIG = 4 << 20


def config_exposure(path: str | os.PathLike[str]) -> str | None:
    """A sentence when ``path`` holds key material inline and group or others may read it,
    else None (also when it cannot be read or parsed: loading it reports that)."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o044 or st.st_size > _MAX_CONFIG:
            return None
        with open(name, "rb") as f:
            data = f.read()
    except OSError:
        return None
    where = _xml_keys(data) if name.endswith(".xml") else _toml_keys(data)
    if not where:
        return None
    more = f" and {len(where) - 3} more" if len(where) > 3 else ""
    return (f"{name} holds key material ({', '.join(where[:3])}{more}) and group or others "
            f"may read it (mode {stat.S_IMODE(st.st_mode):04o}): whoever reads it can "
            "decrypt the data")


def _toml_keys(data: bytes) -> list[str]:
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    found: list[str] = []

    def walk(node: Any, at: str) -> None:
        if isinstance(node, dict):
            inline = [f for f in _INLINE if isinstance(node.get(f), str) and node[f]]
            if inline:
                ident = f" id {node['id']}" if isinstance(node.get("id"), int) else ""
                found.append(f"{inline[0]} in {at or 'the top level'}{ident}")
            for k, v in node.items():
                walk(v, f"{at}.{k}" if at else str(k))
        elif isinstance(node, list):
            for item in node:
                walk(item, at)
    walk(parsed, "")
    return found


class _Doctype(Exception):
    pass


def _xml_keys(data: bytes) -> list[str]:
    """``<key>`` / ``<key_hex>`` elements with text and no ``from_env`` (expat; a DTD is
    refused, so no entity is expanded)."""
    from xml.parsers import expat

    found: list[str] = []
    open_keys: list[tuple[str, bool, list[str]]] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        is_key = tag in ("key", "key_hex") or tag.startswith(("key[", "key_hex["))
        open_keys.append((tag, is_key and "from_env" not in attrs, []))

    def end(tag: str) -> None:
        name, inline, text = open_keys.pop()
        if inline and "".join(text).strip():
            found.append(f"<{name}> in the XML")

    def data_(text: str) -> None:
        if open_keys:
            open_keys[-1][2].append(text)

    def refuse(*_args: Any) -> None:
        raise _Doctype

    parser = expat.ParserCreate()
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = data_
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(data, True)
    except (expat.ExpatError, _Doctype):
        return []
    return found
