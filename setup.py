"""Build the C half of cryptdisk.sqlite (everything else is in pyproject.toml).

The encrypting SQLite VFS has a C implementation (``cryptdisk.sqlite._cvfs``,
sources in ``csrc/cryptdisk_vfs/``)
linked against OpenSSL's libcrypto; it needs a C compiler and the OpenSSL and
SQLite headers (Debian: ``gcc libssl-dev libsqlite3-dev``). Without them the
build skips it and ``cryptdisk.sqlite`` uses its Python VFS.
"""

import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cryptdisk.sqlite._cvfs",
            sources=sorted(glob.glob("csrc/cryptdisk_vfs/*.c")),
            depends=["csrc/cryptdisk_vfs/cvfs.h"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Wno-cast-function-type"],
            optional=True,
        )
    ]
)
