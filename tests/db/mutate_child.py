"""Child process for the kill -9 tests of DELETE and UPDATE: runs them until killed.

Usage: mutate_child.py DB CONFIG FIRST_STEP
Prints ``start SQL`` before each statement and ``done`` after it returned, and, while a
statement runs, ``rewrite`` as it reads each row group of a part it rewrites, ``commit``
just before it publishes the catalog and ``published`` just after (before the old parts
are deleted). After each of these three it waits for a line on stdin, the parent's word to
go on, so a kill the parent sends instead lands exactly there.
"""

import sys

import cryptdisk
from cryptdisk.db import _maintenance, _mutate


def _say(word):
    print(word, flush=True)
    if not sys.stdin.readline():  # the parent went away
        sys.exit(1)


def instrument():
    rewritten, replace, remove = (_mutate._rewritten, _maintenance.MaintenanceMixin._replace_parts,
                                  _maintenance.MaintenanceMixin._remove_parts)

    def rewritten_(*args):
        for batch in rewritten(*args):
            _say("rewrite")
            yield batch

    def replace_(self, meta, new, **changes):
        _say("commit")
        return replace(self, meta, new, **changes)

    def remove_(self, parts):
        _say("published")
        return remove(self, parts)

    _mutate._rewritten = rewritten_
    _maintenance.MaintenanceMixin._replace_parts = replace_
    _maintenance.MaintenanceMixin._remove_parts = remove_


def statement(k):
    if k % 2:
        return f"DELETE FROM t WHERE c_int % 97 = {k // 2 % 97}"
    return f"UPDATE t SET c_float = c_float + 1, c_str = 'u{k}' WHERE c_int % 5 = {k // 2 % 5}"


def main():
    path, cfg, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from cryptdisk.db import _parts

    _parts.ROW_GROUP_ROWS = 100  # several row groups per part
    instrument()
    db = cryptdisk.connect(path, cfg)
    for k in range(first, first + 1000):
        sql = statement(k)
        print(f"start {sql}", flush=True)
        db.execute(sql)
        print("done", flush=True)


if __name__ == "__main__":
    main()
