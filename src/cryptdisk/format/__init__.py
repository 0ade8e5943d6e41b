"""The cryptdisk file format (``docs/format.md`` is its specification).

Top tier: :func:`open_file` (re-exported as :func:`cryptdisk.open`).

Lower tier, easy to misuse (you handle data keys and headers yourself):
:class:`Header`, :func:`new_header`, :func:`open_header`, :func:`rewrap_header`,
:func:`read_open_header` (:func:`open_header` over a header read again while a rewrap
may be writing it: ``_reread.py``),
:class:`SealedWriter`, :class:`SealedReader`, :class:`MutableStore` (its options for
files other processes write at once, SQLite's, take a :class:`TailStore`).
A wrong header/key pairing here is not caught until authentication fails.
"""

from ._cipher import TAG_SIZE, Algorithm, new_aead
from ._header import (
    HEADER_SIZE,
    MAGIC,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    VERSION,
    Header,
    Kind,
    new_header,
    new_headers,
    open_header,
    rewrap_header,
)
from ._io import (
    MutableFile,
    PositionalReadFile,
    PublishingWriteFile,
    SealedReadFile,
    SealedWriteFile,
    owned_file,
)
from ._layout import SegmentLayout
from ._mutable import MUTABLE_NONCE, MutableStore, TailStore, mutable_layout, store_layout
from ._open import DEFAULT_SEGMENT_SIZE, discard_temp, open_file, open_log, read_header
from ._protocols import KeyLookup, WrappingKey
from ._reread import (
    REREAD_DELAYS,
    TORN_HEADER_ERRORS,
    names_known_key,
    read_named_header,
    read_open_header,
    reread_delay,
)
from ._sealed import (
    SealedReader,
    SealedWriter,
    iter_sealed_stream,
    pack_spans,
    sealed_layout,
    sealed_library,
    sealed_nonce,
)
from ._source import FdSource, FileObjectSource, MmapSource, Source, source_for
from ._tail import LOG_SUFFIX as LOG_TAIL_SUFFIX
from ._tail import SUFFIX as TAIL_SUFFIX
from ._tail import TailSave, remove_tail

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "HEADER_SIZE",
    "LOG_TAIL_SUFFIX",
    "MAGIC",
    "MAX_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "MUTABLE_NONCE",
    "REREAD_DELAYS",
    "TAG_SIZE",
    "TAIL_SUFFIX",
    "TORN_HEADER_ERRORS",
    "VERSION",
    "Algorithm",
    "FdSource",
    "FileObjectSource",
    "Header",
    "KeyLookup",
    "Kind",
    "MmapSource",
    "MutableFile",
    "MutableStore",
    "PositionalReadFile",
    "PublishingWriteFile",
    "SealedReadFile",
    "SealedReader",
    "SealedWriteFile",
    "SealedWriter",
    "SegmentLayout",
    "Source",
    "TailSave",
    "TailStore",
    "WrappingKey",
    "discard_temp",
    "iter_sealed_stream",
    "mutable_layout",
    "names_known_key",
    "new_aead",
    "new_header",
    "new_headers",
    "open_file",
    "open_header",
    "open_log",
    "owned_file",
    "pack_spans",
    "read_header",
    "read_named_header",
    "read_open_header",
    "remove_tail",
    "reread_delay",
    "rewrap_header",
    "sealed_layout",
    "sealed_library",
    "sealed_nonce",
    "source_for",
    "store_layout",
]
