"""Keys: the keyring, key sources, and rotation by rewrapping headers.

Top tier: :class:`Keyring` (``Keyring.from_config(path)``), :class:`Key`,
:func:`rewrap_tree`. Key material never appears in ``repr``, messages or pickles.
"""

from ._key import Key
from ._keyring import Keyring, table_line
from ._rotate import RewrapSummary, iter_files, rewrap_file, rewrap_tree
from ._sources import decode_hex_key, key_from_command, key_from_env, key_from_file, write_key_file

__all__ = [
    "Key",
    "Keyring",
    "RewrapSummary",
    "decode_hex_key",
    "iter_files",
    "key_from_command",
    "key_from_env",
    "key_from_file",
    "rewrap_file",
    "rewrap_tree",
    "table_line",
    "write_key_file",
]
