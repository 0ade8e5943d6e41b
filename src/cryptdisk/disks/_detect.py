"""Recognising a file's format by its header and opening it with the right key.

:func:`open_any` and :func:`describe` serve the CLI's ``cat``, ``decrypt``,
``verify``, ``inspect`` and ``convert``: a file may be cryptdisk's (``CRYPTDSK``
header, key chosen by id and check value), ClickHouse's (``ENC`` header, key
chosen by fingerprint among every ``clickhouse`` disk's keys) or, where the
caller allows it, plaintext. The keys come from a keyring or from anything shaped
like a loaded config (:class:`ConfigKeys`; :func:`cryptdisk.config.load_config`
returns one): this layer never loads a config itself.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from typing import IO, Any, Protocol, cast

from ..errors import KeyNotFoundError, NotEncryptedError
from ..format import (
    HEADER_SIZE,
    MAGIC,
    Header,
    Kind,
    open_file,
    read_named_header,
    sealed_layout,
    store_layout,
)
from ..keys import Key, Keyring
from ._clickhouse import (
    CH_HEADER_SIZE,
    ClickHouseKey,
    PreadSource,
    ch_module,
    find_clickhouse_key,
    header_algorithm_name,
)
from ._files import FdReader, PreadFile

__all__ = ["ConfigKeys", "describe", "detect_format", "open_any"]


class ConfigKeys(Protocol):
    """The keys of a loaded config, as detection needs them (``cryptdisk.config.Config``)."""

    path: str

    def cryptdisk_keys(self) -> Sequence[Key]: ...

    def clickhouse_keys(self) -> Sequence[ClickHouseKey]: ...


def detect_format(head: bytes) -> str:
    """``"cryptdisk"``, ``"clickhouse"`` or ``"plain"`` from a file's first bytes."""
    if head[: len(MAGIC)] == MAGIC:
        return "cryptdisk"
    if len(head) >= CH_HEADER_SIZE and head[:3] == b"ENC":
        try:
            if ch_module().is_clickhouse_header(head[:CH_HEADER_SIZE]):
                return "clickhouse"
        except ImportError:
            return "clickhouse"
    return "plain"


def _cryptdisk_key(header: Header, keys: list[Key], path: str) -> Keyring:
    """The key the header names, and every other key that is alone with its id.

    The others are there because a rewrap (``cryptdisk keys rotate``) may replace the
    header between this read and :func:`open_file`'s: the file then names the new
    current key, which opens it as well. An id that two different keys share (a
    keyring and a disk of the config each with their own key 1) is left out but for
    the key this header names, chosen by its check value.
    """
    same_id = [k for k in keys if k.key_id == header.key_id]
    chosen = next((k for k in same_id if hmac.compare_digest(k.check_value, header.key_check)),
                  same_id[0] if same_id else None)  # other material: open_header says so
    if chosen is None:
        known = ", ".join(str(i) for i in sorted({k.key_id for k in keys})) or "none"
        raise KeyNotFoundError(
            f"{path}: no key with id {header.key_id} in the config or keyring (key ids: {known})",
            key_id=header.key_id, path=path,
            hint=f"add the key with id {header.key_id}; it encrypted this file")
    by_id: dict[int, Key | None] = {}
    for key in keys:
        if key.key_id == chosen.key_id:
            continue
        seen = by_id.get(key.key_id, key)
        same = seen is not None and hmac.compare_digest(seen.check_value, key.check_value)
        by_id[key.key_id] = seen if same else None
    others = [k for k in by_id.values() if k is not None]
    return Keyring([chosen, *others], current_key_id=chosen.key_id)


def _names_one_of(header: Header, keys: list[Key]) -> bool:
    return any(k.key_id == header.key_id and hmac.compare_digest(k.check_value, header.key_check)
               for k in keys)


