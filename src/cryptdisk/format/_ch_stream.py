"""ClickHouse's CTR stream: random-access reads and streaming writes.

After the 64-byte header, plaintext byte ``p`` is XORed with byte ``p % 16`` of
``AES_K(u128be((IV + p // 16) mod 2**128))``: one continuous AES-CTR stream
whose counter is the whole 128-bit block (OpenSSL's CTR, which ClickHouse uses,
carries into every byte, so the counter wraps past ``2**128 - 1`` to 0).

Lower tier: nothing here authenticates anything. A wrong key or a flipped
ciphertext bit yields wrong plaintext silently; :func:`check_key` compares the
header's fingerprint with the key, which is the only check the format allows.
"""

from __future__ import annotations

import os
from typing import IO, Any

from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from ..errors import InvalidKeyError, TruncatedFileError, WrongKeyError
from ._ch_header import (
    CH_HEADER_SIZE,
    CHAlgorithm,
    CHHeader,
    clickhouse_fingerprint,
    clickhouse_v1_key_hash,
)
from ._source import Source

__all__ = ["CHUNK_SIZE", "CHReader", "CHWriter", "check_key", "counter_block"]

#: Work in chunks of this many bytes (bounded buffers, cache friendly).
CHUNK_SIZE = 1 << 20
_MOD = 1 << 128
_BLOCK = 16


def counter_block(iv: int, offset: int) -> bytes:
    """The 16-byte CTR counter block of the block holding plaintext ``offset``."""
    return ((iv + offset // _BLOCK) % _MOD).to_bytes(_BLOCK, "big")


def _ctr_at(key: bytes, iv: int, offset: int) -> CipherContext:
    """A CTR context positioned at plaintext ``offset`` (encrypt = decrypt in CTR)."""
    ctx = Cipher(algorithms.AES(key), modes.CTR(counter_block(iv, offset))).encryptor()
    skip = offset % _BLOCK
    if skip:
        ctx.update(bytes(skip))  # discard the keystream bytes before the offset
    return ctx


def _key_bytes(key: bytes | bytearray | memoryview, algorithm: CHAlgorithm) -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"key must be bytes, not {type(key).__name__}")
    if len(key) != algorithm.key_size:
        raise InvalidKeyError(f"{algorithm.name.lower()} needs a {algorithm.key_size}-byte key, "
                         f"not {len(key)} bytes")
    return bytes(key)


def check_key(header: CHHeader, key: bytes | bytearray | memoryview,
              path: str | None = None) -> None:
    """Raise :class:`WrongKeyError` unless ``key`` is the key the header names.

    Version 2 compares the 128-bit fingerprint. Version 1 only stores a 4-bit
    hash of the key, so a wrong key passes this check one time in 16.
    """
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"key must be bytes, not {type(key).__name__}")
    where = f"{path}: " if path else ""
    alg = header.algorithm
    if len(key) != alg.key_size:
        raise WrongKeyError(
            f"{where}the file is {alg.name.lower()} and needs a {alg.key_size}-byte key; "
            f"the key given is {len(key)} bytes", key_id=header.key_id, path=path)
    if header.version == 2:
        if clickhouse_fingerprint(key) != header.key_fingerprint:
            raise WrongKeyError(
                f"{where}the key given is not the file's key ({header.describe_key()})",
                key_id=None, path=path,
                hint="give the key whose ClickHouse fingerprint the file names")
    elif header.v1_key_hash is not None and clickhouse_v1_key_hash(key) != header.v1_key_hash:
        raise WrongKeyError(
            f"{where}the key given is not the file's key ({header.describe_key()}): "
            "its check value differs", key_id=header.key_id, path=path)


class _NoPickle:
    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} holds a key and cannot be pickled; "
                        "reopen the file with open_clickhouse in the other process")


