"""The access log: one JSON line per statement, plain (mode 0600) or a cryptdisk mutable file.

Each line has ``time`` (UTC, ISO 8601), ``user``, ``source`` (client address),
``kind`` (the statement's first keyword), ``tables`` (those the statement reads
or writes, where the engine says), ``rows``, ``duration_ms`` and, for a
failure, ``sqlstate`` (and ``rows`` 0). Never the statement's text, parameter values or
passwords. The session writes one line per statement it is asked to run, COPY included
(see docs/server-access-log.md).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from typing import Any

from ..format import open_log

__all__ = ["AccessLog", "line"]


def line(entry: dict[str, Any]) -> bytes:
    """``entry`` as the log's JSON line, its time (now) first."""
    entry = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), **entry}
    return json.dumps(entry, separators=(",", ":"), default=str).encode() + b"\n"


class AccessLog:
    """Append-only JSON lines; ``keyring`` given: encrypted (read it with ``cryptdisk cat``)."""

    def __init__(self, path: str | os.PathLike[str], keyring: Any = None) -> None:
        self.path = os.fspath(path)
        self.keyring = keyring  # None: a plain file
        self._lock = threading.Lock()
        self._file: Any
        if keyring is not None:
            # a line per statement: no sync per line (a killed server keeps every line;
            # a power cut may lose the last ones, as for the plain log)
            self._file = open_log(self.path, keys=keyring, durable=False)
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = os.fdopen(fd, "ab")

    def reopen(self) -> None:
        """Open the plain log's path again (a new file when logrotate moved it away);
        an encrypted log keeps its file."""
        if self.keyring is not None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        new = os.fdopen(fd, "ab")
        with self._lock:
            old, self._file = self._file, new
        old.close()

    def write(self, **entry: Any) -> None:
        self.write_line(line(entry))

    def write_line(self, data: bytes) -> None:
        """Append one line made by :func:`line`."""
        with self._lock:
            self._file.write(data)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
