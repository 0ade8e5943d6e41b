"""Suite-wide setup.

The WAL indexes of encrypted SQLite databases (``$CRYPTDISK_SHM_DIR``, default
``/dev/shm``) go to a directory of this session under pytest's temporary directory, for
this process and every child it starts: a child killed as a database's last user leaves
its index behind (only the next open of that database deletes it, and a test's database
is gone by then), and the machine's ``/dev/shm`` would keep those files until a restart.
pytest keeps the temporary directories of its last three sessions and deletes older ones.
A test that needs another directory sets ``CRYPTDISK_SHM_DIR`` itself (monkeypatch).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

SHM_DIR_ENV = "CRYPTDISK_SHM_DIR"


@pytest.fixture(autouse=True, scope="session")
def _session_shm_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHM_DIR_ENV, str(tmp_path_factory.mktemp("shm")))
        yield
