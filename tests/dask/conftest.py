import pytest

distributed = pytest.importorskip("distributed", reason="the test extra installs distributed")


@pytest.fixture(scope="package")
def client():
    """Two worker processes, one thread each, on loopback only."""
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address=None,
                                  worker_dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c
