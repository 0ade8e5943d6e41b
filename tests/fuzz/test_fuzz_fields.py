"""CI's run of the field ciphertext fuzz target on hypothesis-generated inputs."""

from __future__ import annotations

import base64

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.fuzz_fields import _load, check


def _genuine() -> bytes:
    return next(iter(_load().genuine))


def _mutate(data: bytes, positions: list[int], values: list[int]) -> bytes:
    out = bytearray(data)
    for p, v in zip(positions, values, strict=False):
        out[p % len(out)] = v
    return bytes(out)


_headed = st.builds(lambda kid, body: b"\x01" + kid + body,
                    st.sampled_from([b"\x00\x00\x00\x01", b"\x00\x00\x00\x02", b"\xff" * 4]),
                    st.binary(max_size=64))
_mutated = st.builds(lambda p, v: _mutate(_genuine(), p, v),
                     st.lists(st.integers(0, 64), min_size=1, max_size=3),
                     st.lists(st.integers(0, 255), min_size=1, max_size=3))
_text = st.builds(lambda b: base64.b64encode(b), st.one_of(_headed, _mutated))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=80), _headed, _mutated, _text))
def test_only_documented_exceptions(data):
    check(data)


def test_the_genuine_value_decrypts():
    check(_genuine())
    assert _load().fields.decrypt_deterministic([_genuine()], _load().key,
                                                output="binary")[0].as_py() == b"plain"
