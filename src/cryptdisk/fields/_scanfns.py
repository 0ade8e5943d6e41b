"""Field functions the embedded database's scan computes (derived columns).

:class:`FieldExtension` is what :func:`._sql.config_hook` gives each database: the
field keys of its config (read again before a statement when the config file or a key
file it names changed: a key version added, a key removed or a key file replaced reaches
the next statement, and the database drops the derived columns computed under the old
keys), and the binders of the
functions the scan may compute over whole Arrow arrays (``cryptdisk.db._derived``):
``decrypt``, ``decrypt_deterministic``, ``fpe_decrypt``, ``detokenize``, ``mask_full``,
``mask_last4``, ``mask_email``, ``mask_null`` and ``mask_hash``, with the same
arguments, defaults and output as their SQL forms (:mod:`._sql`). A call the binder
does not take (an unknown key, an argument that is not a constant of the right type)
stays a DuckDB function call, which reports the error as usual.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ..errors import CryptdiskError
from ..keys import file_stamp
from ._aead import decrypt, decrypt_deterministic
from ._fpe import fpe_decrypt
from ._keys import FieldKey, FieldKeys
from ._mask import mask_email, mask_full, mask_hash, mask_last4, mask_null
from ._tokens import detokenize

__all__ = ["FieldExtension"]


class _Step:
    """One bound call: ``fn(values)``; ``tag`` names it for the cache (no key material);
    ``takes_bytes``: it also takes a ``BLOB`` column (the decrypting functions)."""

    def __init__(self, tag: str, fn: Callable[[pa.Array], pa.Array],
                 takes_bytes: bool = False) -> None:
        self.tag, self._fn, self.takes_bytes = tag, fn, takes_bytes

    def __call__(self, values: pa.Array) -> pa.Array:
        return self._fn(values)

    def __repr__(self) -> str:
        return f"<scan function {self.tag!r}>"


def _config_path(config: Any) -> str | None:
    path = getattr(config, "path", None)
    return path if isinstance(path, str) and not path.endswith(".xml") else None


class FieldExtension:
    """A database's field keys and scan functions (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.path = _config_path(config)
        keys = getattr(config, "cryptdisk_keys", None)
        self._at_rest = keys() if callable(keys) else []  # a field key must not be one
        self._lock = threading.Lock()
        self.generation = 0
        self._nonce = secrets.token_hex(8)  # tags of this connection's keys only
        self._files: tuple[str, ...] = ()
        self._stamp: tuple[Any, ...] = ()
        self.keys = self._reload()
        self.scan_functions = self._binders()

    def cursor_setup(self, cursor: Any) -> None:
        """On a :class:`cryptdisk.db.Reader`'s cursor: the field functions' temporary
        macros (the Python functions are the database instance's already)."""
        from ._sql import register_temp_macros

        register_temp_macros(cursor)

    def _stat(self, files: tuple[str, ...]) -> tuple[Any, ...]:
        """What changes when the config or one of ``files`` (its key files) is rewritten
        or replaced; the config's stamp comes first."""
        if self.path is None:
            return ()
        return (file_stamp(self.path), *map(file_stamp, files))

    def _load(self) -> FieldKeys:
        if self.path is None or not os.path.isfile(self.path):
            return FieldKeys()
        return FieldKeys.from_config(self.path, at_rest=self._at_rest)

    def current(self) -> FieldKeys:
        return self.keys

    def _reload(self) -> FieldKeys:
        """The field keys read again, the stamp of what they were read from taken first
        (a file changed during the read differs from it at the next check): the config,
        then its key files as the config names them at that moment."""
        if self.path is None:
            return self._load()
        config = file_stamp(self.path)
        files = FieldKeys.key_files(self.path)
        stamp = (config, *map(file_stamp, files))
        keys = self._load()  # raises (a broken config or key file): the old keys stay
        self._files, self._stamp = files, stamp
        return keys

    def refresh(self) -> bool:
        """Read the field keys again if the config file or one of its key files changed
        (an ``os.stat`` of each per call); True if they did."""
        if self._stat(self._files) == self._stamp:
            return False
        with self._lock:
            if self._stat(self._files) == self._stamp:
                return False
            self.keys = self._reload()
            self.generation += 1
        return True

    # -- binders -----------------------------------------------------------------------

    def _key(self, name: Any) -> FieldKey | None:
        if not isinstance(name, str):
            return None
        try:
            return self.keys[name]
        except CryptdiskError:
            return None

    def _tag(self, fn: str, key: FieldKey, *options: Any) -> str:
        return (f"{fn}{options!r}@{key.name}:{','.join(map(str, key.ids))}"
                f"#{self._nonce}.{self.generation}")

    def _binders(self) -> dict[str, Callable[[list[Any], dict[str, Any]], Any]]:
        def keyed(name: str, fn: Callable[[pa.Array, FieldKey], pa.Array],
                  takes_bytes: bool = False) -> Any:
            def bind(args: list[Any], named: dict[str, Any]) -> Any:
                key = self._key(args[0]) if len(args) == 1 and not named else None
                if key is None:
                    return None
                return _Step(self._tag(name, key), lambda v: fn(v, key), takes_bytes)
            return bind

        def version_of(key: FieldKey, named: dict[str, Any]) -> tuple[bool, int | None]:
            """(whether the scan takes the call, the version): a key of several
            versions without one stays a DuckDB call, which says what is missing."""
            version = named.get("version")
            if version is None:
                return len(key.ids) == 1, None
            return (isinstance(version, int) and not isinstance(version, bool)
                    and version in key.ids), version

        def fpe(args: list[Any], named: dict[str, Any]) -> Any:
            key = self._key(args[0]) if len(args) == 1 else None
            col, alphabet = named.get("col", ""), named.get("alphabet", "digits")
            if key is None or set(named) - {"col", "alphabet", "version"} or \
                    not isinstance(col, str) or not isinstance(alphabet, str):
                return None
            ok, version = version_of(key, named)
            if not ok:
                return None
            return _Step(self._tag("fpe_decrypt", key, col, alphabet, version),
                         lambda v: fpe_decrypt(v, key, col, alphabet=alphabet,
                                               version=version))

        def detok(args: list[Any], named: dict[str, Any]) -> Any:
            key = self._key(args[0]) if len(args) == 1 else None
            col = named.get("col", "")
            first, last = named.get("keep_first", 0), named.get("keep_last", 0)
            luhn = named.get("luhn", False)
            if key is None or \
                    set(named) - {"col", "keep_first", "keep_last", "luhn", "version"} or \
                    not isinstance(col, str) or not isinstance(luhn, bool) or \
                    isinstance(first, bool) or isinstance(last, bool) or \
                    not isinstance(first, int) or not isinstance(last, int):
                return None
            ok, version = version_of(key, named)
            if not ok:
                return None
            return _Step(self._tag("detokenize", key, col, first, last, luhn, version),
                         lambda v: detokenize(v, key, col, keep_first=first, keep_last=last,
                                              luhn=luhn, version=version))

        def hashed(args: list[Any], named: dict[str, Any]) -> Any:
            key = self._key(args[0]) if len(args) == 1 else None
            if key is None or set(named) - {"version"}:
                return None
            ok, version = version_of(key, named)
            if not ok:
                return None
            return _Step(self._tag("mask_hash", key, version),
                         lambda v: mask_hash(v, key, version=version))

        def keyless(name: str, fn: Callable[[pa.Array], pa.Array]) -> Any:
            step = _Step(name, fn)

            def bind(args: list[Any], named: dict[str, Any]) -> Any:
                return step if not args and not named else None
            return bind

        return {
            "decrypt": keyed("decrypt", lambda v, k: decrypt(v, k), True),
            "decrypt_deterministic": keyed("decrypt_deterministic",
                                           lambda v, k: decrypt_deterministic(v, k), True),
            "fpe_decrypt": fpe,
            "detokenize": detok,
            "mask_hash": hashed,
            "mask_full": keyless("mask_full", mask_full),
            "mask_last4": keyless("mask_last4", mask_last4),
            "mask_email": keyless("mask_email", mask_email),
            "mask_null": keyless("mask_null", lambda v: mask_null(v).cast(pa.string())),
        }
