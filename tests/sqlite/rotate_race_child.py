"""Children of test_cli.py's rotation race: ``writer DB DIR OLD_HEX`` and ``rotate DIR ARGV...``
(a cryptdisk command that rewraps the database).

The writer holds a transaction (its rollback journal written), commits it once the
rotation has read the journal's header (or after 3 s), starts another transaction and
dies in it (``os._exit``): its journal must roll that transaction back. The rotation is
the command with a pause, after it read the journal's header, until the
writer died: the moment a provider's round trip (a KMIP call takes milliseconds) leaves
between the read and the write of the header.
"""

import os
import sys
import time


def wait_for(path, seconds):
    end = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)


def writer(db_path, directory, old_hex):
    import cryptdisk
    import cryptdisk.sqlite

    db = cryptdisk.sqlite.connect(db_path, keyring=cryptdisk.Keyring(
        [cryptdisk.Key(1, bytes.fromhex(old_hex))]), busy_timeout_ms=60000)
    db.execute("PRAGMA journal_mode=TRUNCATE")  # (a per-connection setting)
    db.execute("PRAGMA cache_size=5")  # pages spill into the database before the commit
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE t SET v = randomblob(3000)")
    open(os.path.join(directory, "journal"), "w").close()
    wait_for(os.path.join(directory, "read"), 3)
    db.execute("COMMIT")
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE t SET v = randomblob(3000), n = n + 1")
    open(os.path.join(directory, "died"), "w").close()
    os._exit(0)


def rotate(directory, *argv):
    import cryptdisk.keys._rotate as rot
    from cryptdisk.cli import main

    real = rot.read_open_header

    def paused(read, keys, name, **kwargs):
        opened = real(read, keys, name, **kwargs)
        if name.endswith("-journal"):
            open(os.path.join(directory, "read"), "w").close()
            wait_for(os.path.join(directory, "died"), 10)
        return opened

    rot.read_open_header = paused
    sys.exit(main(list(argv)))


if __name__ == "__main__":
    {"writer": writer, "rotate": rotate}[sys.argv[1]](*sys.argv[2:])
