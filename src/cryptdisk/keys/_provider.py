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
    # providers that keep their key, selected by source = "NAME" (cryptdisk.keys.providers)
    "pkcs11": {"class": "cryptdisk.keys.providers._pkcs11:Pkcs11Provider",
               "err": "pip install 'cryptdisk[kms]' (python-pkcs11) and a PKCS#11 module "
                      "(e.g. apt-get install softhsm2)"},
    "aws-kms": {"class": "cryptdisk.keys.providers._aws_kms:AwsKmsProvider",
                "err": "pip install 'cryptdisk[kms]' (boto3)"},
    "kmip": {"class": "cryptdisk.keys.providers._kmip:KmipProvider",
             "err": "pip install 'cryptdisk[kms]' (PyKMIP)"},
}
_loaded: dict[str, type[KeyProvider]] = {}
#: providers selected by ``source = "NAME"`` (they keep their key; see RemoteKeyProvider)
_SOURCES: set[str] = {"pkcs11", "aws-kms", "kmip"}
_entry_points_read = False

#: The providers of ClickHouse's raw-character keys, which only ClickHouse disks accept.
RAW_PROVIDERS = frozenset({"raw", "raw_from_env"})


def register_key_provider(name: str, cls: type[KeyProvider] | str, *, clobber: bool = False,
                          errtxt: str | None = None, source: bool = False) -> None:
    """Make ``name`` a key-entry field that selects ``cls`` (a class or ``"module:Class"``).

    A string is imported on first use; ``errtxt`` is the hint shown when that import
    fails (e.g. ``pip install cryptdisk-kms-aws``). ``source=True`` registers a
    provider that keeps its key (a :class:`~cryptdisk.keys.RemoteKeyProvider`),
    selected by ``source = "NAME"`` rather than by a field; its name may contain
    hyphens. Refuses to replace a provider unless ``clobber``.
    """
    plain = name.replace("-", "_") if source and isinstance(name, str) else name
    if not isinstance(plain, str) or not plain.isidentifier() or name in (
            "id", "algorithm", "source"):
        raise ValueError(f"a key provider name must be an identifier other than id, "
                         f"algorithm and source, not {name!r}")
    if not clobber and (name in _KNOWN or name in _loaded):
        raise ValueError(f"a key provider named {name!r} is already registered "
                         "(clobber=True replaces it)")
    if source:
        _SOURCES.add(name)
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

    An entry whose provider keeps its key (``source = "NAME"``) has empty material
    and its :class:`~cryptdisk.keys.ProviderKey` in ``key``. The material is not in
    ``repr`` and the entry cannot be pickled.
    """

    key_id: int
    source: str
    material: bytes = field(repr=False)
    algorithm: Any = None
    key: Any = field(default=None, repr=False)

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
    if "source" in entry:
        return _parse_source_entry(entry, path=path, where=where, base=base,
                                   default_id=default_id, algorithm_field=algorithm_field,
                                   default_algorithm=default_algorithm)
    providers = [n for n in key_provider_names() if n not in exclude and n not in _SOURCES]
    fields = {"id", "source", *providers, *(("algorithm",) if algorithm_field else ())}
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


def _parse_source_entry(entry: Mapping[str, Any], *, path: str | None, where: str,
                        base: str | None, default_id: int | None, algorithm_field: bool,
                        default_algorithm: Any) -> KeyEntry:
    """``source = "NAME"``: a provider that keeps its key (:class:`RemoteKeyProvider`)."""
    from ._kek import wrapped_provider
    from ._remote import COMMON_FIELDS, ProviderKey, RemoteKeyProvider, RetryPolicy, UnwrapCache

    key_id = entry.get("id", default_id)
    if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id <= _MAX_ID:
        raise ConfigError("each key needs an integer id (0 to 2**64-1)", path=path, where=where)
    name = entry["source"]
    if not isinstance(name, str) or (name not in _SOURCES and name not in _KNOWN):
        raise ConfigError(f"key {key_id}: unknown source {name!r} (sources: "
                          f"{', '.join(sorted(_SOURCES))})", path=path, where=where)
    rest = {k: v for k, v in entry.items() if k not in ("id", "source", "algorithm")}
    if "algorithm" in entry and not algorithm_field:
        raise ConfigError(f"key {key_id}: algorithm is not taken here", path=path, where=where)
    cache_args = {}
    for field_name, arg in (("cache_entries", "entries"), ("cache_seconds", "seconds")):
        if field_name in rest:
            cache_args[arg] = rest.pop(field_name)
    retry_args = {}
    for field_name, arg in (("retries", "retries"), ("retry_seconds", "seconds")):
        if field_name in rest:
            retry_args[arg] = rest.pop(field_name)
    try:
        cls = get_key_provider(name)
        if not issubclass(cls, RemoteKeyProvider):
            raise ConfigError(f"key {key_id}: {name} is a field provider; write {name} = ... "
                              "instead of source", path=path, where=where)
        try:
            provider = wrapped_provider(cls, rest, base if base is not None else os.getcwd())
            cache = UnwrapCache(**cache_args)
            retry = RetryPolicy(**retry_args)
        except TypeError as exc:
            raise ConfigError(f"key {key_id}: {name} {exc}", path=path, where=where) from None
        except ValueError as exc:
            raise ConfigError(f"key {key_id}: {exc} ({', '.join(sorted(COMMON_FIELDS))})",
                              path=path, where=where) from None
        algorithm = entry.get("algorithm", default_algorithm) if algorithm_field else None
        key = ProviderKey(key_id, provider, algorithm=algorithm, cache=cache, retry=retry,
                          what=f"key {key_id}")
    except ConfigError:
        raise
    except (KeyringError, ValueError) as exc:
        raise with_location(exc, path, where) from None
    return KeyEntry(key_id, cls.label, b"", key.algorithm, key)
