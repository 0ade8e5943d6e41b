"""The key audit log: key lifecycle and key use, one JSON object a line, never material.

Where it goes: the file named by ``CRYPTDISK_KEY_AUDIT_LOG``, else the ``audit_log``
setting of the ``[keyring]`` loaded last in this process (relative to its config),
else nowhere. Each event is appended with one ``write`` on a file opened
``O_APPEND`` (mode 0600), so lines of concurrent processes do not interleave.

Events: ``add``, ``promote``, ``retire``, ``destroy`` (the lifecycle commands),
``connect`` (a provider-held key was opened), ``fault`` (a provider call failed and
was retried or given up), ``use`` (when a provider-held key is closed: how many data
keys it wrapped and unwrapped, cache hits, provider calls). Fields are ids, counts,
provider references, paths and operation names; a PIN, credential or key is never
among them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from typing import Any

__all__ = ["AUDIT_ENV", "audit_event", "audit_log_path", "set_audit_log"]

AUDIT_ENV = "CRYPTDISK_KEY_AUDIT_LOG"

_lock = threading.Lock()
_configured: str | None = None


def set_audit_log(path: str | None) -> None:
    """Send events to ``path`` (None: only ``CRYPTDISK_KEY_AUDIT_LOG``, if set)."""
    global _configured
    _configured = path


def audit_log_path() -> str | None:
    return os.environ.get(AUDIT_ENV) or _configured


def audit_event(event: str, key_id: int | None, **fields: Any) -> None:
    """Append one event (``fields`` must hold no secret; None values are left out).

    A log that cannot be written is reported on stderr once per event, not raised:
    auditing never stops reading data.
    """
    path = audit_log_path()
    if not path:
        return
    record: dict[str, Any] = {
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
        "pid": os.getpid(), "event": event, "key_id": key_id}
    record.update({k: v for k, v in fields.items() if v is not None})
    line = (json.dumps(record, default=str, sort_keys=False) + "\n").encode("utf-8")
    with _lock:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            import sys

            print(f"cryptdisk: warning: key audit log {path}: {exc.strerror}", file=sys.stderr)
