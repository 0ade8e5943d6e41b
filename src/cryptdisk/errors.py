"""The one exception hierarchy of cryptdisk.

Every error cryptdisk raises on purpose derives from :class:`CryptdiskError`.
Where a built-in exception means the same thing, the class subclasses it too,
so ``except FileNotFoundError`` or ``except ValueError`` keep working::

    CryptdiskError
    ├── KeyringError
    │   ├── KeyNotFoundError          (LookupError)  no key with that id / fingerprint
    │   ├── InvalidKeyError           (ValueError)   short, long or malformed key material
    │   ├── WrongKeyError                            key id matches, key does not
    │   └── KeySourceError                           a key source could not produce the key
    │       ├── MissingEnvironmentVariableError
    │       ├── KeyFileError                         unreadable / malformed key file
    │       │   └── KeyFilePermissionError           key file readable by group or others
    │       ├── KeyCommandError                      external key command failed
    │       └── KeyProviderError                     an HSM or KMS failed, refused or timed out
    ├── FormatError                                  bytes are not a file we can parse
    │   ├── NotEncryptedError                        no cryptdisk (or ClickHouse) header
    │   ├── UnsupportedVersionError                  a header version/algorithm we do not know
    │   └── MalformedHeaderError                     header fields out of range
    ├── AuthenticationError                          integrity check failed: tampered data
    │   ├── HeaderAuthenticationError                header (key slot) does not authenticate
    │   ├── SegmentAuthenticationError               a data segment does not authenticate
    │   ├── TruncatedFileError                       the file ends before its final segment
    │   └── NameAuthenticationError                  an encrypted file name does not authenticate
    ├── ImmutableFileError        (io.UnsupportedOperation)  writing to a sealed file
    ├── FieldError                (ValueError)       a value a field function cannot protect
    │   └── FieldPolicyError                         a query its role's policies cannot read
    │       └── PolicyFileError                      a policy file or audit log holds bad JSON
    ├── ConfigError               (ValueError)       a config file is wrong; names path and line
    ├── DiskError                 (OSError)          a disk operation failed
    │   ├── DiskFileNotFoundError (FileNotFoundError)
    │   └── DiskIsADirectoryError (IsADirectoryError, ValueError)  a file operation on a directory
    ├── PolicyError               (LookupError)      unknown storage policy / volume / disk
    ├── DatabaseError                                the embedded database refused a statement
    │   ├── CatalogError                             catalog missing, tampered or rolled back
    │   ├── TableNotFoundError    (LookupError)
    │   ├── DatabaseLockedError                      another process holds the database
    │   ├── PublishConflictError                     another process published the same URL
    │   ├── NotSupportedError                        a statement form cryptdisk does not support
    │   └── RotationError                            a rotation cannot start or did not finish
    ├── BackupError                                  a backup repository is missing or damaged
    │   ├── BackupKeyError        (KeyringError)     no passphrase or key opens the repository
    │   └── BackupAuthenticationError (AuthenticationError)  a chunk or manifest fails it
    └── ServerError                                  cryptdisk serve refused a client or a setting
        ├── ProtocolError                            bytes that are not the PostgreSQL protocol
        ├── LoginError                               a login failed (one message for every cause)
        ├── UsersJournalMismatch                     user file and database restored apart
        └── UsersFileError                           a user file or record holds bad JSON

Messages say what is wrong and what to do. They never contain key material:
context (path, offset, key id) goes on attributes and into the message.
Authentication failures carry a fixed message plus the offset, as Fernet's
``InvalidToken`` and age's "failed to decrypt and authenticate chunk" do.
"""

from __future__ import annotations

import io