def open_any(path: str | os.PathLike[str], *, config: ConfigKeys | None = None,
             keyring: Keyring | None = None, allow_plain: bool = False) -> IO[bytes]:
    """Open a cryptdisk, ClickHouse (or, with ``allow_plain``, plain) file for reading.

    The result is seekable, has ``size`` and a thread-safe ``pread``, and
    returns only authenticated plaintext for cryptdisk files (ClickHouse's
    format has no authentication). Raises :class:`KeyNotFoundError` naming the
    file and the key id or fingerprint when no configured key fits, and
    :class:`NotEncryptedError` for plaintext unless ``allow_plain``.
    """
    name = os.fspath(path)
    cfg = config
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            head = os.pread(fd, HEADER_SIZE, 0)
        except OSError as exc:  # a directory opens but does not read: name it
            raise type(exc)(exc.errno, exc.strerror, name) from None
        kind = detect_format(head)
        if kind == "cryptdisk":
            keys = list(keyring) if keyring is not None else []
            keys += cfg.cryptdisk_keys() if cfg is not None else []
            # a rewrap may be writing the header: read it again until it names one of the
            # keys or stays the same (open_file then reads it again until it opens)
            header = read_named_header(lambda: os.pread(fd, HEADER_SIZE, 0), name,
                                       lambda h: _names_one_of(h, keys))
            os.close(fd)
            fd = -1
            return open_file(name, "rb", keys=_cryptdisk_key(header, keys, name))  # type: ignore[return-value]
        raw = PreadFile(FdReader(fd), name, {"format": "plain"})
        fd = -1
        if kind == "plain":
            if allow_plain:
                return cast("IO[bytes]", raw)
            raw.close()
            raise NotEncryptedError(f"{name}: not an encrypted file (no cryptdisk or "
                                    "ClickHouse ENC header)")
        return _open_clickhouse(raw, name, cfg)
    finally:
        if fd >= 0:
            os.close(fd)


def _open_clickhouse(raw: PreadFile, name: str, cfg: ConfigKeys | None) -> IO[bytes]:
    ch = ch_module()
    try:
        header = ch.CHHeader.parse(raw.pread(0, CH_HEADER_SIZE), name)
        fingerprint = bytes(header.fingerprint)
        where = f"the config {cfg.path}" if cfg else "the config (none given)"
        key = find_clickhouse_key(header, list(cfg.clickhouse_keys()) if cfg else [], name,
                                  where)
        reader = ch.CHReader(PreadSource(raw), header, key, name)
    except BaseException:
        raw.close()
        raise
    info = {"format": "clickhouse", "fingerprint": fingerprint.hex(),
            "algorithm": header_algorithm_name(header)}
    return cast("IO[bytes]", PreadFile(reader, name, info))


def describe(path: str | os.PathLike[str], *, config: ConfigKeys | None = None,
             ) -> dict[str, Any]:
    """What a file's header says (for ``cryptdisk inspect``); never key material.

    Keys: ``format`` (cryptdisk / clickhouse / plain), ``version``, ``algorithm``,
    ``key_id`` or ``key_fingerprint`` (hex), ``segment_size``, ``kind``,
    ``plaintext_size``, ``stored_size``. For a ClickHouse file and a config that
    holds its key, ``key_id`` is that key's id in the config.
    """
    name = os.fspath(path)
    with open(name, "rb") as f:
        head = f.read(HEADER_SIZE)
        stored = os.fstat(f.fileno()).st_size
        kind = detect_format(head)
        if kind == "cryptdisk":  # read again while it changes (a rewrap writing it)
            header = read_named_header(lambda: os.pread(f.fileno(), HEADER_SIZE, 0), name)
    out: dict[str, Any] = {"path": name, "format": kind, "stored_size": stored}
    if kind == "cryptdisk":
        if header.kind == Kind.SEALED:
            plaintext_size = sealed_layout(stored, header.segment_size, name)[1]
        else:
            plaintext_size = store_layout(stored, header, name)[1]
        out.update(version=head[8], kind=header.kind_name,
                   algorithm=header.algorithm.label.lower(), key_id=header.key_id,
                   segment_size=header.segment_size, plaintext_size=plaintext_size)
    elif kind == "clickhouse":
        header = ch_module().CHHeader.parse(head[:CH_HEADER_SIZE], name)
        fingerprint = bytes(header.fingerprint)
        out.update(version=getattr(header, "version", None),
                   algorithm=header_algorithm_name(header),
                   key_fingerprint=fingerprint.hex(),
                   plaintext_size=stored - CH_HEADER_SIZE)
        if header.version == 1:
            out["key_id"] = header.key_id
        for key in config.clickhouse_keys() if config else []:
            if header.version == 2 and hmac.compare_digest(key.fingerprint, fingerprint):
                out["key_id"] = key.key_id
                break
    else:
        out["plaintext_size"] = stored
    return out
