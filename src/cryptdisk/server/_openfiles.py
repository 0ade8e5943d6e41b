"""Running out of file descriptors, as the server tells a client: SQLSTATE 53000
(insufficient_resources, PostgreSQL's code for EMFILE and ENFILE), the limit and the way out.

Every connection holds its socket, and a streamed result the parts it is reading until
it ends (see docs/server-operations.md, *Limits*); they share the process's descriptors
with the parts the database keeps open and the logs. A statement that finds none left
fails with this error and the session goes on. The :class:`._conn.Listener` keeps one
descriptor spare, so that a client who connects when none is left is accepted on it and
refused with this error (after TLS, as a client beyond ``max_connections`` is), instead
of waiting unanswered in the kernel's accept queue.
"""

from __future__ import annotations

import errno
import resource

__all__ = ["HINT", "SQLSTATE", "message", "out_of_files"]

SQLSTATE = "53000"
HINT = ("end idle sessions and results left unfinished (a suspended portal), or raise the "
        "limit of open files (ulimit -n, LimitNOFILE= in a systemd unit)")


def out_of_files(exc: BaseException) -> bool:
    """Whether ``exc`` says the process (EMFILE) or the system (ENFILE) has no descriptor."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def message(what: str, exc: BaseException | None = None) -> str:
    """``too many open files: ... (ulimit -n: N) {what}``; ``exc`` an ENFILE: the system's."""
    if isinstance(exc, OSError) and exc.errno == errno.ENFILE:
        return f"too many open files: the system has no file descriptor left {what}"
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "" if soft == resource.RLIM_INFINITY else f" (ulimit -n: {soft})"
    return f"too many open files: the server has no file descriptor left{limit} {what}"
