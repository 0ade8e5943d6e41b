"""Argument types shared by the commands: a number out of range is a usage error
(``cryptdisk CMD: error: argument --id: ...``, status 2), never a traceback later."""

from __future__ import annotations

import argparse

from ..format import MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE
from ..keys import is_variable_name

__all__ = ["env_name", "key_id", "segment_size"]

MAX_KEY_ID = 2**64 - 1


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def key_id(text: str) -> int:
    """A key id: an integer from 0 to 2**64-1."""
    value = _int(text, "a key id")
    if not 0 <= value <= MAX_KEY_ID:
        raise argparse.ArgumentTypeError(
            f"a key id is from 0 to 2**64-1 ({MAX_KEY_ID}), not {text}")
    return value


def segment_size(text: str) -> int:
    """A segment size: a power of two from MIN_SEGMENT_SIZE to MAX_SEGMENT_SIZE."""
    value = _int(text, "a number of bytes")
    if value < 1 or value & (value - 1) or not MIN_SEGMENT_SIZE <= value <= MAX_SEGMENT_SIZE:
        raise argparse.ArgumentTypeError(
            f"a segment size is a power of two from {MIN_SEGMENT_SIZE} to {MAX_SEGMENT_SIZE}, "
            f"not {text}")
    return value


def env_name(text: str) -> str:
    """The name of an environment variable (``--key-env VAR``, ``--passphrase-env VAR``).

    A key or passphrase given in its place is refused without being echoed: the error
    would otherwise print it (and its hint, an ``export`` line, a second time)."""
    if not is_variable_name(text):
        raise argparse.ArgumentTypeError(
            "takes the NAME of an environment variable (such as CRYPTDISK_KEY), not a key "
            "or passphrase; what was given is not a variable name (not shown)")
    return text
