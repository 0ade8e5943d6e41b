"""Where key material comes from: inline hex, environment, key file, external command.

The functions read one source each; the :class:`~cryptdisk.keys.KeyProvider` classes
below put them behind the key-entry fields of a config (``hex``, ``from_env``,
``file``, ``command``, and ClickHouse's ``raw`` and ``raw_from_env``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import signal
import stat
import subprocess
from collections.abc import Sequence
from typing import Any

from ..errors import (
    InvalidKeyError,
    KeyCommandError,
    KeyFileError,
    KeyFilePermissionError,
    MissingEnvironmentVariableError,
)
from ._key import Key, export_key_material
from ._provider import KeyProvider

__all__ = [
    "CommandKey",
    "EnvKey",
    "FileKey",
    "HexKey",
    "RawEnvKey",
    "RawKey",
    "decode_hex_key",
    "is_variable_name",
    "key_from_command",
    "key_from_env",
    "key_from_file",
    "not_a_variable_name",
    "read_key_file",
    "shown_value",
    "stderr_excerpt",
    "write_key_file",
]


def decode_hex_key(text: str, what: str = "key", sizes: tuple[int, ...] = (16, 32)) -> bytes:
    """Decode hex (whitespace and a ``0x`` prefix allowed) into a key of one of ``sizes`` bytes.

    The default sizes are AES-128 and AES-256; ClickHouse's AES_192_CTR also takes 24.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a hex string")
    cleaned = "".join(text.split())
    if cleaned[:2].lower() == "0x":
        cleaned = cleaned[2:]
    try:
        raw = bytes.fromhex(cleaned)
    except ValueError:
        raise InvalidKeyError(
            f"{what} is not valid hex ({len(cleaned)} characters)",
            hint="generate one with 'cryptdisk keygen'",
        ) from None
    if len(raw) not in sizes:
        digits = " or ".join(str(2 * n) for n in sizes)
        raise InvalidKeyError(
            f"{what} has {len(cleaned)} hex digits; a key needs {digits}",
            hint="generate one with 'cryptdisk keygen'",
        )
    return raw


_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_LIKE = re.compile(r"[0-9a-fA-F]{32}")


def is_variable_name(text: str) -> bool:
    """Whether ``text`` may be shown as the name of an environment variable: a name
    (letters, digits, ``_``) holding no run of 32 hex digits. What is not (a key, a
    passphrase or a PIN given where its variable's name belongs) is never echoed."""
    return bool(_VARIABLE_NAME.fullmatch(text)) and not _KEY_LIKE.search(text)


def shown_value(value: object) -> str:
    """A config value as an error message may quote it: numbers and strings shorter than
    16 characters (shorter than any key: raw keys are 16, 24 or 32 bytes, hex keys 32 or
    64 digits); anything longer, a key typed into the wrong field perhaps, is described."""
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, str) and len(value) < 16:
        return repr(value)
    if isinstance(value, str):
        return f"a string of {len(value)} characters (not shown)"
    return f"a {type(value).__name__} (not shown)"


def not_a_variable_name(field: str) -> str:
    """The message for a ``field`` that should name a variable and holds something else."""
    return (f"{field} takes the NAME of an environment variable (such as CRYPTDISK_KEY), not "
            "a key, passphrase or PIN; what is there is not a variable name (not shown)")


def _env_text(variable: str, holds: str, hint: str, field: str = "from_env") -> str:
    value = os.environ.get(variable)
    if not value:
        if not is_variable_name(variable):
            raise MissingEnvironmentVariableError(
                not_a_variable_name(field), variable="(not shown)",
                hint="write the variable's name there and export the key in that variable")
        raise MissingEnvironmentVariableError(
            f"environment variable {variable} is {'empty' if value == '' else 'not set'}; "
            f"it should hold {holds}", variable=variable, hint=hint)
    return value


