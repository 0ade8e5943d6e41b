"""Disk-relative paths: validation and the temporary-file naming rule."""

from __future__ import annotations

import functools
import posixpath
import secrets

from ..errors import DiskError

__all__ = ["TMP_SUFFIX", "is_temp", "join_prefix", "norm_path", "temp_name"]

#: Temporary files being written are named ``.<name>.<random>.cdtmp`` and never listed.
TMP_SUFFIX = ".cdtmp"


def norm_path(path: str, *, allow_empty: bool = False) -> str:
    """A clean relative POSIX path; refuses absolute paths and ``..`` (no escaping the root)."""
    if not isinstance(path, str):
        raise TypeError(f"disk paths are str, not {type(path).__name__}")
    return _norm(path, allow_empty)


@functools.lru_cache(maxsize=4096)
def _norm(path: str, allow_empty: bool) -> str:
    cleaned = path.replace("\\", "/").strip("/")
    if not cleaned:
        if allow_empty:
            return ""
        raise DiskError("empty path: name a file on the disk")
    parts = [p for p in cleaned.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise DiskError(f"path {path!r} leaves the disk ('..' is not allowed)")
    if "\0" in cleaned:
        raise DiskError("path contains a NUL byte")
    return "/".join(parts)


def join_prefix(prefix: str, path: str) -> str:
    return posixpath.join(prefix, path) if prefix else path


def temp_name(path: str) -> str:
    """The temporary sibling a file is written to before it is published."""
    head, tail = posixpath.split(path)
    return posixpath.join(head, f".{tail}.{secrets.token_hex(6)}{TMP_SUFFIX}")


def is_temp(path: str) -> bool:
    return posixpath.basename(path).startswith(".") and path.endswith(TMP_SUFFIX)
