import contextlib
import os
import secrets

import pytest

distributed = pytest.importorskip("distributed", reason="the test extra installs distributed")

S3_BUCKET = "cryptdisk-dask"


@contextlib.contextmanager
def local_cluster():
    """Two worker processes, one thread each; every socket (HTTP too) on loopback, port 0."""
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  worker_dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="package")
def s3():
    """moto's S3 server on loopback, and a random AWS secret key in the environment.

    Started before the package's cluster, so its worker processes inherit the
    credentials from the environment, as a deployment's workers do (never from a
    config or storage_options); the secret is random so a test can look for it.
    """
    from ..disks.s3server import make_bucket, s3_server

    with s3_server() as endpoint:
        os.environ["AWS_SECRET_ACCESS_KEY"] = secrets.token_hex(20)  # restored on exit
        make_bucket(endpoint, S3_BUCKET)
        yield endpoint, os.environ["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture(scope="package")
def client(s3):
    with local_cluster() as c:
        yield c


@pytest.fixture(autouse=True, scope="module")
def _close_planning_connections():
    """Close the read-only connections that cryptdisk.dask's planning kept in this process
    (one per database, kept for the process's next read): each test module's databases are
    its own, and each connection left open held DuckDB's 9 threads and about 4 MB for the
    rest of the test run (about 150 threads after this package)."""
    yield
    from cryptdisk.dask import _read

    with _read._OPEN_LOCK:
        kept = [k.db for k in _read._OPEN.values() if k.pid == os.getpid()]
        _read._OPEN.clear()
    for db in kept:
        db.close()
