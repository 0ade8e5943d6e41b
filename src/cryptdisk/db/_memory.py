"""The error of a statement that needs more memory than ``memory_limit``.

DuckDB runs with no temporary directory, so it never spills: its temporary
files would hold decrypted rows. DuckDB can encrypt them (``temp_file_encryption``:
AES-256-GCM under a random per-process key), but only with OpenSSL's random
numbers, which come with its ``httpfs`` extension; the built-in crypto module
refuses to write (its generator is not a cryptographic one), and cryptdisk
does not load extensions. docs/database.md ("Memory") says the rest.
"""

from __future__ import annotations

from ..errors import DatabaseError

__all__ = ["out_of_memory"]


def out_of_memory(doing: str, exc: BaseException, hint: str) -> DatabaseError:
    """``doing`` (e.g. "the query") needs more than ``memory_limit``: a clear error.

    Only the first line of DuckDB's message is kept (the amount it failed to get);
    the rest advises a temporary directory, which cryptdisk refuses.
    """
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseError(
        f"{doing} needs more memory than memory_limit allows ({detail}); cryptdisk does "
        "not let DuckDB spill to disk, where its temporary files would hold plaintext",
        hint=hint)
