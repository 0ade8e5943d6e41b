"""Build the C halves of cryptdisk.sqlite, cryptdisk.fields, cryptdisk.format and
cryptdisk.db (the rest is in pyproject.toml).

The encrypting SQLite VFS has a C implementation (``cryptdisk.sqlite._cvfs``,
sources in ``csrc/cryptdisk_vfs/``). It takes AES-GCM from libgcrypt when its
headers are found (faster on 4 KiB records than OpenSSL 3.0; docs/sqlite.md,
"AES-GCM"), else from OpenSSL's libcrypto, and nonces from OpenSSL either way.
It needs a C compiler and the OpenSSL, SQLite and (preferably) libgcrypt
headers (Debian: ``gcc libssl-dev libsqlite3-dev libgcrypt20-dev``). Without
them the build skips it with a warning (on stderr, and on the terminal, since
pip hides a build's output), and ``cryptdisk.sqlite`` uses its Python VFS,
warning once at first use.

``CRYPTDISK_CIPHER=openssl`` builds the OpenSSL variant even where libgcrypt
is installed; ``CRYPTDISK_CIPHER=libgcrypt`` fails the build if it is not.

``cryptdisk.fields._cfields`` (sources in ``csrc/cryptdisk_fields/``) runs the
per-value loops of column encryption (AES-GCM, AES-SIV, base64) over Arrow
buffers without the GIL, with the same choice of cipher library; its AES-GCM
comes from Intel's multi-buffer library (intel-ipsec-mb, one call per value)
when its header is found (Debian: ``libipsec-mb-dev``; docs/fields.md,
"Measured"). ``CRYPTDISK_IPSEC_MB=no`` builds without it, ``yes`` fails the
build if it is not found. Without the extension ``cryptdisk.fields`` makes one
``cryptography`` call per value (slower; the same bytes).

``cryptdisk.format._cseal`` (sources in ``csrc/cryptdisk_format/``) decrypts and
encrypts runs of a sealed file's segments in one call without the GIL, with
AES-GCM from intel-ipsec-mb; it is built only where that library's header is
found (and not with ``CRYPTDISK_IPSEC_MB=no``). Without it sealed files use one
``cryptography`` call per segment, with the GIL held (the same bytes; encrypted
scans take more CPU; docs/format.md, "Cipher backend").

``cryptdisk.db._csort`` (``csrc/cryptdisk_db/csort.c``) sorts an insert's packed keys
(a radix sort of 64-bit integers, without the GIL) and needs only a C compiler and
Python's headers; without it inserts sort with numpy (the same parts, more CPU).
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGES = "gcc libssl-dev libsqlite3-dev libgcrypt20-dev libipsec-mb-dev"
CVFS = "cryptdisk.sqlite._cvfs"
CFIELDS = "cryptdisk.fields._cfields"
CSEAL = "cryptdisk.format._cseal"
CSORT = "cryptdisk.db._csort"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def _header_found(header: str, python: bool = False) -> bool:
    """Whether the C compiler finds ``header`` (its own search path, CPATH included;
    with ``python``, Python's include directory too)."""
    cc = _compiler()
    extra = ["-I", sysconfig.get_paths()["include"]] if python else []
    try:
        done = subprocess.run([*cc, *extra, "-E", "-x", "c", "-"],
                              input=f"#include <{header}>\n", capture_output=True, text=True,
                              check=False)
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


def _ipsec_mb() -> tuple[list[tuple[str, str]], list[str]]:
    """Macros and libraries for the AES-GCM of the fields loops (see fields.c)."""
    choice = os.environ.get("CRYPTDISK_IPSEC_MB", "auto")
    if choice not in ("auto", "yes", "no"):
        raise SystemExit(f"CRYPTDISK_IPSEC_MB={choice!r}: use auto, yes or no")
    if choice != "no" and _header_found("intel-ipsec-mb.h"):
        return [("CD_IPSEC_MB", "1")], ["IPSec_MB"]
    if choice == "yes":
        raise SystemExit("CRYPTDISK_IPSEC_MB=yes, but intel-ipsec-mb.h was not found "
                         "(Debian: apt-get install libipsec-mb-dev)")
    return [], []


def _announce(text: str) -> None:
    """A warning the installing user sees: pip captures the build's output, so the
    terminal gets it too when there is one."""
    message = "\n" + "\n".join(f"cryptdisk: {line}" if line else "" for line in
                                text.strip("\n").splitlines()) + "\n\n"
    sys.stderr.write(message)
    sys.stderr.flush()
    if not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as tty:
                tty.write(message)
        except OSError:
            pass


def _not_built(reason: str, name: str = CVFS) -> None:
    what = ("the C VFS of cryptdisk.sqlite", "its Python VFS (the same files, about half as fast)")
    if name == CFIELDS:
        what = ("the C loops of cryptdisk.fields", "one cryptography call per value (the same "
                "bytes, 10-30x slower)")
    elif name == CSORT:
        what = ("the C sort of cryptdisk.db's inserts", "numpy's sort (the same parts, "
                "about 10% more CPU for an insert of random keys)")
    elif name == CSEAL:
        what = ("the C segment loops of cryptdisk.format", "one cryptography call per 64 KiB "
                "segment, with the GIL held (the same files; encrypted scans take more CPU)")
    _announce(f"""
WARNING: {what[0]} was not built: {reason}.
cryptdisk will use {what[1]}.
To build it, install a C compiler and the headers, then reinstall cryptdisk:
    apt-get install {PACKAGES}      (Debian, Ubuntu)
    pip install -e .
""")


class BuildExt(build_ext):
    """Builds the optional C extensions, or says clearly why not (never fails the install)."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name not in (CVFS, CFIELDS, CSEAL, CSORT):
            super().build_extension(ext)
            return
        if ext.name == CSEAL and not ext.define_macros:
            why = ("CRYPTDISK_IPSEC_MB=no" if os.environ.get("CRYPTDISK_IPSEC_MB") == "no" else
                   "intel-ipsec-mb.h was not found")
            _not_built(why, ext.name)
            return
        cc = _compiler()
        if shutil.which(cc[0]) is None:
            _not_built(f"no C compiler ({cc[0]} not found)", ext.name)
            return
        needed = {CVFS: ("openssl/evp.h", "sqlite3ext.h", "Python.h"),
                  CFIELDS: ("openssl/evp.h", "Python.h"),
                  CSEAL: ("intel-ipsec-mb.h", "Python.h"),
                  CSORT: ("Python.h",)}[ext.name]
        missing = [h for h in needed if not _header_found(h, python=h == "Python.h")]
        if missing:
            _not_built(f"headers not found: {', '.join(missing)}", ext.name)
            return
        if ext.name == CVFS and os.environ.get("CRYPTDISK_CIPHER", "auto") == "auto" and \
                ("CD_LIBGCRYPT", "1") not in (ext.define_macros or []):
            _announce("note: libgcrypt's headers were not found, so the C VFS takes AES-GCM "
                      "from OpenSSL (slower on 4 KiB pages; apt-get install libgcrypt20-dev "
                      "and reinstall for the faster one)")
        try:
            super().build_extension(ext)
        except Exception as exc:  # a compiler or linker error: the install goes on without it
            _not_built(f"the build failed ({type(exc).__name__}: {exc})", ext.name)


_macros, _libraries = _cipher()
_gcm_macros, _gcm_libraries = _ipsec_mb()

setup(
    cmdclass={"build_ext": BuildExt},
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
        ),
        Extension(
            CFIELDS,
            sources=["csrc/cryptdisk_fields/fields.c"],
            define_macros=_macros + _gcm_macros,
            libraries=_gcm_libraries + _libraries,
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            CSEAL,
            sources=["csrc/cryptdisk_format/cseal.c"],
            define_macros=_gcm_macros,
            libraries=_gcm_libraries,
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            CSORT,
            sources=["csrc/cryptdisk_db/csort.c"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