def key_from_env(variable: str, sizes: tuple[int, ...] = (16, 32)) -> bytes:
    """The hex key in an environment variable."""
    return _hex_from_env(variable, sizes, "key_from_env")


def _hex_from_env(variable: str, sizes: tuple[int, ...], field: str) -> bytes:
    value = _env_text(variable, "a hex key", f"export {variable}=$(cryptdisk keygen --print)",
                      field)
    return decode_hex_key(value, f"the key in environment variable {variable}", sizes)


def key_from_file(path: str | os.PathLike[str], *, check_permissions: bool = True,
                  sizes: tuple[int, ...] = (16, 32)) -> bytes:
    """Read a hex key file as ``cryptdisk keygen`` writes it (``#`` lines are comments).

    Refuses a file readable or writable by group or others, as ssh refuses such
    private keys.
    """
    return read_key_file(path, check_permissions=check_permissions, sizes=sizes)[0]


_ID_COMMENT = re.compile(r"^#\s*cryptdisk key-encryption key \([^)]*\bid (\d+)\)")


def read_key_file(path: str | os.PathLike[str], *, check_permissions: bool = True,
                  sizes: tuple[int, ...] = (16, 32)) -> tuple[bytes, int | None]:
    """A key file's material and the key id its first line notes (None if it notes none).

    :func:`write_key_file` notes the id on its comment line (``... (AES-256, id 2) ...``).
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"key file {name} does not exist",
                           hint="create one with 'cryptdisk keygen -o PATH'") from None
    except PermissionError:
        raise KeyFileError(f"key file {name} cannot be read (permission denied)") from None
    except OSError as exc:
        raise KeyFileError(f"key file {name} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"key file {name} is not a regular file")
        if check_permissions and st.st_mode & 0o077:
            raise KeyFilePermissionError(
                f"key file {name} is accessible by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); refusing to use it",
                hint=f"chmod 600 {name}",
            )
        if st.st_size > 4096:
            raise KeyFileError(f"key file {name} is too large to be a key file")
        data = os.read(fd, 4097)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {name} is not text: expected one line of hex") from None
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise KeyFileError(
            f"key file {name} should hold exactly one line of hex, found {len(lines)}"
        )
    noted = _ID_COMMENT.match(text.lstrip())
    return (decode_hex_key(lines[0], f"the key in {name}", sizes),
            int(noted.group(1)) if noted else None)


#: What a failed key command's message quotes of its stderr: the last lines, bounded.
STDERR_LINES = 5
STDERR_CHARS = 400
_REDACTED = "[redacted]"
# runs that could be key material or part of it: 16+ hex digits, together or in groups of
# one length with separators between them (de:ad:be:ef, 0xde, 0xad, xxd's columns, lines
# of a split key), or 20+ base64 characters mixing cases and digits (paths, words, dates
# and sentences do not)
_HEX_MIN = 16
_HEX_RUN = re.compile(r"(?<![0-9A-Za-z])(?:0x)?[0-9A-Fa-f]{16,}(?![0-9A-Za-z])")
_HEX_GROUPS = re.compile(r"(?<![0-9A-Za-z])(?:0x)?[0-9A-Fa-f]{2,}"
                         r"(?:(?:[:.,-]|,?[ \t]+|[ \t]*\n[ \t]*)(?:0x)?[0-9A-Fa-f]{2,})+"
                         r"(?![0-9A-Za-z])")
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def _b64_like(match: re.Match[str]) -> str:
    text = match.group(0)
    if (re.search(r"[A-Z]", text) and re.search(r"[a-z]", text)
            and re.search(r"[0-9]", text)):
        return _REDACTED
    return text


def _hex_groups(match: re.Match[str]) -> str:
    groups = [g.removeprefix("0x") for g in re.findall(r"(?:0x)?[0-9A-Fa-f]+", match.group(0))]
    sizes = [len(g) for g in groups]
    size = max(set(sizes), key=sizes.count)  # a key's groups have one length (a date's not)
    if sizes.count(size) * size >= _HEX_MIN and re.search(r"[0-9]", "".join(groups)):
        return _REDACTED
    return match.group(0)


def stderr_excerpt(stderr: bytes, stdout: bytes = b"") -> str:
    """A bounded, secret-free excerpt of a key command's stderr for an error message.

    The last :data:`STDERR_LINES` non-empty lines, at most :data:`STDERR_CHARS`
    characters (the end kept), terminal escapes dropped. Whatever the command printed on
    stdout (its key, or part of it) and runs that could be key material (16 or more hex
    digits, also in equal groups with separators or across lines, 20 or more base64
    characters) are replaced by ``[redacted]``. Empty when
    stderr has nothing to show.
    """
    text = _CONTROL.sub("", stderr.decode("utf-8", errors="replace"))
    out = stdout.decode("utf-8", errors="replace")
    secrets = {out.strip()} | {t for t in out.split() if len(t) >= 6}
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, _REDACTED)
    text = _B64_RUN.sub(_b64_like, _HEX_GROUPS.sub(_hex_groups, _HEX_RUN.sub(_REDACTED, text)))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()][-STDERR_LINES:]
    shown = " | ".join(lines)
    if len(shown) > STDERR_CHARS:
        shown = "..." + shown[-(STDERR_CHARS - 3):]
    return shown


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with status {code}"


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from ``/proc`` (empty where there is none)."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (found through ``/proc``; a descendant that
    left, i.e. daemonised, is not found)."""
    for _ in range(3):  # a descendant may fork while it is being killed
        children = _children()
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo += children.get(p, [])
        for p in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        if tree == [pid]:
            return


