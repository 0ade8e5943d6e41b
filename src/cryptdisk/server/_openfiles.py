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
import logging
import resource
from collections.abc import Callable

__all__ = ["HINT", "REFUSALS_EVERY", "SQLSTATE", "Throttled", "message", "out_of_files"]

log = logging.getLogger("cryptdisk.server")

#: at most one warning line of each kind about clients refused or left waiting for want of
#: descriptors this often (seconds)
REFUSALS_EVERY = 10.0

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



class Throttled:
    """A warning that a storm of clients could repeat once per client (refused for want of
    a descriptor, say), logged at most once per ``every`` seconds: the first at once, the
    ones that follow within the interval counted and logged as one line with their count
    when it ends (``later(delay, fn)`` runs ``fn`` then: the event loop's ``call_later``),
    which starts another interval if there were any."""

    def __init__(self, text: str, later: Callable[[float, Callable[[], None]], object],
                 every: float = REFUSALS_EVERY) -> None:
        self.text = text
        self.later = later
        self.every = every
        self.count = 0  # not logged yet
        self.waiting = False  # an interval runs: warnings are counted
        self.detail = ""

    def warn(self, detail: object) -> None:
        self.detail = str(detail)
        if self.waiting:
            self.count += 1
            return
        log.warning("%s: %s", self.text, self.detail)
        self.waiting = True
        self.later(self.every, self._flush)

    def _flush(self) -> None:
        count, self.count = self.count, 0
        if not count:
            self.waiting = False
            return
        log.warning("%s: %d more in the last %g s (the last: %s)", self.text, count,
                    self.every, self.detail)
        self.later(self.every, self._flush)
