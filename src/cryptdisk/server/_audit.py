"""The audit log of decryptions: who revealed which protected values, when, how many rows.

One JSON line per statement of the analytical engine that evaluated a function turning a
protected value back into clear text (``decrypt``, ``decrypt_deterministic``,
``fpe_decrypt``, ``detokenize``): called by an admin (``kind: "function"``) or inside a
masking or row access policy applied to a session (``kind: "policy"``, with the
table columns read through such a policy). Each line holds ``time`` (UTC),
``session_user``, ``current_user`` (after ``SET ROLE``), ``kind``, ``functions``,
``tables``, ``columns``, ``rows`` (returned; null where the engine gives no count,
as for an ``INSERT ... SELECT``) and ``prev``:
the SHA-256 of the previous line (64 zeros for the first), so removing or changing a
line in the middle breaks the chain (:meth:`AuditLog.verify`). Never the statement's
text or any value.

The file is a cryptdisk mutable file under the database's keyring (encrypted and
authenticated; read it with ``cryptdisk cat`` or ``SELECT * FROM system.audit``),
opened for appending only. Truncating whole trailing lines is not detectable from the
file alone: compare its line count with a copy kept elsewhere.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import threading
from typing import Any

from .. import open as cd_open
from .._json import kind as _kind
from .._json import load_object
from ..errors import PolicyFileError, ServerError
from ..format import open_log

__all__ = ["REVEALING_FUNCTIONS", "AuditLog", "revealing_calls"]

#: the field functions that turn a protected value back into clear text
REVEALING_FUNCTIONS = ("decrypt", "decrypt_deterministic", "fpe_decrypt", "detokenize",
                       "__cd_fpe_decrypt", "__cd_detokenize", "__cd_decrypt",
                       "__cd_decrypt_bytes", "__cd_decrypt_deterministic",
                       "__cd_decrypt_deterministic_bytes")
_CALL = re.compile(r'(?<![\w$."])"?(' + "|".join(REVEALING_FUNCTIONS) + r')"?\s*\(', re.I)
_GENESIS = "0" * 64
#: the fields of a line (as ``system.audit`` shows them) and their JSON types
_FIELDS: dict[str, type] = {"time": str, "session_user": str, "current_user": str,
                            "kind": str, "functions": list, "tables": list, "columns": list,
                            "rows": int, "prev": str}
#: the fields that may be null (no count of rows; a session without a user)
_NULLABLE = frozenset({"rows", "session_user", "current_user"})


def revealing_calls(sql: str) -> set[str]:
    """The revealing functions ``sql`` calls (string literals and comments skipped)."""
    from ._sqltext import strip_strings

    return {m[1].lower().removeprefix("__cd_").removesuffix("_bytes")
            for m in _CALL.finditer(strip_strings(sql))}


class AuditLog:
    """Append-only, hash-chained JSON lines in an encrypted cryptdisk file."""

    def __init__(self, path: str | os.PathLike[str], keyring: Any, *,
                 read_only: bool = False) -> None:
        """``read_only``: the log is read (checked), not opened for appending nor created
        (``cryptdisk serve --check``); :meth:`write` then raises."""
        self.path = os.fspath(path)
        self.keyring = keyring
        self._lock = threading.Lock()
        self._last = _GENESIS
        if os.path.exists(self.path):
            lines = self._lines()
            if lines:
                self._last = hashlib.sha256(lines[-1]).hexdigest()
        self._file: Any = None if read_only else open_log(self.path, keys=keyring)

    def _lines(self) -> list[bytes]:
        with cd_open(self.path, "rb", keyring=self.keyring) as f:
            return [line for line in f.read().split(b"\n") if line]

    def write(self, **entry: Any) -> None:
        if self._file is None:
            raise ServerError(f"the audit log {self.path} is open to read only")
        with self._lock:
            record = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                      **entry, "prev": self._last}
            line = json.dumps(record, separators=(",", ":"), default=str).encode()
            self._file.write(line + b"\n")
            self._file.flush()
            self._last = hashlib.sha256(line).hexdigest()

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            if self._file is not None:
                self._file.flush()
            return [self._parse(number, line)
                    for number, line in enumerate(self._lines(), 1)]

    def _parse(self, number: int, line: bytes) -> dict[str, Any]:
        """The entry of line ``number``; :class:`~cryptdisk.errors.PolicyFileError` naming
        the file, the line and the field (never a value) if it is not what :meth:`write`
        writes."""
        def bad(what: str) -> PolicyFileError:
            return PolicyFileError(f"the audit log {self.path} is malformed: line {number}: "
                                   f"{what}", path=self.path, record=number,
                                   hint="restore it from a backup")

        entry = load_object(line, bad)
        for field, kind in _FIELDS.items():
            if field not in entry:
                raise bad(f"{field} is missing")
            value = entry[field]
            if value is None and field in _NULLABLE:
                continue
            if kind is int and type(value) is not int:
                raise bad(f"{field} is {_kind(value)}, not a whole number or null")
            if kind is list and not (isinstance(value, list)
                                     and all(isinstance(v, str) for v in value)):
                raise bad(f"{field} is not a list of names")
            if kind is str and not isinstance(value, str):
                raise bad(f"{field} is {_kind(value)}, not a string")
        return entry

    def verify(self) -> int | None:
        """None if every line names its predecessor's hash, else the first line (1-based)
        that does not."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
            prev = _GENESIS
            for number, line in enumerate(self._lines(), 1):
                try:
                    entry = json.loads(line)
                except ValueError:
                    return number
                named = entry.get("prev") if isinstance(entry, dict) else None
                if named != prev:
                    return number
                prev = hashlib.sha256(line).hexdigest()
        return None

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
