"""A header read while a rewrap writes it (bytes of the old and the new header): what it
does, and that readers read it again until it opens (format/_reread.py).

The tear is made deterministically: the file holds a torn header (the new header's first
bytes, the old one's last), and the rewrap's write completes while the reader pauses
before its second read (the module's ``time.sleep`` is replaced by one that writes the
whole new header first). The same file read with no second read (``REREAD_DELAYS = ()``,
what readers did before) fails.
"""

from __future__ import annotations

import os
import types

import pytest

import cryptdisk
import cryptdisk.sqlite._header as sqlite_header
from cryptdisk import Key, Keyring
from cryptdisk.disks import EncryptedDisk, LocalDisk
from cryptdisk.errors import (
    HeaderAuthenticationError,
    KeyNotFoundError,
    MalformedHeaderError,
    WrongKeyError,
)
from cryptdisk.format import (
    HEADER_SIZE,
    REREAD_DELAYS,
    TORN_HEADER_ERRORS,
    Header,
    Kind,
    _reread,
    new_header,
    open_header,
    read_named_header,
    read_open_header,
    rewrap_header,
)
from cryptdisk.keys import rewrap_file

# key ids whose bytes differ in two places (1 = 01 00.., 256 = 00 01..): a cut between them
# gives id 0, which no keyring has
OLD, NEW = Key(1, b"\x11" * 32), Key(256, b"\x22" * 32)
OLD_RING, NEW_RING = Keyring([OLD, NEW], 1), Keyring([OLD, NEW], 256)
DATA = os.urandom(5000)

#: where the new header's bytes stop, and what a header torn there fails with
CUTS = [(33, KeyNotFoundError), (40, WrongKeyError), (64, HeaderAuthenticationError),
        (100, HeaderAuthenticationError)]


def _torn(old: bytes, new: bytes, cut: int) -> bytes:
    return new[:cut] + old[cut:]


def _old_and_new(path) -> tuple[bytes, bytes]:
    """The file's header, and the header a rewrap to NEW writes (the file left as it was)."""
    with open(path, "rb") as f:
        old = f.read(HEADER_SIZE)
    assert rewrap_file(path, NEW_RING)
    with open(path, "rb") as f:
        new = f.read(HEADER_SIZE)
    with open(path, "r+b") as f:
        f.write(old)
    return old, new


def _write_header(path, header: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, header, 0)
    finally:
        os.close(fd)


@pytest.fixture
def completes_while_reader_pauses(monkeypatch):
    """Pauses before every second read (none of 0 s), and a ``time`` for the modules
    that pause whose sleep first runs ``on_pause`` (the rewrap's write completing)."""
    pauses: list[float] = []
    state: dict[str, object] = {"on_pause": None}

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        action = state["on_pause"]
        if callable(action):
            action()

    fake = types.SimpleNamespace(sleep=sleep)
    monkeypatch.setattr(_reread, "REREAD_DELAYS", (0.001,) * len(REREAD_DELAYS))
    monkeypatch.setattr(_reread, "time", fake)
    monkeypatch.setattr(sqlite_header, "time", fake)
    return state, pauses


# -- what a torn header does -------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "aes-128-gcm"])
def test_a_torn_header_parses_and_fails_with_a_torn_header_error_at_every_cut(algorithm):
    """Bytes 0-32 and 112-128 are the same in both headers, so a torn header always
    parses; from 32 to 112 it never authenticates, and never gives another data key."""
    header, dek = new_header(Kind.SEALED, OLD, algorithm=algorithm)  # the data key's cipher
    old = header.to_bytes()
    new = rewrap_header(header, dek, NEW).to_bytes()
    assert old[:32] == new[:32] and old[112:] == new[112:]
    seen = set()
    for first, second in ((new, old), (old, new)):
        for cut in range(HEADER_SIZE + 1):
            parsed = Header.parse(_torn(second, first, cut))
            if 32 < cut < 112 and first[32:cut] != second[32:cut] \
                    and first[cut:112] != second[cut:112]:
                with pytest.raises(TORN_HEADER_ERRORS) as info:
                    open_header(parsed, OLD_RING)
                seen.add(type(info.value))
            else:
                assert open_header(parsed, OLD_RING) == dek
    assert seen == {KeyNotFoundError, WrongKeyError, HeaderAuthenticationError}


# -- readers read it again -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["wb", "w+b"])
@pytest.mark.parametrize(("cut", "error"), CUTS)
def test_open_reads_a_torn_header_again_and_opens_the_completed_one(
        tmp_path, completes_while_reader_pauses, mode, cut, error):
    state, pauses = completes_while_reader_pauses
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, mode, keyring=OLD_RING, segment_size=1024) as f:
        f.write(DATA)
    old, new = _old_and_new(path)
    _write_header(path, _torn(old, new, cut))
    state["on_pause"] = lambda: _write_header(path, new)
    with cryptdisk.open(path, "rb", keyring=OLD_RING) as f:
        assert f.read() == DATA
    assert pauses == [0.001]  # one failed read, one pause, the second read opened
    if mode == "w+b":
        _write_header(path, _torn(old, new, cut))
        pauses.clear()
        with cryptdisk.open(path, "r+b", keyring=OLD_RING) as f:
            assert f.read() == DATA
        assert pauses == [0.001]


