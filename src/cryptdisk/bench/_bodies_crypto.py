"""Worker bodies of the crypto experiment (each runs in a fresh process).

Buffers are allocated once and reused, as the format does; the ciphertext
of raw AES-GCM goes to a reused output buffer. ``threads`` threads share the
work equally; ``cryptography`` >= 50 releases the GIL on buffers of 2 KiB or more.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ._measure import Sample, Stopwatch

__all__ = ["format_decrypt", "format_encrypt", "noop", "plain_file", "random_reads", "raw_aesgcm",
           "stream_op"]

CHUNK = 64 * 1024  # raw AES-GCM buffer = the format's segment size
IO_CHUNK = 256 * 1024  # what the format is fed / read with (4 segments)
_NONCE = struct.Struct(">4xQ")


def _parallel(threads: int, fn: Callable[[int], None]) -> None:
    if threads == 1:
        fn(0)
        return
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=guarded, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def raw_aesgcm(total: int, threads: int, direction: str, case: str,
               stream: bool = False) -> list[Sample]:
    """``encrypt_into``/``decrypt_into`` of 64 KiB buffers, ``total`` bytes in all.

    By default one cache-hot buffer is reused; with ``stream`` the input is
    ``total`` bytes held in memory, read once (what a reader of a big file does).
    """
    aead = AESGCM(os.urandom(32))
    per = total // threads // CHUNK
    plain = os.urandom(CHUNK)
    sealed = aead.encrypt(_NONCE.pack(0), plain, None)
    one = plain if direction == "encrypt" else sealed
    rec = len(one)
    inputs = [memoryview(one * per if stream else one) for _ in range(threads)]

    def work(i: int) -> None:
        src = inputs[i]
        out = bytearray(CHUNK + 16)
        nonce = _NONCE.pack(0)
        if direction == "encrypt":
            for n in range(per):
                at = n * rec if stream else 0
                aead.encrypt_into(_NONCE.pack(n), src[at:at + rec], None, out)
        else:
            dst = memoryview(out)[:CHUNK]
            for n in range(per):
                at = n * rec if stream else 0
                aead.decrypt_into(nonce, src[at:at + rec], None, dst)

    with Stopwatch() as sw:
        _parallel(threads, work)
    return [sw.rate(case, per * CHUNK * threads, unit="GB/s", scale=1e9)]


class _NullSink:
    def write(self, data: bytes | bytearray | memoryview) -> int:
        return len(data)


class _MemorySource:
    """Ciphertext held in memory (the format's lower tier accepts any Source)."""

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        self._mv = memoryview(data)

    def view(self, offset: int, n: int) -> memoryview:
        return self._mv[offset : offset + n]

    def release(self, offset: int, n: int) -> None:
        pass

    def willneed(self, offset: int, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _keyring(key_hex: str):  # type: ignore[no-untyped-def]
    from ..keys import Keyring

    return Keyring.single(bytes.fromhex(key_hex))


def format_encrypt(total: int, threads: int, key_hex: str, sink: str, workdir: str,
                   case: str, chunk_size: int = IO_CHUNK) -> list[Sample]:
    """SealedWriter fed ``chunk_size`` writes; ``sink`` is ``memory`` (discarded) or ``file``."""
    from ..format import Kind, SealedWriter, new_header

    key = _keyring(key_hex).current_key()
    per = total // threads // chunk_size
    chunk = bytearray(os.urandom(chunk_size))

    def work(i: int) -> None:
        header, dek = new_header(Kind.SEALED, key)
        if sink == "memory":
            writer = SealedWriter(_NullSink(), header, dek)  # type: ignore[arg-type]
            for _ in range(per):
                writer.write(chunk)
            writer.close()
            return
        with open(os.path.join(workdir, f"enc-{os.getpid()}-{i}.bin"), "wb", buffering=0) as f:
            writer = SealedWriter(f, header, dek)
            for _ in range(per):
                writer.write(chunk)
            writer.close()

    with Stopwatch() as sw:
        _parallel(threads, work)
    for name in os.listdir(workdir):
        if name.startswith(f"enc-{os.getpid()}-"):
            os.unlink(os.path.join(workdir, name))
    return [sw.rate(case, per * chunk_size * threads, unit="GB/s", scale=1e9)]


def format_decrypt(path: str, threads: int, key_hex: str, source: str, case: str) -> list[Sample]:
    """Sequential 256 KiB ``readinto`` of a sealed file, one range per thread.

    ``source`` ``memory``: the ciphertext is loaded first, then decrypted through
    :class:`~cryptdisk.format.SealedReader`; ``file``: :func:`cryptdisk.open`
    (a memory map of the page-cached file).
    """
    import cryptdisk

    from ..format import SealedReader, open_header, read_header

    keyring = _keyring(key_hex)
    data = open(path, "rb").read() if source == "memory" else b""
    if source == "memory":
        header = read_header(open(path, "rb"), path)
        reader = SealedReader(_MemorySource(data), header, open_header(header, keyring))
        size = reader.size
    else:
        with cryptdisk.open(path, "rb", keyring=keyring) as f:
            size = f.size
    span = size // threads // IO_CHUNK * IO_CHUNK

    def work(i: int) -> None:
        buf = bytearray(IO_CHUNK)
        if source == "memory":
            for off in range(i * span, (i + 1) * span, IO_CHUNK):
                reader.readinto_at(buf, off)
            return
        with cryptdisk.open(path, "rb", keyring=keyring) as f:
            f.seek(i * span)
            for _ in range(span // IO_CHUNK):
                f.readinto(buf)

    with Stopwatch() as sw:
        _parallel(threads, work)
    return [sw.rate(case, span * threads, unit="GB/s", scale=1e9)]


def random_reads(path: str, key_hex: str | None, block: int, duration: float,
                 case: str) -> list[Sample]:
    """Random block-aligned reads for ``duration`` s: ``pread`` of cryptdisk or of the OS."""
    import cryptdisk

    rng = random.Random(1)
    if key_hex is None:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size

        def read(off: int) -> bytes:
            return os.pread(fd, block, off)
    else:
        f = cryptdisk.open(path, "rb", keyring=_keyring(key_hex))
        size = f.size

        def read(off: int) -> bytes:
            return f.pread(off, block)
    blocks = size // block
    count = 0
    with Stopwatch() as sw:
        deadline = time.perf_counter() + duration
        while time.perf_counter() < deadline:
            for _ in range(64):
                if len(read(rng.randrange(blocks) * block)) != block:
                    raise RuntimeError("short read")
            count += 64
    return [sw.rate(case, count, unit="reads/s", scale=1, work_unit="reads")]


def stream_op(op: str, src: str, dst: str, key_hex: str, case: str) -> list[Sample]:
    """Encrypt, decrypt or verify a whole file through the public API, 1 MiB at a time."""
    import cryptdisk

    keyring = _keyring(key_hex)
    buf = bytearray(1 << 20)
    with Stopwatch() as sw:
        if op == "encrypt":
            with open(src, "rb", buffering=0) as fin, \
                    cryptdisk.open(dst, "wb", keyring=keyring) as fout:
                while n := fin.readinto(buf):
                    fout.write(memoryview(buf)[:n])
            size = os.path.getsize(src)
        elif op == "decrypt":
            with cryptdisk.open(src, "rb", keyring=keyring) as fin, \
                    open(dst, "wb", buffering=0) as fout:
                while n := fin.readinto(buf):
                    fout.write(memoryview(buf)[:n])
                os.fsync(fout.fileno())
            size = os.path.getsize(dst)
        else:
            with cryptdisk.open(src, "rb", keyring=keyring) as fin:
                size = fin.verify()
    return [sw.rate(case, size, unit="MB/s"), _rss_sample(f"{case} (peak RSS)")]


def _rss_sample(case: str) -> Sample:
    from ._measure import peak_rss_mb

    return Sample(case, "MiB peak RSS", peak_rss_mb(), better="lower")


def plain_file(path: str, total: int, threads: int, direction: str, case: str) -> list[Sample]:
    """The unencrypted twin of ``format (file)``: 256 KiB unbuffered writes or ``readinto``."""
    per = total // threads // IO_CHUNK
    chunk = bytearray(os.urandom(IO_CHUNK))

    def work(i: int) -> None:
        if direction == "encrypt":
            with open(f"{path}.{os.getpid()}.{i}", "wb", buffering=0) as f:
                for _ in range(per):
                    f.write(chunk)
            return
        with open(path, "rb", buffering=0) as f:
            f.seek(i * per * IO_CHUNK)
            for _ in range(per):
                f.readinto(chunk)

    with Stopwatch() as sw:
        _parallel(threads, work)
    if direction == "encrypt":
        for i in range(threads):
            os.unlink(f"{path}.{os.getpid()}.{i}")
    return [sw.rate(case, per * IO_CHUNK * threads, unit="GB/s", scale=1e9)]


def noop(case: str) -> list[Sample]:
    """Import cryptdisk and do nothing: the interpreter's own peak RSS (the baseline)."""
    import cryptdisk  # noqa: F401

    return [_rss_sample(case)]
