import contextlib

import pytest

distributed = pytest.importorskip("distributed", reason="the test extra installs distributed")


@contextlib.contextmanager
def local_cluster():
    """Two worker processes, one thread each; every socket (HTTP too) on loopback, port 0."""
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  worker_dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="package")
def client():
    with local_cluster() as c:
        yield c
