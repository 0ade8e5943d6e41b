"""cryptdisk:// datasets with dd.to_parquet / dd.read_parquet on a LocalCluster: the
storage_options carry a config path, the workers load the keys, the files are encrypted."""


import cloudpickle
import dask.dataframe as dd
import pandas as pd
import pytest

from cryptdisk.format import MAGIC

from ..db.dbhelpers import write_config
from .daskhelpers import key_needles

# dask 2026.8's read_parquet calls reset_index and set_index with inplace=True (deprecated
# by pandas 3.1)
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame")


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, [1], 1)


def test_a_dataset_round_trips_through_the_cluster_encrypted(client, cfg, tmp_path):
    opts = {"config": str(cfg)}
    pdf = pd.DataFrame({"k": range(3000), "s": [f"value-{i % 97}" for i in range(3000)],
                        "f": [i / 7 for i in range(3000)]})
    ddf = dd.from_pandas(pdf, npartitions=3)
    write = ddf.to_parquet("cryptdisk://secure/ds", storage_options=opts, compute=False)
    client.compute(write).result()
    files = sorted((tmp_path / "store" / "secure" / "ds").iterdir())
    parquet = [f for f in files if f.suffix == ".parquet"]
    assert len(parquet) == 3
    for f in parquet:  # sealed by the workers: no Parquet magic, no plaintext value
        data = f.read_bytes()
        assert data.startswith(MAGIC) and b"PAR1" not in data[:64] and b"value-96" not in data

    back = dd.read_parquet("cryptdisk://secure/ds", storage_options=opts)
    got = client.compute(back).result().sort_values("k").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pdf, check_dtype=False)
    filtered = dd.read_parquet("cryptdisk://secure/ds", storage_options=opts,
                               filters=[("k", ">=", 2500)])
    assert sorted(client.compute(filtered.k).result()) == list(range(2500, 3000))


def test_dataset_graphs_carry_the_config_path_not_the_key(cfg, tmp_path):
    needles = key_needles(tmp_path)
    opts = {"config": str(cfg)}
    pdf = pd.DataFrame({"k": range(10)})
    dd.from_pandas(pdf, npartitions=1).to_parquet("cryptdisk://secure/small",
                                                  storage_options=opts)
    graphs = [dd.read_parquet("cryptdisk://secure/small", storage_options=opts),
              dd.from_pandas(pdf, npartitions=2).to_parquet(
                  "cryptdisk://secure/other", storage_options=opts, compute=False)]
    seen = 0
    for g in graphs:
        for task in dict(g.__dask_graph__()).values():
            blob = cloudpickle.dumps(task)  # what distributed sends for a task
            assert not any(n in blob for n in needles)
            seen += str(cfg).encode() in blob
    assert seen >= 1