__all__ = [
    "AuthenticationError",
    "BackupAuthenticationError",
    "BackupError",
    "BackupKeyError",
    "CatalogError",
    "ConfigError",
    "CryptdiskError",
    "DatabaseError",
    "DatabaseLockedError",
    "DiskError",
    "DiskFileNotFoundError",
    "DiskIsADirectoryError",
    "FieldError",
    "FieldPolicyError",
    "FormatError",
    "HeaderAuthenticationError",
    "ImmutableFileError",
    "InvalidKeyError",
    "KeyCommandError",
    "KeyFileError",
    "KeyFilePermissionError",
    "KeyNotFoundError",
    "KeyProviderError",
    "KeySourceError",
    "KeyringError",
    "LoginError",
    "MalformedHeaderError",
    "MissingEnvironmentVariableError",
    "NameAuthenticationError",
    "NotEncryptedError",
    "NotSupportedError",
    "PolicyError",
    "PolicyFileError",
    "ProtocolError",
    "PublishConflictError",
    "RotationError",
    "SegmentAuthenticationError",
    "ServerError",
    "TableNotFoundError",
    "TruncatedFileError",
    "UnsupportedVersionError",
    "UsersFileError",
    "UsersJournalMismatch",
    "WrongKeyError",
    "with_location",
]


class CryptdiskError(Exception):
    """Base class of every error cryptdisk raises on purpose."""

    #: A short suggestion of what to do, shown by the CLI as ``cryptdisk: hint: ...``.
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


def with_location(exc: Exception, path: str | None, where: str) -> Exception:
    """The same exception class and attributes, with ``path:where:`` in front of the message.

    For errors raised while loading a config (a key source, a key's size), so the
    message names the file and the line or element at fault. Without a path the
    exception is returned unchanged, and so is one located in ``path`` already (an
    error of a key entry passing through the config's ``[keyring]``).
    """
    if not path or str(exc).startswith(f"{path}:"):
        return exc
    located = type(exc).__new__(type(exc))
    located.__dict__.update(getattr(exc, "__dict__", {}))
    located.args = (f"{_location(path, where, str(exc))}: {exc}",)
    return located


def _location(path: str, where: str | None, message: str) -> str:
    """``path:where``, or ``path`` alone when the message starts with ``where`` already
    (``key 6: ...``), so no message says it twice."""
    if not where or message.startswith(f"{where}:"):
        return path
    return f"{path}:{where}"


# --- keys -------------------------------------------------------------------


class KeyringError(CryptdiskError):
    """A key could not be found, loaded or used."""


