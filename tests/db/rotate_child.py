"""Child for the kill -9 rotation test: rotates a database made without a config to a new key.

Usage: rotate_child.py DB NEW_KEY_FILE
Prints ``rotated NAME`` after each file it has rewrapped, then waits for a
``go`` line on stdin before going on, so the parent kills it at a known point.
"""

import sys

import cryptdisk
from cryptdisk.keys import Key, read_key_file


def report(name):
    print(f"rotated {name}", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)


def main():
    path, key_file = sys.argv[1:3]
    material, key_id = read_key_file(key_file)
    with cryptdisk.connect(path) as db:
        db.rotate_keys(report, new_key=Key(key_id, material))
    print("done", flush=True)


if __name__ == "__main__":
    main()
