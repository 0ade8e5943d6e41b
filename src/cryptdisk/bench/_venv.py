"""A side venv for a peer that needs other versions than the suite's own environment.

DuckDB from PyPI 2.x has no OpenSSL crypto module here and encrypts with its
Mbed TLS fallback; duckdb 1.5.5 with the official signed httpfs extension (the
PyPI package ``duckdb-extension-httpfs``) uses OpenSSL. That pair lives in a venv
under the user's cache directory, created on demand with pip. The venv sees the
system site-packages (so ``cryptdisk`` and ``cryptography`` import), and its own
``duckdb`` comes first on ``sys.path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["DUCKDB_OPENSSL", "VenvError", "cache_dir", "ensure_venv"]

DUCKDB_OPENSSL = ("duckdb-1.5.5", ["duckdb==1.5.5", "duckdb-extension-httpfs==1.5.5"])


class VenvError(RuntimeError):
    """The side venv could not be created (no network to the package index, no pip)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cryptdisk" / "bench"


def ensure_venv(name: str, requirements: list[str], timeout: float = 600) -> str:
    """The python of venv ``name`` with ``requirements`` installed (created if missing)."""
    root = cache_dir() / name
    python = root / "bin" / "python"
    marker = root / ".cryptdisk-complete"
    if python.exists() and marker.exists():
        return str(python)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", "--system-site-packages",
                        str(root)], check=True, capture_output=True, timeout=timeout)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *requirements], check=True, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        tail = detail.decode(errors="replace").strip().splitlines()[-1:] if detail else []
        raise VenvError(f"could not create {root}: {exc}"
                        + (f" ({tail[0]})" if tail else "")) from None
    marker.write_text(" ".join(requirements) + "\n")
    return str(python)
