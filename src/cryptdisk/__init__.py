"""cryptdisk: transparent, authenticated encryption at rest for analytical and transactional data.

The easy tier::

    import cryptdisk

    keyring = cryptdisk.Keyring.from_config("cryptdisk.toml")
    with cryptdisk.open("data.bin", "wb", keyring=keyring) as f:
        f.write(b"secret")
    with cryptdisk.open("data.bin", "rb", keyring=keyring) as f:
        assert f.read() == b"secret"

Lower tiers live in :mod:`cryptdisk.format` (segments, headers, data keys) and
:mod:`cryptdisk.keys`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, overload

from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .format import Algorithm, MutableFile, SealedReadFile, SealedWriteFile
from .format import open_file as _open_file
from .keys import Key, Keyring

if TYPE_CHECKING:
    from .db import Database

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Database":  # lazy, as connect is: keeps ``import cryptdisk`` light
        from .db import Database

        return Database
    raise AttributeError(f"module 'cryptdisk' has no attribute {name!r}")


def connect(path: str | os.PathLike[str], config: Any = None, **options: Any) -> Database:
    """Open (or create) an embedded database in directory ``path``.

    With no ``config`` every table is encrypted under a key generated on first
    use into ``PATH.key`` beside the directory (mode 0600; losing it loses the
    data). See :func:`cryptdisk.db.connect` for the options.
    """
    from .db import connect as _connect  # lazy: keeps ``import cryptdisk`` light

    return _connect(path, config, **options)


@overload
def open(file: str | os.PathLike[str], mode: Literal["rb"] = ..., *, keyring: Keyring,
         algorithm: str | Algorithm | None = ...,
         segment_size: int = ...) -> SealedReadFile | MutableFile: ...
@overload
def open(file: str | os.PathLike[str], mode: Literal["wb", "xb"], *, keyring: Keyring,
         algorithm: str | Algorithm | None = ..., segment_size: int = ...) -> SealedWriteFile: ...
@overload
def open(file: str | os.PathLike[str], mode: Literal["r+b", "w+b", "x+b", "ab", "a+b"], *,
         keyring: Keyring, algorithm: str | Algorithm | None = ...,
         segment_size: int = ...) -> MutableFile: ...
@overload
def open(file: str | os.PathLike[str], mode: str, *, keyring: Keyring,
         algorithm: str | Algorithm | None = ...,
         segment_size: int = ...) -> SealedReadFile | SealedWriteFile | MutableFile: ...


def open(
    file: str | os.PathLike[str],
    mode: str = "rb",
    *,
    keyring: Keyring,
    algorithm: str | Algorithm | None = None,
    segment_size: int = 64 * 1024,
) -> SealedReadFile | SealedWriteFile | MutableFile:
    """Open an encrypted file and return a standard binary file object.

    Modes:

    - ``"rb"``: read a sealed or mutable file; seekable, random access, and
      every byte returned has been authenticated.
    - ``"wb"`` / ``"xb"``: write a new *sealed* file as a stream. It is
      published atomically on ``close()`` (fsync, then rename); an exception in
      a ``with`` block leaves any previous file untouched.
    - ``"w+b"``, ``"x+b"``, ``"r+b"``, ``"ab"``, ``"a+b"``: a *mutable* file
      (random writes, appends, truncate), for page stores and journals.

    New files use ``keyring.current_key()``; reading finds the key by the id in
    the file's header. ``segment_size`` (a power of two, 512 B to 16 MiB) and
    ``algorithm`` (default: the current key's) apply to new files only.
    """
    return _open_file(file, mode, keys=keyring, algorithm=algorithm, segment_size=segment_size)


__all__ = [
    "Algorithm",
    "Database",
    "Key",
    "Keyring",
    "MutableFile",
    "SealedReadFile",
    "SealedWriteFile",
    "__version__",
    "connect",
    "open",
    *_errors_all,
]
