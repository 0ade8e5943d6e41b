"""Encrypted tables as Dask DataFrames, read and written by workers that load the keys.

::

    import cryptdisk.dask

    df = cryptdisk.dask.read_table("analytics.db", "events", columns=["k", "v"],
                                   filters=[("k", ">=", 1000)], config="cryptdisk.toml")
    df.v.sum().compute()        # on any Dask scheduler, distributed included
    cryptdisk.dask.to_table(df, "analytics.db", "events_copy", config="cryptdisk.toml")

Tasks carry the database path, the config path, part ids, columns and filters,
never key material. Needs the ``dask`` extra (``pip install 'cryptdisk[dask]'``);
``import cryptdisk`` never imports Dask.
"""

from ._read import read_table
from ._write import to_table

__all__ = ["read_table", "to_table"]
