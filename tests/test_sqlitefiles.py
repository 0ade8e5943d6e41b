"""cryptdisk._sqlitefiles: what SQLite keeps beside a database, as tools copying files see it."""

from __future__ import annotations

from pathlib import Path

from cryptdisk._sqlitefiles import JOURNAL_MAGIC, journal_holds_rollback

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cryptdisk"


def test_a_journal_holds_a_rollback_when_it_starts_with_the_magic_or_cannot_be_read():
    assert journal_holds_rollback(JOURNAL_MAGIC)
    assert journal_holds_rollback(JOURNAL_MAGIC + b"more")
    assert journal_holds_rollback(None)  # does not open: cannot be told apart
    assert not journal_holds_rollback(bytes(8))  # PERSIST's zeroed header
    assert not journal_holds_rollback(b"")
    assert not journal_holds_rollback(JOURNAL_MAGIC[:3])  # torn: SQLite deletes it


def test_the_journal_magic_is_defined_once():
    """cli/files.py and disks/_convert.py each kept their own copy of the magic and of the
    hot-journal test, and disagreed on a short journal."""
    spellings = (JOURNAL_MAGIC.hex(), "".join(f"\\x{b:02x}" for b in JOURNAL_MAGIC))
    holders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if any(s in p.read_text().lower() for s in spellings))
    assert holders == ["_sqlitefiles.py"]
