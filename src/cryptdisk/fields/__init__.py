"""Field-level protection: column encryption, FF1 format-preserving encryption, tokens, masks.

Vectorised functions over Arrow arrays, keyed by named field keys
(``[fields.keys.NAME]`` in a cryptdisk config, apart from the at-rest keyring)::

    from cryptdisk.fields import FieldKeys, encrypt, decrypt, fpe_encrypt

    keys = FieldKeys.from_config("cryptdisk.toml")
    token = fpe_encrypt(["4111111111111111"], keys["cards"], "pan")
    blob = encrypt(["secret"], keys["cards"])

Importing this package also gives every database opened afterwards
(``cryptdisk.connect``) the SQL functions ``encrypt``, ``decrypt``,
``encrypt_deterministic``, ``decrypt_deterministic``, ``fpe_encrypt``,
``fpe_decrypt``, ``tokenize``, ``detokenize``, ``mask_full``, ``mask_last4``,
``mask_email``, ``mask_null`` and ``mask_hash``, with the keys of the database's
config. See docs/fields.md (and fields-ingestion.md, fields-rotation.md,
fields-scan.md, fields-policies.md).

Lower tier, easy to misuse: :func:`ff1_encrypt` / :func:`ff1_decrypt`, the bare
FF1 mode over numeral matrices.
"""

from ..db import add_connection_hook
from ._aead import (
    decrypt,
    decrypt_deterministic,
    encrypt,
    encrypt_deterministic,
    native_library,
)
from ._ff1 import MIN_DOMAIN, ff1_decrypt, ff1_encrypt
from ._fpe import ALPHABETS, Alphabet, fpe_decrypt, fpe_encrypt
from ._keys import FieldKey, FieldKeys
from ._mask import mask_email, mask_full, mask_hash, mask_last4, mask_null
from ._protect import (
    ProtectRule,
    ProtectSummary,
    parse_rule,
    protect_file,
    protect_insert,
    protect_table,
)
from ._sql import SQL_FUNCTIONS, config_hook, register_sql_functions
from ._tokens import detokenize, luhn_valid, tokenize

add_connection_hook(config_hook)

__all__ = [
    "ALPHABETS",
    "MIN_DOMAIN",
    "SQL_FUNCTIONS",
    "Alphabet",
    "FieldKey",
    "FieldKeys",
    "ProtectRule",
    "ProtectSummary",
    "decrypt",
    "decrypt_deterministic",
    "detokenize",
    "encrypt",
    "encrypt_deterministic",
    "ff1_decrypt",
    "ff1_encrypt",
    "fpe_decrypt",
    "fpe_encrypt",
    "luhn_valid",
    "mask_email",
    "mask_full",
    "mask_hash",
    "mask_last4",
    "mask_null",
    "native_library",
    "parse_rule",
    "protect_file",
    "protect_insert",
    "protect_table",
    "register_sql_functions",
    "tokenize",
]
