"""Child processes for the backup tests (run as scripts).

``writer db PATH`` / ``writer sqlite PATH KEYFILE``: insert batches of rows forever,
printing ``committed N`` after each commit (the db writer merges parts now and then).
``backup REPO PASSPHRASE SOURCE [step]``: one backup, printing ``chunk N`` after each
chunk (with ``step``, waiting for a line on stdin after each), then ``done ID``.
``prune REPO PASSPHRASE N``: keep the last N, printing ``deleted N`` after each chunk and
waiting for a line on stdin before going on.
``restore REPO PASSPHRASE ID TARGET [KEYFILE [CONFIG [force]]]``: one restore (a SQLite one
under the key in KEYFILE, a database under CONFIG when given; with ``force`` over an
existing TARGET), printing ``part N`` at each progress report and, with ``force``,
``swap 1`` just before the new database takes TARGET's place and ``swapped 1`` just
after, waiting for a line on stdin after each.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from cryptdisk.backup import Repository, create, prune, restore


def writer_db(path: str) -> None:
    import cryptdisk

    db = cryptdisk.connect(path)
    n = 0
    while True:
        db.sql(f"INSERT INTO w SELECT {n}, range FROM range(1000)")
        print(f"committed {n}", flush=True)
        n += 1
        if n % 4 == 0:
            db.sql("OPTIMIZE TABLE w")  # parts of older catalogs go away


def writer_sqlite(path: str, keyfile: str) -> None:
    import cryptdisk.sqlite
    from cryptdisk.keys import Key, Keyring, key_from_file

    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    c = cryptdisk.sqlite.connect(path, keyring=kr)
    n = 0
    while True:
        with c:
            c.executemany("INSERT INTO w VALUES (?, ?)", [(n, i) for i in range(1000)])
        print(f"committed {n}", flush=True)
        n += 1


def backup(repo: str, passphrase: str, source: str, step: str = "") -> None:
    r = Repository.open(repo, passphrase=passphrase)

    def report(n: int, _stored: int) -> None:
        print(f"chunk {n}", flush=True)
        if step:  # wait for the parent's go-ahead: it kills here
            sys.stdin.readline()

    s = create(r, source, progress=report)
    print(f"done {s.id} {s.new_chunks}", flush=True)


def prune_(repo: str, passphrase: str, keep: str) -> None:
    r = Repository.open(repo, passphrase=passphrase)
    def report(n: int) -> None:  # then wait for the parent's go-ahead: it kills here
        print(f"deleted {n}", flush=True)
        sys.stdin.readline()

    prune(r, keep_last=int(keep), progress=report)
    print("done", flush=True)


def restore_(repo: str, passphrase: str, backup_id: str, target: str, keyfile: str = "",
             config: str = "", force: str = "") -> None:
    from cryptdisk.backup import _ops
    from cryptdisk.keys import Key, Keyring, key_from_file

    kr = Keyring.single(Key(1, key_from_file(keyfile))) if keyfile else None
    r = Repository.open(repo, passphrase=passphrase)
    def report(n: int, word: str = "part") -> None:  # then wait: the parent kills here
        print(f"{word} {n}", flush=True)
        sys.stdin.readline()

    def around(swap: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def run(a: str, b: str) -> None:
            report(1, "swap")
            swap(a, b)
            report(1, "swapped")
        return run

    _ops.exchange = around(_ops.exchange)  # type: ignore[assignment]
    _ops._replace_file = around(_ops._replace_file)  # type: ignore[assignment]
    restore(r, backup_id, target, keyring=kr, config=config or None, progress=report,
            replace=bool(force))
    print("done", flush=True)


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    if what == "writer" and rest[0] == "db":
        writer_db(rest[1])
    elif what == "writer":
        writer_sqlite(rest[1], rest[2])
    elif what == "prune":
        prune_(*rest)
    elif what == "restore":
        restore_(*rest)
    else:
        backup(*rest)
