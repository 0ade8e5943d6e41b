"""Build the C half of cryptdisk.sqlite (everything else is in pyproject.toml).

The encrypting SQLite VFS has a C implementation (``cryptdisk.sqlite._cvfs``,
sources in ``csrc/cryptdisk_vfs/``). It takes AES-GCM from libgcrypt when its
headers are found (faster on 4 KiB records than OpenSSL 3.0; docs/sqlite.md,
"AES-GCM"), else from OpenSSL's libcrypto, and nonces from OpenSSL either way.
It needs a C compiler and the OpenSSL, SQLite and (preferably) libgcrypt
headers (Debian: ``gcc libssl-dev libsqlite3-dev libgcrypt20-dev``). Without
them the build skips it and ``cryptdisk.sqlite`` uses its Python VFS.

``CRYPTDISK_CIPHER=openssl`` builds the OpenSSL variant even where libgcrypt
is installed; ``CRYPTDISK_CIPHER=libgcrypt`` fails the build if it is not.
"""

import glob
import os
import shlex
import subprocess
import sysconfig

from setuptools import Extension, setup


def _header_found(header: str) -> bool:
    """Whether the C compiler finds ``header`` (its own search path, CPATH included)."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    try:
        done = subprocess.run([*cc, "-E", "-x", "c", "-"], input=f"#include <{header}>\n",
                              capture_output=True, text=True, check=False)
    except OSError:
        return False
    return done.returncode == 0


def _cipher() -> tuple[list[tuple[str, str]], list[str]]:
    """Macros and libraries for the AEAD the C VFS uses (see cipher.c)."""
    choice = os.environ.get("CRYPTDISK_CIPHER", "auto")
    if choice not in ("auto", "libgcrypt", "openssl"):
        raise SystemExit(f"CRYPTDISK_CIPHER={choice!r}: use auto, libgcrypt or openssl")
    if choice != "openssl" and _header_found("gcrypt.h"):
        return [("CD_LIBGCRYPT", "1")], ["gcrypt", "crypto"]
    if choice == "libgcrypt":
        raise SystemExit("CRYPTDISK_CIPHER=libgcrypt, but gcrypt.h was not found "
                         "(Debian: apt-get install libgcrypt20-dev)")
    return [], ["crypto"]


_macros, _libraries = _cipher()

setup(
    ext_modules=[
        Extension(
            "cryptdisk.sqlite._cvfs",
            sources=sorted(glob.glob("csrc/cryptdisk_vfs/*.c")),
            depends=["csrc/cryptdisk_vfs/cvfs.h"],
            define_macros=_macros,
            libraries=_libraries,
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Wno-cast-function-type"],
            optional=True,
        )
    ]
)
