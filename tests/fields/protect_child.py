"""Run protect_file, reporting each batch on stdout and waiting for a line on stdin after it
(the parent kills this process at a report)."""

import sys

from cryptdisk.fields import FieldKeys, _protect, parse_rule, protect_file

src, dst, config = sys.argv[1:4]
real = _protect.protect_table
count = 0


def reporting(batch, rules, keys, **options):
    global count
    out = real(batch, rules, keys, **options)
    count += 1
    print(f"batch {count}", flush=True)
    sys.stdin.readline()
    return out


_protect.protect_table = reporting
protect_file(src, dst, [parse_rule("pan=fpe_encrypt:cards")], FieldKeys.from_config(config),
             replace=True)
print("done", flush=True)
