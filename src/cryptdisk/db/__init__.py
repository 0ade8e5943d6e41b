"""The embedded database: tables on storage policies, DuckDB SQL, encrypted storage.

::

    import cryptdisk

    db = cryptdisk.connect("analytics.db")      # key created in analytics.db.key
    db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE)")
    db.sql("INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 FROM range(1000)")
    db.sql("SELECT avg(c_float) FROM t")         # an Arrow table
    with db.stream("SELECT * FROM t") as s:      # Arrow batches, computed as read
        for batch in s: ...

Tables are encrypted unless their storage policy says otherwise; DuckDB runs
the SQL on decrypted columns held in a bounded in-memory cache.
"""

from ._cache import DEFAULT_COLUMN_CACHE_BYTES, ColumnCache
from ._columns import parser_cursor, scalar, serialize_sql
from ._database import Database, Reader, add_connection_hook, connect
from ._params import sql_literal
from ._policies import (
    MutationPolicy,
    PolicyRewriter,
    PolicySession,
    mutation_policies,
    quiet_error,
    read_policies,
    role_query,
)
from ._remote import is_url, location, publish
from ._rows import Rows, exact_uhugeint, has_wide, python_rows
from ._schema import alter_table_statement, table_statement
from ._sql import change_statement, split_statements
from ._stream import STREAM_BATCH_ROWS, Stream
from ._views import parse_view_statement, view_owner

__all__ = ["DEFAULT_COLUMN_CACHE_BYTES", "STREAM_BATCH_ROWS", "ColumnCache", "Database",
           "MutationPolicy", "PolicyRewriter", "PolicySession", "Reader", "Rows", "Stream",
           "add_connection_hook", "alter_table_statement", "change_statement",
           "connect", "exact_uhugeint", "has_wide", "is_url", "location", "mutation_policies",
           "parse_view_statement", "parser_cursor", "publish", "python_rows", "quiet_error",
           "read_policies", "role_query", "scalar",
           "serialize_sql", "split_statements", "sql_literal", "table_statement",
           "view_owner"]
