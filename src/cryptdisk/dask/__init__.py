"""Encrypted tables as Dask DataFrames, read by workers that load the keys themselves.

::

    import cryptdisk.dask

    df = cryptdisk.dask.read_table("analytics.db", "events", columns=["k", "v"],
                                   filters=[("k", ">=", 1000)], config="cryptdisk.toml")
    df.v.sum().compute()        # on any Dask scheduler, distributed included

Tasks carry the database path, the config path, a part id, the columns and the
filters, never key material. Needs the ``dask`` extra (``pip install
'cryptdisk[dask]'``); ``import cryptdisk`` never imports Dask.
"""

from ._read import read_table

__all__ = ["read_table"]
