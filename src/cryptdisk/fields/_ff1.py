"""FF1 (NIST SP 800-38G Rev. 1, section 5.1) over batches of numeral strings.

Lower tier, easy to misuse: this is the bare mode. :func:`cryptdisk.fields.fpe_encrypt`
adds alphabets, per-column tweaks and key handling.

Why it is built here: the FF1 packages on PyPI are unmaintained (``fpe`` 0.1.2,
2021, pure Python per value) or implement only FF3 (``ff3``, whose FF3-1 revision
NIST is withdrawing). FF1 is a mode of operation, a Feistel network whose round
function is AES-CBC-MAC (its PRF) and AES-ECB (to stretch it), not a cipher
primitive: the AES itself is ``cryptography``'s. What this module adds is the
batching: every value of a batch has the same length, so each round makes one
AES-ECB call over all of them, and the round arithmetic runs on numpy ``uint64``
vectors when ``radix**ceil(n/2) <= 2**32`` (16-digit card numbers and shorter);
longer inputs use Python integers per value, still with one AES call per round.

The Rev. 1 minimum domain, ``radix**n >= 1,000,000``, is enforced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FieldError

__all__ = ["MIN_DOMAIN", "ff1_decrypt", "ff1_encrypt"]

MIN_DOMAIN = 1_000_000
_FAST = 2**32


def _params(radix: int, n: int, tweak: bytes) -> tuple[int, int, int, int, bytes]:
    if not 2 <= radix <= 2**16:
        raise FieldError(f"FF1 radix must be 2 to 65536, not {radix}")
    if n < 2 or n > 2**32 - 1:
        raise FieldError(f"FF1 needs 2 or more numerals, not {n}")
    if radix**n < MIN_DOMAIN:
        raise FieldError(f"FF1 domain too small: {radix}**{n} values is under "
                         f"{MIN_DOMAIN:,} (NIST SP 800-38G Rev. 1); protect longer values "
                         "or use a larger alphabet")
    u = n // 2
    v = n - u
    b = ((radix**v - 1).bit_length() + 7) // 8
    d = 4 * ((b + 3) // 4) + 4
    t = len(tweak)
    p = (bytes([1, 2, 1]) + radix.to_bytes(3, "big") + bytes([10, u % 256])
         + n.to_bytes(4, "big") + t.to_bytes(4, "big"))
    return u, v, b, d, p


def _ecb(cipher: Any, blocks: np.ndarray) -> np.ndarray:
    enc = cipher.encryptor()
    out = enc.update(blocks.tobytes()) + enc.finalize()
    return np.frombuffer(out, dtype=np.uint8).reshape(blocks.shape)


class _Rounds:
    """The PRF state shared by every value of a batch: P and the tweak's blocks."""

    def __init__(self, cipher: Any, radix: int, n: int, tweak: bytes) -> None:
        self.cipher = cipher
        self.radix = radix
        self.u, self.v, self.b, self.d, p = _params(radix, n, tweak)
        pad = (-len(tweak) - self.b - 1) % 16
        const = tweak + bytes(pad)  # Q's bytes before [i] and NUM(B)
        full = len(const) // 16
        state = np.frombuffer(p, dtype=np.uint8).reshape(1, 16)
        state = _ecb(cipher, state)
        for j in range(full):  # CBC-MAC over P and Q's constant whole blocks, once
            block = np.frombuffer(const[16 * j:16 * j + 16], dtype=np.uint8)
            state = _ecb(cipher, state ^ block)
        self.state = state
        self.head = np.frombuffer(const[16 * full:], dtype=np.uint8)
        self.fast = radix**self.v <= _FAST
        if self.fast:
            # b <= 4, so Q's variable part is one block: head || [i] || [NUM(B)]_b, and
            # d == 8. Per round the AES input is a constant block with NUM(B) xored into
            # its last b bytes: as little-endian u64 words, word 1 ^ byteswap(NUM(B)).
            chained = self.state[0].tobytes()
            self.words = [np.frombuffer(bytes(
                x ^ y for x, y in zip(self.head.tobytes() + bytes([i]) + bytes(self.b),
                                      chained, strict=True)), dtype="<u8")
                for i in range(10)]

    def split(self, x: np.ndarray) -> tuple[Any, Any]:
        """The halves A and B of each row of numerals ``x``, as numbers."""
        return _num(x[:, :self.u], self.radix, self.fast), _num(x[:, self.u:], self.radix,
                                                                 self.fast)

    def join(self, a: Any, b: Any) -> np.ndarray:
        """The numerals of halves A and B side by side: the inverse of :meth:`split`."""
        return np.concatenate([_str(a, self.radix, self.u, self.fast),
                               _str(b, self.radix, self.v, self.fast)], axis=1)

    def y(self, i: int, num: Any, count: int) -> Any:
        """y = NUM(S) for round ``i`` of each value, where Q ends in [i] || [num]_b."""
        b = self.b
        if self.fast:
            words = np.empty((count, 2), dtype="<u8")
            words[:, 0] = self.words[i][0]
            np.bitwise_xor(num.astype("<u8").byteswap(), self.words[i][1], out=words[:, 1])
            enc = self.cipher.encryptor()
            r = np.frombuffer(enc.update(words.tobytes()) + enc.finalize(), dtype="<u8")
            return r[0::2].byteswap()  # NUM of S = R's first 8 bytes, big-endian
        nb = np.frombuffer(b"".join(x.to_bytes(b, "big") for x in num),
                           dtype=np.uint8).reshape(count, b)
        tail = np.empty((count, len(self.head) + 1 + b), dtype=np.uint8)
        tail[:, :len(self.head)] = self.head
        tail[:, len(self.head)] = i
        tail[:, len(self.head) + 1:] = nb
        state = np.broadcast_to(self.state, (count, 16))
        for j in range(tail.shape[1] // 16):
            state = _ecb(self.cipher, state ^ tail[:, 16 * j:16 * j + 16])
        d = self.d
        if d > 16:
            parts = [state]
            for j in range(1, (d + 15) // 16):
                ctr = np.zeros(16, dtype=np.uint8)
                ctr[-8:] = np.frombuffer(j.to_bytes(8, "big"), dtype=np.uint8)
                parts.append(_ecb(self.cipher, state ^ ctr))
            s = np.concatenate(parts, axis=1)[:, :d]
        else:
            s = state[:, :d]
        raw = np.ascontiguousarray(s).tobytes()
        return [int.from_bytes(raw[k * d:(k + 1) * d], "big") for k in range(count)]


def _num(x: np.ndarray, radix: int, fast: bool) -> Any:
    if fast:  # radix**columns <= 2**32: a dot product with the place values
        powers = np.array([radix**k for k in range(x.shape[1] - 1, -1, -1)], dtype=np.uint64)
        acc: np.ndarray = x.astype(np.uint64) @ powers
        return acc
    out = []
    for row in x.tolist():
        value = 0
        for digit in row:
            value = value * radix + digit
        out.append(value)
    return out


def _str(num: Any, radix: int, m: int, fast: bool) -> np.ndarray:
    if fast:  # every value is below radix**m <= 2**32
        out = np.empty((len(num), m), dtype=np.uint32)
        r = np.uint32(radix)
        rest = num.astype(np.uint32)
        for col in range(m - 1, -1, -1):
            out[:, col] = rest % r
            rest //= r
        return out
    rows = []
    for value in num:
        digits = [0] * m
        for col in range(m - 1, -1, -1):
            value, digits[col] = divmod(value, radix)
        rows.append(digits)
    return np.array(rows, dtype=np.uint32).reshape(len(num), m)


def _check(x: np.ndarray, radix: int) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError("FF1 takes a 2-d array: one row of numerals per value")
    if x.size and (int(x.min()) < 0 or int(x.max()) >= radix):
        raise FieldError(f"a numeral is outside radix {radix}")
    return x


def ff1_encrypt(cipher: Any, radix: int, tweak: bytes, x: np.ndarray) -> np.ndarray:
    """FF1.Encrypt of each row of ``x`` (numerals below ``radix``) under ``cipher``.

    ``cipher`` is a ``cryptography`` ``Cipher(AES(key), ECB())``.
    """
    x = _check(x, radix)
    count, n = x.shape
    rounds = _Rounds(cipher, radix, n, tweak)
    if count == 0:
        return x.astype(np.uint32)
    fast, u, v = rounds.fast, rounds.u, rounds.v
    a, b = rounds.split(x)
    for i in range(10):
        m = u if i % 2 == 0 else v
        y = rounds.y(i, b, count)
        mod = radix**m
        if fast:
            c = a + y % np.uint64(mod)
            c -= np.uint64(mod) * (c >= mod)
        else:
            c = [(ai + yi) % mod for ai, yi in zip(a, y, strict=True)]
        a, b = b, c
    return rounds.join(a, b)


def ff1_decrypt(cipher: Any, radix: int, tweak: bytes, x: np.ndarray) -> np.ndarray:
    """FF1.Decrypt: the inverse of :func:`ff1_encrypt`."""
    x = _check(x, radix)
    count, n = x.shape
    rounds = _Rounds(cipher, radix, n, tweak)
    if count == 0:
        return x.astype(np.uint32)
    fast, u, v = rounds.fast, rounds.u, rounds.v
    a, b = rounds.split(x)
    for i in range(9, -1, -1):
        m = u if i % 2 == 0 else v
        y = rounds.y(i, a, count)
        mod = radix**m
        if fast:
            c = b + (np.uint64(mod) - y % np.uint64(mod))
            c -= np.uint64(mod) * (c >= mod)
        else:
            c = [(bi - yi) % mod for bi, yi in zip(b, y, strict=True)]
        b, a = a, c
    return rounds.join(a, b)