class KeyNotFoundError(KeyringError, LookupError):
    """No key in the keyring has the id (or fingerprint) a file asks for."""

    def __init__(self, message: str, *, key_id: int | None = None, path: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key_id = key_id
        self.path = path

    def __str__(self) -> str:  # KeyError-like quoting is unhelpful; keep the plain message
        return str(self.args[0])


class InvalidKeyError(KeyringError, ValueError):
    """Key material has the wrong length or is not valid hex."""


class WrongKeyError(KeyringError):
    """The keyring has a key with the file's key id, but it is not the key that wrote it."""

    def __init__(self, message: str, *, key_id: int | None = None, path: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key_id = key_id
        self.path = path


class KeySourceError(KeyringError):
    """A key source (environment, file, command, KMS) could not produce its key."""


class MissingEnvironmentVariableError(KeySourceError):
    """The environment variable that should hold a key is not set or is empty."""

    def __init__(self, message: str, *, variable: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.variable = variable


class KeyFileError(KeySourceError):
    """A key file is missing, unreadable or does not contain one hex key."""


class KeyFilePermissionError(KeyFileError):
    """A key file is readable by group or others (as ssh refuses such private keys)."""


class KeyCommandError(KeySourceError):
    """An external key command failed or printed no valid key."""


class KeyProviderError(KeySourceError):
    """A provider that keeps its key (an HSM, a KMS) failed, refused or did not answer in time.

    The message names the provider, the key reference and the operation; never a PIN,
    a credential or key material. ``transient`` is true when the provider could not be
    reached or did not answer in time (worth retrying), false when it refused.
    """

    def __init__(self, message: str, *, hint: str | None = None,
                 transient: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.transient = transient


# --- format -----------------------------------------------------------------


class FormatError(CryptdiskError):
    """The bytes are not an encrypted file this version can parse."""


class NotEncryptedError(FormatError):
    """The file has no cryptdisk (or ClickHouse ``ENC``) header."""


class UnsupportedVersionError(FormatError):
    """The header names a format version, kind or algorithm this version does not know."""


class MalformedHeaderError(FormatError):
    """The header is too short or has fields out of range."""


class AuthenticationError(CryptdiskError):
    """Data failed authentication: the file was tampered with, truncated or corrupted.

    No plaintext of the failing part is ever released. ``offset`` is the byte
    offset (in the encrypted file) of the part that failed, ``path`` the file.
    """

    def __init__(self, message: str, *, offset: int | None = None, path: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.offset = offset
        self.path = path


class HeaderAuthenticationError(AuthenticationError):
    """The header does not authenticate under the key it names."""


class SegmentAuthenticationError(AuthenticationError):
    """A data segment does not authenticate (tampered, reordered, spliced or truncated)."""


class TruncatedFileError(AuthenticationError):
    """The file ends before its final segment: it was truncated."""


class NameAuthenticationError(AuthenticationError):
    """A stored file name on a disk with ``encrypt_names`` does not authenticate.

    It was changed or moved to another directory on the backing store, was
    never written by this disk, or was encrypted under another names key.
    ``path`` is the stored (encrypted) path; the message never shows key material.
    """


class ImmutableFileError(CryptdiskError, io.UnsupportedOperation):
    """Sealed files are written once; they cannot be opened for update."""


# --- configuration, disks, database -----------------------------------------


class ConfigError(CryptdiskError, ValueError):
    """A configuration file is malformed or inconsistent.

    ``path`` is the config file and ``where`` the line or element at fault.
    """

    def __init__(self, message: str, *, path: str | None = None, where: str | None = None,
                 hint: str | None = None) -> None:
        full = message
        if path is not None:
            full = f"{_location(path, where, message)}: {message}"
        super().__init__(full, hint=hint)
        self.path = path
        self.where = where


class DiskError(CryptdiskError, OSError):
    """A disk operation failed."""


class DiskFileNotFoundError(DiskError, FileNotFoundError):
    """The path does not exist on the disk."""


class DiskIsADirectoryError(DiskError, IsADirectoryError, ValueError):
    """A file operation named a directory (e.g. ``rm`` without ``recursive=True``).

    Also a ``ValueError``, which fsspec's ``LocalFileSystem.rm`` raises in that case.
    """


class PolicyError(CryptdiskError, LookupError):
    """Unknown storage policy, volume or disk."""

    def __str__(self) -> str:
        return str(self.args[0])


class DatabaseError(CryptdiskError):
    """The embedded database refused a statement or found its storage inconsistent."""


class CatalogError(DatabaseError):
    """The catalog is missing, tampered with, or disagrees with the parts on disk."""


class TableNotFoundError(DatabaseError, LookupError):
    """No table of that name."""

    def __str__(self) -> str:
        return str(self.args[0])


class DatabaseLockedError(DatabaseError):
    """Another process holds the database open for writing."""


class PublishConflictError(DatabaseError):
    """Another process published a catalog to the same URL meanwhile; nothing was overwritten."""


class NotSupportedError(DatabaseError):
    """A correctly written statement of a form the embedded database does not support
    (``ALTER TABLE t ADD COLUMN``); the message names what is supported, the hint the way
    round it. The server answers it with SQLSTATE 0A000."""


class RotationError(DatabaseError):
    """A key rotation or re-encryption cannot start, or did not leave every file as asked.

    ``files`` names the files left (with the reason for each).
    """

    def __init__(self, message: str, *, files: list[str] | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.files = list(files or [])


# --- backup -------------------------------------------------------------------


class BackupError(CryptdiskError):
    """A backup repository is missing, damaged, locked, or refused an operation."""


class BackupKeyError(BackupError, KeyringError):
    """No given passphrase or key opens the backup repository's key."""


class BackupAuthenticationError(BackupError, AuthenticationError):
    """A chunk, manifest or config MAC of a backup repository fails authentication
    (tampered, truncated, or from another repository); ``path`` names the object."""


# --- fields -------------------------------------------------------------------


class FieldError(CryptdiskError, ValueError):
    """A field function (cryptdisk.fields) cannot protect or unprotect a value.

    A character outside the alphabet, a domain smaller than FF1's minimum, a card
    number that fails the Luhn check. The message names the column or function,
    never the value's key.
    """


class FieldPolicyError(FieldError):
    """A query cannot be read through the masking and row access policies of its role.

    It is not a query (only queries are rewritten), names a table with policies in
    another schema, or a policy no longer parses. ``sqlstate`` is the PostgreSQL code
    ``cryptdisk serve`` answers with.
    """

    sqlstate = "42501"

    def __init__(self, message: str, sqlstate: str = "42501", *, hint: str | None = None
                 ) -> None:
        super().__init__(message, hint=hint)
        self.sqlstate = sqlstate


class PolicyFileError(FieldPolicyError):
    """A policy file (``PATH.policies``) or an audit log (``PATH.audit``) authenticates
    but does not hold what ``cryptdisk serve`` writes there: not JSON, a field missing or
    of the wrong type, a table set to a policy the file does not hold.

    ``path`` is the file; ``record`` the audit log's line number (1-based; None for the
    policy file). The message names the field at fault, never a value (a policy body
    or an audit record is not repeated). ``sqlstate`` is ``XX001`` (data corrupted).
    """

    def __init__(self, message: str, *, path: str | None = None, record: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, "XX001", hint=hint)
        self.path = path
        self.record = record


# --- server -------------------------------------------------------------------


class ServerError(CryptdiskError):
    """``cryptdisk serve`` refused a client, a statement or a setting."""


class ProtocolError(ServerError):
    """A client sent bytes that are not a valid PostgreSQL v3 protocol message."""


class LoginError(ServerError):
    """A login failed. The message is the same for an unknown user and a wrong password."""


class UsersJournalMismatch(ServerError):
    """The user file and the database's record of committed user changes do not belong
    together: one of them was restored from an older copy (or replaced).

    ``path`` is the user file, ``file_generation`` its generation and
    ``record_generation`` the record's (``cryptdisk serve --sqlite``).
    """

    def __init__(self, path: str, file: int, record: int) -> None:
        why = ("the user file is older than the database (restored from an older copy?)"
               if record > file else
               "the database is older than the user file (restored from an older copy?)"
               if record < file else
               "they hold different users (one of them was replaced)")
        super().__init__(
            f"the user file {path} is at generation {file}, but the database's record of "
            f"committed user changes is at generation {record}: {why}; the server does not "
            "start (nor change users) rather than guess which users are the right ones",
            hint="restore the user file and the database from the same backup, or choose: "
            "`cryptdisk serve PATH --sqlite --resolve-users file` keeps the user file's "
            "users (written into the database's record), `--resolve-users database` the "
            "database's (written into the user file)")
        self.path = path
        self.file_generation = file
        self.record_generation = record


class UsersFileError(ServerError):
    """A user file, or the database's record of committed user changes, authenticates
    but does not hold what cryptdisk writes there: not JSON, a field missing or of the
    wrong type.

    ``path`` is the user file, or the database that holds the record; ``record`` the
    record's number in the database (None for the user file). The message names the
    field at fault, never a value (a verifier is a secret).
    """

    def __init__(self, message: str, *, path: str | None = None, record: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path
        self.record = record
