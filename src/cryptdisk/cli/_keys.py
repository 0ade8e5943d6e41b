"""Key options shared by the commands: -c/--keyring/--config, --key-env, --key-file, --key-hex."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..errors import KeyringError
from ..keys import Key, Keyring, decode_hex_key, key_from_env, read_key_file
from ._args import env_name, key_id

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["add_key_options", "config_from_args", "keyring_from_args", "keys_given"]

KEYRING_ENV = "CRYPTDISK_KEYRING"


def add_key_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add the ways to give keys. Exactly one may be used."""
    group = parser.add_argument_group(
        "keys", "where the key(s) come from (one of these; default: $CRYPTDISK_KEYRING)"
    )
    group.add_argument("-c", "--keyring", "--config", dest="keyring", metavar="CONFIG",
                       help="cryptdisk TOML config ([keyring] and disks' keys) or a ClickHouse "
                       "storage_configuration XML")
    group.add_argument("--key-env", type=env_name, metavar="VAR",
                       help="environment variable holding a hex key")
    group.add_argument("--key-file", metavar="PATH",
                       help="key file as written by 'cryptdisk keygen' (mode 0600)")
    group.add_argument("--key-hex", metavar="HEX",
                       help="a hex key on the command line (visible in process listings!)")
    group.add_argument("--key-id", type=key_id, default=None, metavar="N",
                       help="id of a single key given by --key-env/--key-file/--key-hex "
                       "(for new files; default: the id a key file notes, else 1)")
    parser.set_defaults(_keys_required=required)


def config_from_args(args: argparse.Namespace) -> Config | None:
    """The full config (all disks' keys, ClickHouse XML too) when one was given, else None."""
    path = getattr(args, "keyring", None) or (
        None if _single_key_given(args) else os.environ.get(KEYRING_ENV))
    if not path:
        return None
    from ..config import load_config

    return load_config(path)


def _single_key_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, n, None) for n in ("key_env", "key_file", "key_hex"))


def keys_given(args: argparse.Namespace) -> bool:
    """Whether the command line (or ``$CRYPTDISK_KEYRING``) names any key."""
    return bool(getattr(args, "keyring", None) or _single_key_given(args)
                or os.environ.get(KEYRING_ENV))


def keyring_from_args(args: argparse.Namespace) -> Keyring:
    """Build the keyring the user asked for, with a clear error when none was given."""
    given = [name for name in ("keyring", "key_env", "key_file", "key_hex")
             if getattr(args, name, None)]
    if len(given) > 1:
        flags = ", ".join("--" + g.replace("_", "-") for g in given)
        raise KeyringError(f"give keys one way only (got {flags})")
    if not given:
        env_config = os.environ.get(KEYRING_ENV)
        if env_config:
            return _config_keyring(env_config)
        raise KeyringError(
            "no key given",
            hint="use --keyring CONFIG, --key-file PATH or --key-env VAR "
            f"(or set {KEYRING_ENV} to a config path)",
        )
    source = given[0]
    if source == "keyring":
        return _config_keyring(args.keyring)
    key_id = args.key_id
    if source == "key_env":
        material = key_from_env(args.key_env)
        kind = "env"
    elif source == "key_file":
        material, noted = read_key_file(args.key_file)
        kind = "file"
        if key_id is None:
            key_id = noted  # the id keygen --id wrote in the file and its config snippet
        elif noted is not None and noted != key_id:
            raise KeyringError(f"--key-id {key_id}: the key file {args.key_file} is key "
                               f"{noted}", hint="leave --key-id out: a key file's own id is "
                               "used")
    else:
        print("cryptdisk: warning: a key given with --key-hex shows in process listings and "
              "shell history; prefer --key-file or --key-env", file=sys.stderr)
        material = decode_hex_key(args.key_hex, "--key-hex")
        kind = "hex"
    return Keyring.single(Key(1 if key_id is None else key_id, material, source=kind))


def _config_keyring(path: str) -> Keyring:
    """The ``[keyring]`` of a config (TOML or XML) for new files, or a clear error."""
    if path.endswith(".xml"):
        raise KeyringError(
            f"{path} is a ClickHouse config: it has no [keyring] for cryptdisk's own files",
            hint="write cryptdisk files with a TOML config that has a [keyring] section",
        )
    return Keyring.from_config(path)
