"""Checking JSON read from an authenticated file, in words that never quote its values.

The user file, the policy file and the audit log hold JSON sealed under the keyring: a
record that authenticates yet is malformed (another version's, a bug's) is reported as
a clear error naming the file and the field, never the value (a verifier, a policy body).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["kind", "load_object", "position"]


def kind(value: Any) -> str:
    """What a JSON value is, in words (never the value)."""
    return ("null" if value is None else "true or false" if isinstance(value, bool) else
            "a number" if isinstance(value, int | float) else "a string"
            if isinstance(value, str) else "a list" if isinstance(value, list) else
            "an object")


def position(exc: ValueError | RecursionError) -> str:
    """Where a ``json.loads`` failed (never the text)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"byte {exc.start}"
    if isinstance(exc, RecursionError):
        return "a nesting too deep to read"
    return "its start"


def load_object(text: bytes, bad: Callable[[str], Exception]) -> dict[str, Any]:
    """The JSON object ``text`` holds; ``bad(what)`` is raised when it holds none."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError,
        # an integer of too many digits, lists nested past Python's recursion limit
        raise bad(f"not JSON ({type(exc).__name__} at {position(exc)})") from None
    if not isinstance(data, dict):
        raise bad(f"{kind(data)}, not an object")
    return data
