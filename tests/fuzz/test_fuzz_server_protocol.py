"""The server protocol fuzz target on generated inputs: only CryptdiskError may escape."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from .fuzz_server_protocol import target


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes(data: bytes) -> None:
    target(data)


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(b"QPBDECSHXpdcf")),
                          st.binary(max_size=60)), max_size=6),
       st.binary(max_size=40))
def test_well_framed_messages_with_random_bodies(messages, startup) -> None:
    data = struct.pack("!i", len(startup) + 4) + startup
    data += b"".join(_message(bytes([k]), b) for k, b in messages)
    target(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_scram_messages_of_text(first: str, final: str) -> None:
    target(b"n,,n=," + first.encode() + b"r=" + final.encode())