@pytest.mark.parametrize(("cut", "error"), CUTS)
def test_without_a_second_read_the_torn_header_fails(tmp_path, monkeypatch, cut, error):
    """What a reader did before: one read, and the torn header's error."""
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    old, new = _old_and_new(path)
    _write_header(path, _torn(old, new, cut))
    monkeypatch.setattr(_reread, "REREAD_DELAYS", ())
    with pytest.raises(error):
        cryptdisk.open(path, "rb", keyring=OLD_RING)


@pytest.mark.parametrize(("cut", "error"), CUTS)
def test_an_encrypted_disk_reads_a_torn_header_again(tmp_path, completes_while_reader_pauses,
                                                     cut, error):
    state, pauses = completes_while_reader_pauses
    disk = EncryptedDisk("enc", LocalDisk("raw", str(tmp_path / "raw")), OLD_RING,
                         cache_bytes=0)
    with disk.open_write("a/part.bin") as f:
        f.write(DATA)
    path = tmp_path / "raw" / "a" / "part.bin"
    old, new = _old_and_new(path)
    _write_header(path, _torn(old, new, cut))
    state["on_pause"] = lambda: _write_header(path, new)
    with disk.open_read("a/part.bin") as f:
        assert f.read() == DATA
    assert pauses == [0.001]
    _write_header(path, _torn(old, new, cut))  # and what it says of the file's key
    pauses.clear()
    assert disk.stored_key_id("a/part.bin") == NEW.key_id
    # read again while its key id and check value name no key (from 48 on they do: NEW's)
    assert pauses == ([0.001] if cut < 48 else [])


def test_a_header_that_stays_torn_raises_its_error_after_the_reads(tmp_path):
    """Only an error that every read gives is raised: the one a single read gives, with
    the same message (no key material in it), after 1 + len(REREAD_DELAYS) reads."""
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    old, new = _old_and_new(path)
    torn = _torn(old, new, 64)
    _write_header(path, torn)
    with pytest.raises(HeaderAuthenticationError) as single:
        open_header(Header.parse(torn, str(path)), OLD_RING, str(path))
    with pytest.raises(HeaderAuthenticationError) as opened:
        cryptdisk.open(path, "rb", keyring=OLD_RING)
    assert str(opened.value) == str(single.value)
    assert "tampered with or corrupted" in str(opened.value)
    for key in (OLD, NEW):
        assert key.check_value.hex() not in str(opened.value)
    assert "1111" not in str(opened.value) and "2222" not in str(opened.value)
    reads = []

    def read() -> bytes:
        reads.append(1)
        return torn

    with pytest.raises(HeaderAuthenticationError):
        read_open_header(read, OLD_RING, str(path))
    assert len(reads) == 1 + len(REREAD_DELAYS)


def test_a_header_read_again_unchanged_is_not_unwrapped_again(tmp_path, monkeypatch):
    """The same bytes fail the same way: a header that stays bad costs one unwrap (one
    key provider call), however often it is read again."""
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    old, new = _old_and_new(path)
    torn = _torn(old, new, 64)
    unwraps = []

    def counted(header, keys, name):
        unwraps.append(header.to_bytes())
        return open_header(header, keys, name)

    monkeypatch.setattr(_reread, "open_header", counted)
    monkeypatch.setattr(_reread, "time", types.SimpleNamespace(sleep=lambda s: None))
    reads = []

    def read() -> bytes:
        reads.append(1)
        return torn

    with pytest.raises(HeaderAuthenticationError):
        read_open_header(read, OLD_RING, str(path))
    assert len(reads) == 1 + len(REREAD_DELAYS)
    assert unwraps == [torn]
    # a read that changes is unwrapped again, and the completed header opens
    answers = iter([torn, torn, new])
    header, _dek = read_open_header(lambda: next(answers), NEW_RING, str(path))
    assert header.to_bytes() == new
    assert unwraps == [torn, torn, new]


def test_a_genuinely_wrong_keyring_gives_its_usual_errors(tmp_path):
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    with pytest.raises(KeyNotFoundError, match="no key with id 1"):
        cryptdisk.open(path, "rb", keyring=Keyring([NEW], 256))
    with pytest.raises(WrongKeyError, match="not the key this file was encrypted with"):
        cryptdisk.open(path, "rb", keyring=Keyring([Key(1, b"\x33" * 32)], 1))


def test_errors_of_the_parse_are_raised_at_the_first_read(tmp_path):
    """A rewrap never changes the bytes the parse checks: nothing to wait for."""
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    with open(path, "rb") as f:
        header = bytearray(f.read(HEADER_SIZE))
    header[120] = 1  # a reserved byte
    reads = []

    def read() -> bytes:
        reads.append(1)
        return bytes(header)

    with pytest.raises(MalformedHeaderError, match="reserved header bytes are not zero"):
        read_open_header(read, OLD_RING, str(path))
    assert len(reads) == 1


def test_a_header_read_for_its_key_id_is_read_again_while_it_names_no_key(tmp_path):
    path = tmp_path / "f.cd"
    with cryptdisk.open(path, "wb", keyring=OLD_RING) as f:
        f.write(DATA)
    old, new = _old_and_new(path)
    torn = _torn(old, new, 33)  # key id 0
    reads = iter([torn, torn[:40] + bytes(8) + torn[48:], new])
    known = _reread.names_known_key(OLD_RING)
    assert read_named_header(lambda: next(reads), None, known).key_id == NEW.key_id
    # an id no key has, read twice the same: it is what the file says
    reads = iter([torn, torn])
    assert read_named_header(lambda: next(reads), None, known).key_id == 0
    # without keys to know: until two reads agree
    reads = iter([torn, new, new])
    assert read_named_header(lambda: next(reads)).key_id == NEW.key_id
