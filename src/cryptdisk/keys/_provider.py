"""Key providers: where a key entry's material comes from, and the one parser of key entries.

A key entry is a table in a config (``[[keyring.keys]]``, ``[[disks.NAME.keys]]``,
ClickHouse's ``<key>`` elements) with an ``id`` and exactly one *provider field*
whose name selects a :class:`KeyProvider`::

    { id = 1, hex = "0011..." }             # HexKey
    { id = 2, from_env = "CRYPTDISK_KEY" }  # EnvKey
    { id = 3, file = "keys/k3.hex" }        # FileKey (relative to the config)
    { id = 4, command = ["pass", "show", "k4"] }

Providers are found by name in a registry, as fsspec finds filesystems: a mapping
from the name to a lazily imported class (with an install hint when the import
fails), to which :func:`register_key_provider` and the entry-point group
``cryptdisk.key_providers`` (``name = "package.module:Class"``) add.
:func:`parse_key_entry` is the only code that reads a key entry; the keyring and
the config loader both call it.
"""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import ConfigError, KeyringError, KeySourceError, with_location

__all__ = [
    "ENTRY_POINT_GROUP",
    "KeyEntry",
    "KeyProvider",
    "get_key_provider",
    "key_provider_names",
    "parse_key_entry",
    "register_key_provider",
]

ENTRY_POINT_GROUP = "cryptdisk.key_providers"
_MAX_ID = 2**64 - 1


class KeyProvider(abc.ABC):
    """One source of key material, selected by a key entry's field named :attr:`name`.

    Contract:

    * ``name`` (class attribute): the key-entry field that selects the provider
      (``hex``, ``from_env``...). ``label`` is what :attr:`cryptdisk.keys.Key.source`
      and ``system.keys`` show (``hex``, ``env``...); neither is ever material.
    * ``__init__(value, *, base)`` checks the field's *value* only (its type, not
      empty) and raises :class:`TypeError` with a message that completes
      "key N: <name> ...", e.g. "must be a non-empty string". It reads no secret and
      runs nothing. ``base`` is the directory that relative paths start from (the
      config file's).
    * :meth:`load` resolves the material: it returns bytes whose length is one of
      ``sizes``, or raises a :class:`~cryptdisk.errors.KeyringError` subclass
      (:class:`~cryptdisk.errors.KeySourceError` when the source could not produce a
      key, :class:`~cryptdisk.errors.InvalidKeyError` for bad material). Messages name
      the source (variable, file, command) and never contain material. It is called
      once, when the config is loaded, so a missing key fails at start-up; a provider
      that waits on something (a command, a network service) must time out.

    Providers of this kind hand the material to :class:`cryptdisk.keys.Key`, which
    wraps and unwraps the data keys in file headers. A provider whose key never
    leaves a service (a KMS) will instead wrap and unwrap the data keys itself,
    as :class:`cryptdisk.format.WrappingKey` describes; that is the second method
    pair such providers add.
    """

    name: ClassVar[str]
    label: ClassVar[str]

    def __init__(self, value: Any, *, base: str) -> None:
        self.value = value
        self.base = base

    @abc.abstractmethod
    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        """The key material, ``len(result) in sizes``; ``what`` names the key in messages."""

    def __repr__(self) -> str:  # the value is a reference (variable, path), not material
        return f"<{type(self).__name__} {self.name}>"


# -- the registry --------------------------------------------------------------------

# name -> {"class": "module:Class", "err": install hint if the import fails}
_KNOWN: dict[str, dict[str, str]] = {
    "hex": {"class": "cryptdisk.keys._sources:HexKey"},
    "from_env": {"class": "cryptdisk.keys._sources:EnvKey"},
    "file": {"class": "cryptdisk.keys._sources:FileKey"},
    "command": {"class": "cryptdisk.keys._sources:CommandKey"},
    # ClickHouse's <key>: raw characters, as its config takes them (ClickHouse disks only)
    "raw": {"class": "cryptdisk.keys._sources:RawKey"},
    "raw_from_env": {"class": "cryptdisk.keys._sources:RawEnvKey"},
}
_loaded: dict[str, type[KeyProvider]] = {}
_entry_points_read = False

#: The providers of ClickHouse's raw-character keys, which only ClickHouse disks accept.
RAW_PROVIDERS = frozenset({"raw", "raw_from_env"})


