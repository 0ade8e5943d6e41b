"""Edits of a JSON document, for the tests of malformed files (policy, user, backup).

Imported by those tests; not a test module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Change", "set_at"]

#: An edit of a parsed JSON document, in place.
Change = Callable[[Any], Any]


def set_at(path: str, value: Any) -> Change:
    """Set (or, for ``...``, delete) the field at ``path``, dotted ("masking.pan_mask.body");
    in a list, a part is an index ("tables.0.parts")."""
    *parents, last = path.split(".")

    def step(data: Any, key: str) -> Any:
        return int(key) if isinstance(data, list) else key

    def change(data: Any) -> None:
        for key in parents:
            data = data[step(data, key)]
        if value is ...:
            del data[step(data, last)]
        else:
            data[step(data, last)] = value
    return change
