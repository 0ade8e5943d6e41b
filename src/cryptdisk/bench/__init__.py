"""The benchmark suite (``cryptdisk bench``): io, olap, oltp and crypto experiments."""
