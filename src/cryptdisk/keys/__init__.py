"""Keys: the keyring, key sources and providers, and rotation by rewrapping headers.

Top tier: :class:`Keyring` (``Keyring.from_config(path)``), :class:`Key`,
:func:`rewrap_tree`; the key lifecycle of a config (:class:`KeyConfig`: add, promote,
retire, destroy; :func:`key_usage` counts files per key from their headers) and the
key audit log (``AUDIT_ENV``). Key material never appears in ``repr``, messages or pickles.

Lower tier, easy to misuse: :func:`export_key_material` (a key's bytes, for the few
layers that must hand them on), :class:`KeyProvider` and its registry
(:func:`register_key_provider`, the entry-point group ``cryptdisk.key_providers``),
and :func:`parse_key_entry`, the one reader of key entries in configs.
Keys that stay in an HSM or KMS: :class:`RemoteKeyProvider` (the contract),
:class:`ProviderKey` (a :class:`Key` that wraps through it) and :class:`UnwrapCache`;
the providers themselves are in :mod:`cryptdisk.keys.providers`.
"""

from ._audit import AUDIT_ENV
from ._exposure import config_exposure
from ._hygiene import is_dumpable, protect_process
from ._kek import WrappedKekProvider, create_wrapped_key
from ._key import Key, export_key_material
from ._keyring import FollowingKeyring, Keyring, file_stamp
from ._lifecycle import KeyConfig, KeyEntryState, files_under_key, key_usage
from ._provider import (
    ENTRY_POINT_GROUP,
    KeyEntry,
    KeyProvider,
    get_key_provider,
    key_provider_names,
    parse_key_entry,
    register_key_provider,
)
from ._remote import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CACHE_SECONDS,
    ProviderKey,
    RemoteKeyProvider,
    RetryPolicy,
    UnwrapCache,
    close_provider_keys,
    closed_on_error,
)
from ._rotate import RewrapSummary, iter_files, rewrap_descriptor, rewrap_file, rewrap_tree
from ._sources import (
    decode_hex_key,
    is_variable_name,
    key_from_command,
    key_from_env,
    key_from_file,
    not_a_variable_name,
    read_key_file,
    shown_value,
    write_key_file,
)

__all__ = [
    "AUDIT_ENV",
    "DEFAULT_CACHE_ENTRIES",
    "DEFAULT_CACHE_SECONDS",
    "ENTRY_POINT_GROUP",
    "FollowingKeyring",
    "Key",
    "KeyConfig",
    "KeyEntry",
    "KeyEntryState",
    "KeyProvider",
    "Keyring",
    "ProviderKey",
    "RemoteKeyProvider",
    "RetryPolicy",
    "RewrapSummary",
    "UnwrapCache",
    "WrappedKekProvider",
    "close_provider_keys",
    "closed_on_error",
    "config_exposure",
    "create_wrapped_key",
    "decode_hex_key",
    "export_key_material",
    "file_stamp",
    "files_under_key",
    "get_key_provider",
    "is_dumpable",
    "is_variable_name",
    "iter_files",
    "key_from_command",
    "key_from_env",
    "key_from_file",
    "key_provider_names",
    "key_usage",
    "not_a_variable_name",
    "parse_key_entry",
    "protect_process",
    "read_key_file",
    "register_key_provider",
    "rewrap_descriptor",
    "rewrap_file",
    "rewrap_tree",
    "shown_value",
    "write_key_file",
]