class CHReader(_NoPickle):
    """Positional, thread-safe decryption of a ClickHouse file over a :class:`Source`.

    ``size`` is the plaintext size. No state changes after construction, so
    several threads may call :meth:`readinto_at` / :meth:`read_at` at once.
    """

    def __init__(self, source: Source, header: CHHeader, key: bytes | bytearray | memoryview,
                 path: str | None = None) -> None:
        self._key = _key_bytes(key, header.algorithm)
        self._src = source
        self._iv = header.iv_int
        self.header = header
        self.path = path
        if source.size < CH_HEADER_SIZE:
            raise TruncatedFileError(
                f"{path or 'file'}: shorter than the {CH_HEADER_SIZE}-byte ClickHouse header",
                offset=source.size, path=path)
        self.size = source.size - CH_HEADER_SIZE

    def __repr__(self) -> str:
        return f"<CHReader {self.path!r} {self.header.algorithm.name} size={self.size}>"

    def readinto_at(self, buf: Any, offset: int) -> int:
        """Decrypt up to ``len(buf)`` bytes at plaintext ``offset`` into ``buf``; returns n."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        out = memoryview(buf).cast("B")
        n = max(0, min(len(out), self.size - offset))
        if n == 0:
            return 0
        ctx = _ctr_at(self._key, self._iv, offset)
        done = 0
        while done < n:
            step = min(CHUNK_SIZE, n - done)
            src = self._src.view(CH_HEADER_SIZE + offset + done, step)
            if len(src) < step:
                raise TruncatedFileError(f"{self.path or 'file'}: shrank while being read",
                                         offset=CH_HEADER_SIZE + offset + done + len(src),
                                         path=self.path)
            ctx.update_into(src, out[done : done + step])
            done += step
        return n

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` plaintext bytes at ``offset`` (fewer at end of file)."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        if n <= CHUNK_SIZE:
            src = self._src.view(CH_HEADER_SIZE + offset, n)
            if len(src) == n:
                return _ctr_at(self._key, self._iv, offset).update(src)
        buf = bytearray(n)
        got = self.readinto_at(buf, offset)
        return bytes(memoryview(buf)[:got])

    def close(self) -> None:
        """Release the source."""
        self._src.close()


def _write_all(raw: IO[bytes], data: memoryview) -> None:
    while len(data):
        written = raw.write(data)
        if written is None:
            raise BlockingIOError("the underlying file would block")
        data = data[written:]


class CHWriter(_NoPickle):
    """Write a ClickHouse file as a stream: the header, then the ciphertext.

    The header is written with the first non-empty :meth:`write`, so a file
    with no data stays 0 bytes, as ClickHouse writes empty files.
    :meth:`close` flushes ``raw`` but does not close it. ``position`` is the
    plaintext size written so far (including what an appended file held).
    """

    def __init__(self, raw: IO[bytes], key: bytes | bytearray | memoryview,
                 algorithm: str | int | CHAlgorithm | None = None, *,
                 iv: bytes | None = None) -> None:
        alg = CHAlgorithm.for_key(key) if algorithm is None else CHAlgorithm.parse(algorithm)
        key_bytes = _key_bytes(key, alg)
        iv = os.urandom(16) if iv is None else bytes(iv)
        header = CHHeader(2, alg, clickhouse_fingerprint(key_bytes), None, iv)
        self._setup(raw, key_bytes, header, 0)

    @classmethod
    def resume(cls, raw: IO[bytes], key: bytes | bytearray | memoryview, header: CHHeader,
               position: int) -> CHWriter:
        """Continue the stream of an existing file (ClickHouse's append: same header and IV).

        ``raw`` must be positioned at the end of the file, which holds the
        header and ``position`` bytes of ciphertext. Check the key first
        (:func:`check_key`): appending with a wrong key corrupts the file.
        """
        if position < 0:
            raise ValueError("position must not be negative")
        self = cls.__new__(cls)
        self._setup(raw, _key_bytes(key, header.algorithm), header, position)
        return self

    def _setup(self, raw: IO[bytes], key: bytes, header: CHHeader, position: int) -> None:
        self._raw = raw
        self._key = key
        self.header = header
        self.position = position
        self._header_written = position > 0
        self._ctx: CipherContext | None = None
        self._buf: bytearray | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<CHWriter {self.header.algorithm.name} position={self.position}>"

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Encrypt and write all of ``data``; returns ``len(data)``."""
        if self.closed:
            raise ValueError("write to a closed CHWriter")
        mv = memoryview(data).cast("B")
        if not len(mv):
            return 0
        if not self._header_written:
            _write_all(self._raw, memoryview(self.header.to_bytes()))
            self._header_written = True
        if self._ctx is None:
            self._ctx = _ctr_at(self._key, self.header.iv_int, self.position)
            self._buf = bytearray(min(CHUNK_SIZE, max(len(mv), 4096)))
        assert self._buf is not None
        for start in range(0, len(mv), len(self._buf)):
            part = mv[start : start + len(self._buf)]
            out = memoryview(self._buf)[: len(part)]
            self._ctx.update_into(part, out)
            _write_all(self._raw, out)
        self.position += len(mv)
        return len(mv)

    def close(self) -> None:
        """Finish the stream (CTR has no final block) and flush ``raw``."""
        if not self.closed:
            self.closed = True
            self._ctx = None
            flush = getattr(self._raw, "flush", None)
            if flush is not None:
                flush()
