"""Key providers that keep the key-encryption key: HSMs (PKCS#11) and KMS services.

Each is a :class:`~cryptdisk.keys.RemoteKeyProvider` registered in the key-provider
registry under the name a config's ``source = "NAME"`` selects, and imported only
when a config uses it (their libraries are the ``kms`` extra:
``pip install 'cryptdisk[kms]'``):

* ``pkcs11``: an AES key in a PKCS#11 token; the AES-GCM of every key slot runs in
  the token (:mod:`cryptdisk.keys.providers._pkcs11`).
* ``kmip``: a symmetric key on a KMIP 1.4+ server over mutual TLS; the AES-GCM of
  every key slot runs on the server (:mod:`cryptdisk.keys.providers._kmip`).
* ``aws-kms``: AWS KMS through boto3: the keyring key is stored wrapped by a KMS key
  and unwrapped for a bounded time (:mod:`cryptdisk.keys.providers._aws_kms`).

See ``docs/keys.md`` for the config, what stays where and the cache bounds.
"""

from ._aws_kms import AwsKmsProvider, create_aws_kms_key, create_aws_kms_wrapped_key
from ._kmip import KmipProvider, create_kmip_key, kmip_client
from ._pkcs11 import Pkcs11Provider, generate_pkcs11_key

__all__ = ["AwsKmsProvider", "KmipProvider", "Pkcs11Provider", "create_aws_kms_key",
           "create_aws_kms_wrapped_key", "create_kmip_key", "generate_pkcs11_key",
           "kmip_client"]
