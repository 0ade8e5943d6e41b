"""File descriptors: how many part files the engine keeps open, and the error when the
process has none left.

An open part (encrypted or plain) holds one descriptor. Scans open parts as they reach
them and keep at most :func:`parts_kept_open` of them open between statements (see
``_scan.OpenParts``), a few more while row groups are being read; a top-N plan, which
holds every part it ranks open, is not made over more than :func:`parts_ranked_open` (a
quarter of the limit; see ``_scan.TableScan``).
So a table of any number of parts is read within the process's limit (``ulimit -n``;
many systems start processes with a soft limit of 1024). What still runs out of them (a
very low limit, many databases or tables read at once in one process) fails with
:func:`out_of_files`'s clear error, never with a raw ``OSError`` nor a wrong answer.
"""

from __future__ import annotations

import errno
import resource

from ..errors import DatabaseError

__all__ = ["open_files_limit", "out_of_files", "parts_kept_open", "parts_ranked_open",
           "too_many_open_files"]

#: Parts kept open between statements at most (fewer under a low ``ulimit -n``).
KEPT_OPEN = 64


def open_files_limit() -> int | None:
    """The process's soft limit of open files (``ulimit -n``), None if unlimited or unknown."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def parts_kept_open() -> int:
    """How many open parts the engine keeps between statements: :data:`KEPT_OPEN`, at most
    a sixteenth of the process's limit (16 at ``ulimit -n 256``), at least 4."""
    soft = open_files_limit()
    return KEPT_OPEN if soft is None else max(4, min(KEPT_OPEN, soft // 16))


def parts_ranked_open() -> int | None:
    """How many parts a top-N plan may hold open at once (it ranks every part's row groups
    before reading any, each part open): a quarter of the process's limit (256 at
    ``ulimit -n`` 1024), at least :func:`parts_kept_open`; None if unlimited."""
    soft = open_files_limit()
    return None if soft is None else max(parts_kept_open(), soft // 4)


def out_of_files(exc: BaseException) -> bool:
    """Whether ``exc`` says the process (EMFILE) or the system (ENFILE) has no free
    descriptor."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def too_many_open_files(what: str, exc: OSError) -> DatabaseError:
    """The error for running out of descriptors while ``what`` (``opening part PATH``)."""
    soft = open_files_limit()
    limit = f" (ulimit -n: {soft})" if soft is not None and exc.errno == errno.EMFILE else ""
    whose = "the system" if exc.errno == errno.ENFILE else "the process"
    return DatabaseError(
        f"too many open files: {whose} has no file descriptor left{limit} {what}; "
        "each part being read holds one",
        hint="merge the table's parts (OPTIMIZE TABLE t), or raise the limit of open files "
        "(ulimit -n, LimitNOFILE= in a systemd unit)")