def key_from_command(argv: Sequence[str], *, timeout: float = 30.0,
                     sizes: tuple[int, ...] = (16, 32)) -> bytes:
    """Run an external command (no shell) whose stdout is a hex key.

    The command's stdin is ``/dev/null`` (it may prompt on ``/dev/tty``); one that does
    not finish within ``timeout`` seconds is killed with the processes it started. A
    failure names the command (its program's name, never its arguments), its exit
    status or signal and an excerpt of its stderr (:func:`stderr_excerpt`); its stdout,
    which holds the key, is never shown.
    """
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("a key command must be a non-empty list of strings")
    shown = os.path.basename(argv[0].rstrip("/")) or argv[0]
    what = f"key command {shown!r}"
    try:
        # not a session or process group of its own: a command that prompts on /dev/tty
        # (age, a passphrase helper) needs this terminal and its foreground group
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise KeyCommandError(f"{what} was not found") from None
    except PermissionError:
        raise KeyCommandError(f"{what} cannot be run: permission denied",
                              hint=f"is {argv[0]} an executable file?") from None
    except OSError as exc:
        raise KeyCommandError(f"{what} cannot be run: {exc.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)  # the command and what it started
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child left its session and holds the pipes
            proc.kill()
            out, err = b"", b""
        finally:
            proc.wait()
        excerpt = stderr_excerpt(err, out)
        raise KeyCommandError(f"{what} did not finish in {timeout:g} s and was killed"
                              + (f"; its stderr: {excerpt}" if excerpt else "")) from None
    excerpt = stderr_excerpt(err, out)
    if proc.returncode != 0:
        raise KeyCommandError(f"{what} {_exit_status(proc.returncode)}"
                              + (f"; its stderr: {excerpt}" if excerpt else "; no stderr"))
    try:
        text = out.decode("ascii")
    except UnicodeDecodeError:
        raise KeyCommandError(f"{what} printed non-text output"
                              + (f"; its stderr: {excerpt}" if excerpt else "")) from None
    try:
        return decode_hex_key(text, f"the output of {what}", sizes)
    except InvalidKeyError as exc:
        if not excerpt:
            raise
        raise InvalidKeyError(f"{exc}; its stderr: {excerpt}", hint=exc.hint) from None


def write_key_file(path: str | os.PathLike[str], material: bytes | Key, *,
                   key_id: int | None = None, overwrite: bool = False) -> None:
    """Write a key file with mode 0600, refusing to replace an existing one unless asked.

    ``material`` is a :class:`~cryptdisk.keys.Key` (whose id is written in the file's
    comment unless ``key_id`` says otherwise) or the key's bytes.
    """
    if isinstance(material, Key):
        key_id = material.key_id if key_id is None else key_id
        material = export_key_material(material)
    name = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(name, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"key file {name} already exists; refusing to overwrite a key",
                           hint="choose another path (losing a key loses its data)") from None
    written = False
    try:
        os.fchmod(fd, 0o600)
        now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        bits = len(material) * 8
        ident = f", id {key_id}" if key_id is not None else ""
        text = (
            f"# cryptdisk key-encryption key (AES-{bits}{ident}), created {now}\n"
            "# Anyone with this file can read data encrypted under it; losing it loses that data.\n"
            f"{material.hex()}\n"
        )
        left = memoryview(text.encode("ascii"))
        while left:  # a full disk takes part of a write before it refuses the rest
            left = left[os.write(fd, left):]
        os.fsync(fd)
        written = True
    except OSError as exc:  # a full disk: say which file
        raise type(exc)(exc.errno, exc.strerror, name) from None
    finally:
        os.close(fd)
        if not written and not overwrite:  # no empty or cut key file claims to be a key
            with contextlib.suppress(OSError):
                os.unlink(name)


# -- the built-in key providers (see cryptdisk.keys._provider) -----------------------------


class _TextProvider(KeyProvider):
    """A provider whose config value is one non-empty string."""

    def __init__(self, value: Any, *, base: str) -> None:
        if not isinstance(value, str) or not value:
            raise TypeError("must be a non-empty string")
        super().__init__(value, base=base)


class HexKey(_TextProvider):
    """``hex = "0011..."``: the key inline, as hex (keep such a config private)."""

    name = "hex"
    label = "hex"

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return decode_hex_key(self.value, what, sizes)


class EnvKey(_TextProvider):
    """``from_env = "VAR"``: the hex key in an environment variable."""

    name = "from_env"
    label = "env"

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return _hex_from_env(self.value, sizes, "from_env")


class FileKey(_TextProvider):
    """``file = "keys/k1.hex"``: a key file (relative to the config), mode 0600."""

    name = "file"
    label = "file"

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return key_from_file(os.path.join(self.base, os.path.expanduser(self.value)),
                             sizes=sizes)


class CommandKey(KeyProvider):
    """``command = ["pass", "show", "k1"]``: a command (no shell) that prints a hex key."""

    name = "command"
    label = "command"

    def __init__(self, value: Any, *, base: str) -> None:
        if not isinstance(value, list) or not value or not all(
                isinstance(a, str) for a in value):
            raise TypeError("must be a list of strings")
        super().__init__(value, base=base)

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return key_from_command(self.value, sizes=sizes)


def _raw_key(material: bytes, what: str, sizes: tuple[int, ...]) -> bytes:
    if len(material) not in sizes:
        raise InvalidKeyError(f"{what} is {len(material)} bytes; a key needs "
                              f"{' or '.join(map(str, sizes))}")
    return material


class RawKey(_TextProvider):
    """``raw = "..."``: ClickHouse's ``<key>``, the key's bytes as characters (UTF-8)."""

    name = "raw"
    label = "raw"

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return _raw_key(self.value.encode("utf-8"), what, sizes)


class RawEnvKey(_TextProvider):
    """``raw_from_env = "VAR"``: ClickHouse's ``<key from_env=...>``, raw characters."""

    name = "raw_from_env"
    label = "raw_env"

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        text = _env_text(self.value, "the key", f"export {self.value}=... before loading the "
                         "config")
        return _raw_key(text.encode("utf-8"), f"{what} (${self.value})", sizes)