def register_key_provider(name: str, cls: type[KeyProvider] | str, *, clobber: bool = False,
                          errtxt: str | None = None) -> None:
    """Make ``name`` a key-entry field that selects ``cls`` (a class or ``"module:Class"``).

    A string is imported on first use; ``errtxt`` is the hint shown when that import
    fails (e.g. ``pip install cryptdisk-kms-aws``). Refuses to replace a provider
    unless ``clobber``.
    """
    if not isinstance(name, str) or not name.isidentifier() or name in ("id", "algorithm"):
        raise ValueError(f"a key provider name must be an identifier other than id and "
                         f"algorithm, not {name!r}")
    if not clobber and (name in _KNOWN or name in _loaded):
        raise ValueError(f"a key provider named {name!r} is already registered "
                         "(clobber=True replaces it)")
    _loaded.pop(name, None)
    if isinstance(cls, str):
        _KNOWN[name] = {"class": cls, **({"err": errtxt} if errtxt else {})}
        return
    if not (isinstance(cls, type) and issubclass(cls, KeyProvider)):
        raise TypeError(f"a key provider must be a KeyProvider subclass, not {cls!r}")
    _KNOWN[name] = {"class": f"{cls.__module__}:{cls.__qualname__}"}
    _loaded[name] = cls


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _KNOWN:
            _KNOWN[ep.name] = {"class": ep.value,
                               "err": f"the key provider {ep.name!r} of "
                                      f"{ep.dist.name if ep.dist else 'a plugin'} failed to load"}


def key_provider_names() -> list[str]:
    """Every provider name: built in, registered, then from entry points, in that order."""
    _read_entry_points()
    return list(_KNOWN)


def get_key_provider(name: str) -> type[KeyProvider]:
    """The provider class for ``name``, imported on first use.

    Raises :class:`KeySourceError` (with the install hint) when it cannot be imported,
    and :class:`LookupError` for a name nobody registered.
    """
    cls = _loaded.get(name)
    if cls is not None:
        return cls
    _read_entry_points()
    spec = _KNOWN.get(name)
    if spec is None:
        raise LookupError(f"no key provider named {name!r} "
                          f"(providers: {', '.join(key_provider_names())})")
    module_name, _, attr = spec["class"].partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise KeySourceError(f"the key provider {name!r} cannot be imported: {exc}",
                             hint=spec.get("err")) from None
    if not (isinstance(obj, type) and issubclass(obj, KeyProvider)):
        raise KeySourceError(f"the key provider {name!r} ({spec['class']}) is not a "
                             "KeyProvider subclass")
    _loaded[name] = obj
    return obj


# -- the one parser of key entries ------------------------------------------------------


@dataclass(frozen=True)
class KeyEntry:
    """A loaded key entry: its id, where it came from (a provider label) and its material.

    The material is not in ``repr`` and the entry cannot be pickled.
    """

    key_id: int
    source: str
    material: bytes = field(repr=False)
    algorithm: Any = None

    def __reduce__(self) -> Any:
        raise TypeError("a key entry holds key material and cannot be pickled")


def parse_key_entry(entry: Any, *, path: str | None, where: str, base: str | None = None,
                    sizes: tuple[int, ...] = (16, 32), default_id: int | None = None,
                    algorithm_field: bool = False, default_algorithm: Any = None,
                    exclude: Collection[str] = RAW_PROVIDERS) -> KeyEntry:
    """Check a key entry and load its material through its provider.

    ``entry`` is a parsed table: ``id`` (required unless ``default_id`` is given),
    exactly one provider field, and ``algorithm`` when ``algorithm_field``.
    Providers named in ``exclude`` are not accepted (by default ClickHouse's raw
    keys). Errors are :class:`ConfigError` for the entry's shape and the provider's
    :class:`KeyringError` otherwise, each with ``path:where:`` in front of the message.
    """
    if not isinstance(entry, Mapping):
        raise ConfigError("a key entry must be a table", path=path, where=where)
    providers = [n for n in key_provider_names() if n not in exclude]
    fields = {"id", *providers, *(("algorithm",) if algorithm_field else ())}
    unknown = set(entry) - fields
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(sorted(unknown))} in a key entry "
                          f"(fields: {', '.join(sorted(fields))})", path=path, where=where)
    key_id = entry.get("id", default_id)
    if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id <= _MAX_ID:
        raise ConfigError("each key needs an integer id (0 to 2**64-1)", path=path, where=where)
    chosen = [n for n in providers if n in entry]
    if len(chosen) != 1:
        raise ConfigError(f"key {key_id} needs exactly one of {', '.join(providers)} (found "
                          f"{', '.join(chosen) or 'none'})", path=path, where=where)
    name = chosen[0]
    try:
        cls = get_key_provider(name)
        try:
            provider = cls(entry[name], base=base if base is not None else os.getcwd())
        except TypeError as exc:
            raise ConfigError(f"key {key_id}: {name} {exc}", path=path, where=where) from None
        material = provider.load(f"key {key_id}", sizes)
    except ConfigError:
        raise
    except (KeyringError, ValueError) as exc:
        raise with_location(exc, path, where) from None
    return KeyEntry(key_id, cls.label, material,
                    entry.get("algorithm", default_algorithm) if algorithm_field else None)
