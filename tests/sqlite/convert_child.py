"""Child process for the kill -9 tests of ``cryptdisk sqlite encrypt|decrypt``.

Usage: convert_child.py MODE SRC DST KEY_HEX [PASSPHRASE]
MODE ``encrypt`` (plain SQLite), ``sqlcipher`` (a SQLCipher source) or ``decrypt``.
Copies a few pages (or one table) per step; after each step it prints ``step DONE TOTAL``
and waits for a line on stdin, the parent's word to go on (so a kill sent instead lands
there, in the middle of the copy); ``done`` once the conversion has returned.
"""

import sys

import cryptdisk
from cryptdisk.sqlite import _convert


def progress(done, total):
    print(f"step {done} {total}", flush=True)
    if not sys.stdin.readline():  # the parent went away
        sys.exit(1)


def main():
    mode, src, dst, key_hex = sys.argv[1:5]
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(key_hex))])
    _convert._STEP = 4  # pages per backup step: many steps, many kill points
    if mode == "encrypt":
        _convert.encrypt_database(src, dst, keyring, progress)
    elif mode == "sqlcipher":
        _convert.encrypt_sqlcipher_database(src, dst, keyring, sys.argv[5], progress)
    else:
        _convert.decrypt_database(src, dst, keyring, progress)
    print("done", flush=True)


if __name__ == "__main__":
    main()
