"""The machine and software a benchmark ran on, for the JSON and the report."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

__all__ = ["PACKAGES", "environment"]

#: Packages whose versions change the figures.
PACKAGES = ("cryptdisk", "cryptography", "pyarrow", "duckdb", "chdb", "sqlcipher3", "apsw",
            "fsspec", "matplotlib", "psutil")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(flags & {"aes", "vaes", "avx2", "avx512f", "pclmulqdq",
                                           "vpclmulqdq", "sha_ni"})
    except OSError:
        pass
    return []


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """CPU, cores, memory, kernel, Python, the versions in :data:`PACKAGES` and the AES-GCM
    of sealed files (``sealed_aead``: the C extension's library, or ``cryptography``)."""
    import psutil

    from .. import __version__
    from ..format import sealed_library

    versions = {name: _version(name) for name in PACKAGES}
    versions["cryptdisk"] = __version__
    try:
        import ssl

        openssl = ssl.OPENSSL_VERSION
    except ImportError:  # pragma: no cover
        openssl = None
    return {
        "cpu_model": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "openssl": openssl,
        "sealed_aead": sealed_library() or "cryptography",
        "packages": versions,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
