"""A dict of catalog entries by name, found in any case (DuckDB's identifiers are
case-insensitive and case-preserving, quoted or not)."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["NameDict"]

_V = TypeVar("_V")


class NameDict(dict[str, _V]):
    """Entries under the name each was created with: ``in``, ``[]``, ``get``, ``del`` and
    ``pop`` take a name in any case; iteration gives the names as declared; setting a name
    replaces the entry it names in another case. :meth:`_changed` runs after each change."""

    __slots__ = ()

    def name(self, name: Any) -> str | None:
        """The declared name of the entry ``name`` names in any case (None: none)."""
        if dict.__contains__(self, name):
            return name  # type: ignore[no-any-return]
        if not isinstance(name, str):
            return None
        low = name.lower()
        return next((k for k in self if k.lower() == low), None)

    def _changed(self) -> None:
        """Called after an entry is set or removed (for a subclass's derived state)."""

    def __missing__(self, key: str) -> _V:
        found = self.name(key)
        if found is None:
            raise KeyError(key)
        return dict.__getitem__(self, found)

    def __contains__(self, key: object) -> bool:
        return self.name(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        found = self.name(key)
        return default if found is None else dict.__getitem__(self, found)

    def __setitem__(self, key: str, value: _V) -> None:
        found = self.name(key)
        if found is not None and found != key:
            dict.__delitem__(self, found)
        dict.__setitem__(self, key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        found = self.name(key)
        dict.__delitem__(self, key if found is None else found)
        self._changed()

    def pop(self, key: str, *default: Any) -> Any:
        found = self.name(key)
        self._changed()
        return dict.pop(self, key if found is None else found, *default)
