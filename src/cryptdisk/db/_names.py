"""A dict of catalog entries by name, found in any case of their ASCII letters (DuckDB's
identifiers are case-insensitive and case-preserving, quoted or not; DuckDB folds the case
of ASCII letters only: ``É`` and ``é`` are two names, ``T`` and ``t`` one)."""

from __future__ import annotations

from typing import Any, TypeVar

from ..errors import DatabaseError

__all__ = ["NameDict", "fold", "twin_error"]

_V = TypeVar("_V")

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(name: str) -> str:
    """``name`` as DuckDB compares names: its ASCII letters in lower case, every other
    character as written (``str.lower`` would also fold ``É`` to ``é``, which DuckDB
    keeps apart)."""
    return name.translate(_ASCII_LOWER)


class NameDict(dict[str, _V]):
    """Entries under the name each was created with: ``in``, ``[]``, ``get``, ``del`` and
    ``pop`` take a name in any case of its ASCII letters (:func:`fold`); iteration gives
    the names as declared; setting a name replaces the entry it names in another case.
    :meth:`_changed` runs after each change."""

    __slots__ = ()

    def name(self, name: Any) -> str | None:
        """The declared name of the entry ``name`` names in any case (None: none)."""
        if dict.__contains__(self, name):
            return name  # type: ignore[no-any-return]
        if not isinstance(name, str):
            return None
        low = fold(name)
        return next((k for k in self if fold(k) == low), None)

    def twin(self, name: Any) -> str | None:
        """The declared name of an entry that ``name`` names in no case but that differs
        from it only in the case of letters outside ASCII (``É`` for ``é``), or None.
        DuckDB tells such names apart; the database refuses a new one beside its twin (its
        own records of a table, such as its policies, are kept by the name in lower case)."""
        if not isinstance(name, str) or self.name(name) is not None:
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


def twin_error(what: str, name: str, *entries: NameDict[Any], own: str | None = None
               ) -> None:
    """Refuse a new table or view ``name`` (statement ``what``) beside a table or view of
    ``entries`` whose name differs from it only in the case of letters outside ASCII
    (but ``own``: the table being renamed)."""
    for found in entries:
        twin = found.twin(name)
        if twin is not None and twin != own:
            raise DatabaseError(
                f"{what}: {twin!r} is named so too, but for the case of letters outside "
                "ASCII: DuckDB tells the two names apart, the database cannot keep both",
                hint=f"give it another name, or use {twin!r} (names match in any case of "
                "their ASCII letters, other letters as written)")
