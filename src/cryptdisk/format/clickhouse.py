"""ClickHouse's encrypted-disk file format, byte-compatible both ways.

Files on a ClickHouse ``<type>encrypted</type>`` disk are a 64-byte ``ENC``
header (:class:`CHHeader`) followed by AES-CTR ciphertext of the same length
as the plaintext, one continuous stream from the header's IV. Empty files are
0 bytes. Appends continue the stream under the same header and IV.

Top tier: :func:`open_clickhouse` (``"rb"``, ``"wb"``, ``"ab"``) with
``key_for=ch_key_finder({id: key, ...})`` to find keys as ClickHouse does (by
the header's key fingerprint for version 2, by key id for version 1).

Lower tier: :class:`CHReader`, :class:`CHWriter`, :func:`check_key`.

.. warning::
   The format is **unauthenticated** AES-CTR: anyone who can write the file
   can flip plaintext bits undetected, and a wrong key decrypts to garbage.
   The only check is the key fingerprint in the header. Prefer cryptdisk's
   own format; ``cryptdisk convert`` migrates. See ``docs/clickhouse.md``.
"""

from ._ch_file import (
    CHReadFile,
    CHWriteFile,
    EmptyCHReader,
    ch_append,
    ch_key_finder,
    open_clickhouse,
)
from ._ch_header import (
    CH_HEADER_SIZE,
    CH_SIGNATURE,
    CHAlgorithm,
    CHHeader,
    clickhouse_fingerprint,
    clickhouse_v1_key_hash,
    is_clickhouse_header,
)
from ._ch_stream import CHUNK_SIZE, CHReader, CHWriter, check_key, counter_block

__all__ = [
    "CHUNK_SIZE",
    "CH_HEADER_SIZE",
    "CH_SIGNATURE",
    "CHAlgorithm",
    "CHHeader",
    "CHReadFile",
    "CHReader",
    "CHWriteFile",
    "CHWriter",
    "EmptyCHReader",
    "ch_append",
    "ch_key_finder",
    "check_key",
    "clickhouse_fingerprint",
    "clickhouse_v1_key_hash",
    "counter_block",
    "is_clickhouse_header",
    "open_clickhouse",
]
