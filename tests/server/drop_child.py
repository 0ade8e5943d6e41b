"""Child for the kill -9 test of a server's DROP TABLE: stops before the catalog's commit.

Usage: drop_child.py DB CONFIG USERS TABLE

Serves nothing: runs ``DROP TABLE TABLE`` as the server's analytical engine session of an
admin does (its grants removed from the user file USERS first), prints ``open``, and when
the catalog is about to be published prints ``paused`` and sleeps until killed.
"""

import os
import sys
import time

from cryptdisk.server import AnalyticalEngine, Privileges, UserStore


def main():
    path, config, users, table = sys.argv[1:5]
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if os.path.basename(os.fspath(dst)) == "catalog":
            print("paused", flush=True)
            time.sleep(600)
        return real_replace(src, dst, *args, **kwargs)

    engine = AnalyticalEngine(path, config)
    store = UserStore(users, engine.keyring, iterations=4096)
    session = engine.open_session()
    session.set_privileges(Privileges(store, "admin"))
    os.replace = replace
    print("open", flush=True)
    session.run(f"DROP TABLE {table}", [])
    print("done", flush=True)


if __name__ == "__main__":
    main()
