"""``pg_catalog``'s tables for drivers and ORMs: SQLAlchemy's reflection, psycopg's
``TypeInfo``, pandas' ``read_sql_table``.

A query (``SELECT`` or ``WITH``) that names ``pg_catalog`` or one of the tables below,
and is none of psql's own (:mod:`._pgcatalog`), runs in a private in-memory DuckDB
(:func:`._infoschema.private_query`: no file or network access, nothing of the engine)
holding these tables, filled for the session: the tables and views it may read (as
``information_schema`` lists them), their columns, types and defaults, and the base
types; the catalogs of what cryptdisk does not have (constraints, indexes, sequences,
comments, inheritance, enums, collations) are empty. ``pg_catalog``'s functions that
such queries call (``format_type``, ``pg_get_expr``, ``pg_table_is_visible``,
``to_regtype``, ``json_build_object``, ``information_schema._pg_expandarray``, ...) are
macros there, ``pg_settings`` lists the settings drivers read, and ``regclass``,
``regtype``, ``name`` casts work. Relations live in schema ``public`` (OID 2200) with
the OIDs psql's ``\\d`` sees (:func:`._pgcatalog.relation_oid`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from . import _sqltext, _types
from ._engines import EngineSession, Result
from ._infoschema import _NAMES, _visible, column_oids, private_query, private_text
from ._pgcatalog import relation_oid

__all__ = ["handles", "query"]

_SCHEMA = "cd_pg_catalog"  # the name the query runs under (DuckDB has its own pg_catalog)
_PUBLIC, _PG_CATALOG, _INFORMATION_SCHEMA = 2200, 11, 13183
_BTREE = 403  # pg_am's btree
_INT2VECTOR = _types.INT2VECTOR
_INT8_ARRAY, _OID_ARRAY = 1016, 1028
_OWNER = 10

#: (name, DuckDB type) of each table's columns, in PostgreSQL's order (the ones clients use)
_TABLES: dict[str, list[tuple[str, str]]] = {
    "pg_namespace": [("oid", "BIGINT"), ("nspname", "VARCHAR"), ("nspowner", "BIGINT"),
                     ("nspacl", "VARCHAR[]")],
    "pg_class": [("oid", "BIGINT"), ("relname", "VARCHAR"), ("relnamespace", "BIGINT"),
                 ("reltype", "BIGINT"), ("reloftype", "BIGINT"), ("relowner", "BIGINT"),
                 ("relam", "BIGINT"), ("relfilenode", "BIGINT"), ("reltablespace", "BIGINT"),
                 ("relpages", "INTEGER"), ("reltuples", "REAL"), ("relallvisible", "INTEGER"),
                 ("reltoastrelid", "BIGINT"), ("relhasindex", "BOOLEAN"),
                 ("relisshared", "BOOLEAN"), ("relpersistence", "VARCHAR"),
                 ("relkind", "VARCHAR"), ("relnatts", "SMALLINT"), ("relchecks", "SMALLINT"),
                 ("relhasrules", "BOOLEAN"), ("relhastriggers", "BOOLEAN"),
                 ("relhassubclass", "BOOLEAN"), ("relrowsecurity", "BOOLEAN"),
                 ("relforcerowsecurity", "BOOLEAN"), ("relispopulated", "BOOLEAN"),
                 ("relreplident", "VARCHAR"), ("relispartition", "BOOLEAN"),
                 ("relrewrite", "BIGINT"), ("relfrozenxid", "BIGINT"),
                 ("relminmxid", "BIGINT"), ("relacl", "VARCHAR[]"),
                 ("reloptions", "VARCHAR[]"), ("relpartbound", "VARCHAR")],
    "pg_attribute": [("attrelid", "BIGINT"), ("attname", "VARCHAR"), ("atttypid", "BIGINT"),
                     ("attstattarget", "INTEGER"), ("attlen", "SMALLINT"),
                     ("attnum", "SMALLINT"), ("attndims", "INTEGER"),
                     ("attcacheoff", "INTEGER"), ("atttypmod", "INTEGER"),
                     ("attbyval", "BOOLEAN"), ("attalign", "VARCHAR"),
                     ("attstorage", "VARCHAR"), ("attcompression", "VARCHAR"),
                     ("attnotnull", "BOOLEAN"), ("atthasdef", "BOOLEAN"),
                     ("atthasmissing", "BOOLEAN"), ("attidentity", "VARCHAR"),
                     ("attgenerated", "VARCHAR"), ("attisdropped", "BOOLEAN"),
                     ("attislocal", "BOOLEAN"), ("attinhcount", "INTEGER"),
                     ("attcollation", "BIGINT"), ("attacl", "VARCHAR[]"),
                     ("attoptions", "VARCHAR[]"), ("attfdwoptions", "VARCHAR[]"),
                     ("attmissingval", "VARCHAR")],
    "pg_attrdef": [("oid", "BIGINT"), ("adrelid", "BIGINT"), ("adnum", "SMALLINT"),
                   ("adbin", "VARCHAR")],
    "pg_type": [("oid", "BIGINT"), ("typname", "VARCHAR"), ("typnamespace", "BIGINT"),
                ("typowner", "BIGINT"), ("typlen", "SMALLINT"), ("typbyval", "BOOLEAN"),
                ("typtype", "VARCHAR"), ("typcategory", "VARCHAR"),
                ("typispreferred", "BOOLEAN"), ("typisdefined", "BOOLEAN"),
                ("typdelim", "VARCHAR"), ("typrelid", "BIGINT"), ("typsubscript", "VARCHAR"),
                ("typelem", "BIGINT"), ("typarray", "BIGINT"), ("typinput", "VARCHAR"),
                ("typoutput", "VARCHAR"), ("typreceive", "VARCHAR"), ("typsend", "VARCHAR"),
                ("typmodin", "VARCHAR"), ("typmodout", "VARCHAR"), ("typanalyze", "VARCHAR"),
                ("typalign", "VARCHAR"), ("typstorage", "VARCHAR"),
                ("typnotnull", "BOOLEAN"), ("typbasetype", "BIGINT"),
                ("typtypmod", "INTEGER"), ("typndims", "INTEGER"),
                ("typcollation", "BIGINT"), ("typdefaultbin", "VARCHAR"),
                ("typdefault", "VARCHAR"), ("typacl", "VARCHAR[]")],
    "pg_tables": [("schemaname", "VARCHAR"), ("tablename", "VARCHAR"),
                  ("tableowner", "VARCHAR"), ("tablespace", "VARCHAR"),
                  ("hasindexes", "BOOLEAN"), ("hasrules", "BOOLEAN"),
                  ("hastriggers", "BOOLEAN"), ("rowsecurity", "BOOLEAN")],
    "pg_views": [("schemaname", "VARCHAR"), ("viewname", "VARCHAR"), ("viewowner", "VARCHAR"),
                 ("definition", "VARCHAR")],
    "pg_am": [("oid", "BIGINT"), ("amname", "VARCHAR"), ("amhandler", "VARCHAR"),
              ("amtype", "VARCHAR")],
    # what cryptdisk does not have: empty
    "pg_constraint": [("oid", "BIGINT"), ("conname", "VARCHAR"), ("connamespace", "BIGINT"),
                      ("contype", "VARCHAR"), ("condeferrable", "BOOLEAN"),
                      ("condeferred", "BOOLEAN"), ("convalidated", "BOOLEAN"),
                      ("conrelid", "BIGINT"), ("contypid", "BIGINT"), ("conindid", "BIGINT"),
                      ("conparentid", "BIGINT"), ("confrelid", "BIGINT"),
                      ("confupdtype", "VARCHAR"), ("confdeltype", "VARCHAR"),
                      ("confmatchtype", "VARCHAR"), ("conislocal", "BOOLEAN"),
                      ("coninhcount", "INTEGER"), ("connoinherit", "BOOLEAN"),
                      ("conkey", "SMALLINT[]"), ("confkey", "SMALLINT[]"),
                      ("conpfeqop", "BIGINT[]"), ("conppeqop", "BIGINT[]"),
                      ("conffeqop", "BIGINT[]"), ("confdelsetcols", "SMALLINT[]"),
                      ("conexclop", "BIGINT[]"), ("conbin", "VARCHAR")],
    "pg_index": [("indexrelid", "BIGINT"), ("indrelid", "BIGINT"), ("indnatts", "SMALLINT"),
                 ("indnkeyatts", "SMALLINT"), ("indisunique", "BOOLEAN"),
                 ("indnullsnotdistinct", "BOOLEAN"), ("indisprimary", "BOOLEAN"),
                 ("indisexclusion", "BOOLEAN"), ("indimmediate", "BOOLEAN"),
                 ("indisclustered", "BOOLEAN"), ("indisvalid", "BOOLEAN"),
                 ("indcheckxmin", "BOOLEAN"), ("indisready", "BOOLEAN"),
                 ("indislive", "BOOLEAN"), ("indisreplident", "BOOLEAN"),
                 ("indkey", "SMALLINT[]"), ("indcollation", "BIGINT[]"),
                 ("indclass", "BIGINT[]"), ("indoption", "VARCHAR"),  # (int2vector: "0 0")
                 ("indexprs", "VARCHAR"), ("indpred", "VARCHAR")],
    "pg_sequence": [("seqrelid", "BIGINT"), ("seqtypid", "BIGINT"), ("seqstart", "BIGINT"),
                    ("seqincrement", "BIGINT"), ("seqmax", "BIGINT"), ("seqmin", "BIGINT"),
                    ("seqcache", "BIGINT"), ("seqcycle", "BOOLEAN")],
    "pg_description": [("objoid", "BIGINT"), ("classoid", "BIGINT"), ("objsubid", "INTEGER"),
                       ("description", "VARCHAR")],
    "pg_collation": [("oid", "BIGINT"), ("collname", "VARCHAR"), ("collnamespace", "BIGINT"),
                     ("collowner", "BIGINT"), ("collprovider", "VARCHAR"),
                     ("collisdeterministic", "BOOLEAN"), ("collencoding", "INTEGER"),
                     ("collcollate", "VARCHAR"), ("collctype", "VARCHAR")],
    "pg_roles": [("rolname", "VARCHAR"), ("rolsuper", "BOOLEAN"), ("rolinherit", "BOOLEAN"),
                 ("rolcreaterole", "BOOLEAN"), ("rolcreatedb", "BOOLEAN"),
                 ("rolcanlogin", "BOOLEAN"), ("rolreplication", "BOOLEAN"),
                 ("rolconnlimit", "INTEGER"), ("rolpassword", "VARCHAR"),
                 ("rolvaliduntil", "TIMESTAMPTZ"), ("rolbypassrls", "BOOLEAN"),
                 ("rolconfig", "VARCHAR[]"), ("oid", "BIGINT")],
    "pg_user": [("usename", "VARCHAR"), ("usesysid", "BIGINT"), ("usecreatedb", "BOOLEAN"),
                ("usesuper", "BOOLEAN"), ("userepl", "BOOLEAN"), ("usebypassrls", "BOOLEAN"),
                ("passwd", "VARCHAR"), ("valuntil", "TIMESTAMPTZ"), ("useconfig", "VARCHAR[]")],
    "pg_tablespace": [("oid", "BIGINT"), ("spcname", "VARCHAR"), ("spcowner", "BIGINT"),
                      ("spcacl", "VARCHAR[]"), ("spcoptions", "VARCHAR[]")],
    "pg_database": [("oid", "BIGINT"), ("datname", "VARCHAR"), ("datdba", "BIGINT"),
                    ("encoding", "INTEGER"), ("datlocprovider", "VARCHAR"),
                    ("datistemplate", "BOOLEAN"), ("datallowconn", "BOOLEAN"),
                    ("datconnlimit", "INTEGER"), ("datfrozenxid", "BIGINT"),
                    ("datminmxid", "BIGINT"), ("dattablespace", "BIGINT"),
                    ("datcollate", "VARCHAR"), ("datctype", "VARCHAR"),
                    ("daticulocale", "VARCHAR"), ("datcollversion", "VARCHAR"),
                    ("datacl", "VARCHAR[]")],
    "pg_proc": [("oid", "BIGINT"), ("proname", "VARCHAR"), ("pronamespace", "BIGINT"),
                ("proowner", "BIGINT"), ("prolang", "BIGINT"), ("prokind", "VARCHAR"),
                ("proretset", "BOOLEAN"), ("provolatile", "VARCHAR"),
                ("pronargs", "SMALLINT"), ("prorettype", "BIGINT"),
                ("proargtypes", "BIGINT[]"), ("prosrc", "VARCHAR"), ("proacl", "VARCHAR[]")],
    "pg_extension": [("oid", "BIGINT"), ("extname", "VARCHAR"), ("extowner", "BIGINT"),
                     ("extnamespace", "BIGINT"), ("extrelocatable", "BOOLEAN"),
                     ("extversion", "VARCHAR"), ("extconfig", "BIGINT[]"),
                     ("extcondition", "VARCHAR[]")],
    "pg_opclass": [("oid", "BIGINT"), ("opcmethod", "BIGINT"), ("opcname", "VARCHAR"),
                   ("opcnamespace", "BIGINT"), ("opcowner", "BIGINT"), ("opcfamily", "BIGINT"),
                   ("opcintype", "BIGINT"), ("opcdefault", "BOOLEAN"),
                   ("opckeytype", "BIGINT")],
    "pg_range": [("rngtypid", "BIGINT"), ("rngsubtype", "BIGINT"),
                 ("rngmultitypid", "BIGINT"), ("rngcollation", "BIGINT"),
                 ("rngsubopc", "BIGINT"), ("rngcanonical", "VARCHAR"),
                 ("rngsubdiff", "VARCHAR")],
    "pg_inherits": [("inhrelid", "BIGINT"), ("inhparent", "BIGINT"), ("inhseqno", "INTEGER"),
                    ("inhdetachpending", "BOOLEAN")],
    "pg_enum": [("oid", "BIGINT"), ("enumtypid", "BIGINT"), ("enumsortorder", "REAL"),
                ("enumlabel", "VARCHAR")],
    "pg_depend": [("classid", "BIGINT"), ("objid", "BIGINT"), ("objsubid", "INTEGER"),
                  ("refclassid", "BIGINT"), ("refobjid", "BIGINT"), ("refobjsubid", "INTEGER"),
                  ("deptype", "VARCHAR")],
    "pg_partitioned_table": [("partrelid", "BIGINT"), ("partstrat", "VARCHAR"),
                             ("partnatts", "SMALLINT"), ("partdefid", "BIGINT"),
                             ("partattrs", "SMALLINT[]")],
    "pg_statistic_ext": [("oid", "BIGINT"), ("stxrelid", "BIGINT"), ("stxname", "VARCHAR"),
                         ("stxnamespace", "BIGINT"), ("stxowner", "BIGINT"),
                         ("stxkeys", "SMALLINT[]"), ("stxkind", "VARCHAR[]")],
    "pg_trigger": [("oid", "BIGINT"), ("tgrelid", "BIGINT"), ("tgname", "VARCHAR"),
                   ("tgenabled", "VARCHAR"), ("tgisinternal", "BOOLEAN")],
    "pg_rewrite": [("oid", "BIGINT"), ("rulename", "VARCHAR"), ("ev_class", "BIGINT"),
                   ("ev_type", "VARCHAR")],
    "pg_policy": [("oid", "BIGINT"), ("polname", "VARCHAR"), ("polrelid", "BIGINT")],
    "pg_settings": [("name", "VARCHAR"), ("setting", "VARCHAR"), ("unit", "VARCHAR"),
                    ("category", "VARCHAR"), ("short_desc", "VARCHAR"),
                    ("extra_desc", "VARCHAR"), ("context", "VARCHAR"),
                    ("vartype", "VARCHAR"), ("source", "VARCHAR"), ("min_val", "VARCHAR"),
                    ("max_val", "VARCHAR"), ("enumvals", "VARCHAR[]"),
                    ("boot_val", "VARCHAR"), ("reset_val", "VARCHAR"),
                    ("sourcefile", "VARCHAR"), ("sourceline", "INTEGER"),
                    ("pending_restart", "BOOLEAN")],
    # not PostgreSQL's: what pg_get_constraintdef and pg_get_indexdef give
    "cd_definitions": [("oid", "BIGINT"), ("definition", "VARCHAR")],
    "cd_index_columns": [("oid", "BIGINT"), ("n", "INTEGER"), ("name", "VARCHAR")],
}
#: pg_settings' rows: the settings drivers read there (the JDBC driver's getImportedKeys
#: reads max_index_keys), as current_setting gives them
_PG_SETTINGS = [("max_index_keys", "32", None, "Preset Options", "integer"),
                ("max_identifier_length", "63", None, "Preset Options", "integer"),
                ("server_version", "15.0", None, "Preset Options", "string"),
                ("server_version_num", "150000", None, "Preset Options", "integer"),
                ("server_encoding", "UTF8", None, "Preset Options", "string"),
                ("client_encoding", "UTF8", None, "Client Connection Defaults", "string"),
                ("standard_conforming_strings", "on", None, "Version and Platform "
                 "Compatibility", "bool"),
                ("search_path", '"$user", public', None, "Client Connection Defaults",
                 "string"),
                ("default_table_access_method", "heap", None, "Client Connection Defaults",
                 "string")]

#: (oid, PostgreSQL's name, length, category, array type) of the types results carry
_BASE_TYPES = [
    (_types.BOOL, "bool", 1, "B", 1000), (_types.BYTEA, "bytea", -1, "U", 1001),
    (_types.NAME, "name", 64, "S", 1003), (_types.INT8, "int8", 8, "N", 1016),
    (_types.INT2, "int2", 2, "N", 1005), (_types.INT4, "int4", 4, "N", 1007),
    (_types.TEXT, "text", -1, "S", 1009), (_types.OID, "oid", 4, "N", 1028),
    (_types.JSON, "json", -1, "U", 199), (_types.FLOAT4, "float4", 4, "N", 1021),
    (_types.FLOAT8, "float8", 8, "N", 1022), (_types.BPCHAR, "bpchar", -1, "S", 1014),
    (_types.VARCHAR, "varchar", -1, "S", 1015), (_types.DATE, "date", 4, "D", 1182),
    (_types.TIME, "time", 8, "D", 1183), (_types.TIMETZ, "timetz", 12, "D", 1270),
    (_types.TIMESTAMP, "timestamp", 8, "D", 1115),
    (_types.TIMESTAMPTZ, "timestamptz", 8, "D", 1185),
    (_types.INTERVAL, "interval", 16, "T", 1187), (_types.NUMERIC, "numeric", -1, "N", 1231),
    (_types.UUID, "uuid", 16, "U", 2951), (_INT2VECTOR, "int2vector", -1, "A", 1006)]
#: the collation of a type's values (pg_type's typcollation, pg_attribute's attcollation):
#: "default" (100) for the text types, "C" (950) for name, as in PostgreSQL 15
_COLLATIONS = {_types.TEXT: 100, _types.VARCHAR: 100, _types.BPCHAR: 100, _types.NAME: 950}
#: the names format_type gives (information_schema's data_type, as psql's \d shows them),
#: without a typmod (-1: bpchar is "bpchar", as in PostgreSQL 15); an array type's is its
#: element's with "[]" ("integer[]", "numeric(10,2)[]")
_FORMAT = {**{oid: names[0] for oid, names in _NAMES.items()},
           _types.VARCHAR: "character varying", _types.BPCHAR: "bpchar",
           _types.NAME: "name", _types.OID: "oid", _types.TIMETZ: "time with time zone",
           _INT2VECTOR: "int2vector"}
#: array type -> its element type
_ELEMENTS = {array: oid for oid, _name, _length, _category, array in _BASE_TYPES if array}
#: the types whose typmod is a precision shown after their first word (time(3) with ...)
_PRECISIONS = (_types.TIME, _types.TIMETZ, _types.TIMESTAMP, _types.TIMESTAMPTZ)

_TABLE_NAMES = frozenset(_TABLES)
_SCAN = re.compile(r"\bpg_\w+", re.I)
_FROM = re.compile(r"\bFROM\b", re.I)
_FORMAT_TYPE = re.compile(r"\bformat_type\s*\(", re.I)
#: pg_catalog.pg_x, not a call: one of PostgreSQL's catalogs (42P01 where the server has none)
_CATALOG_RELATION = re.compile(r"\bpg_catalog\s*\.\s*pg_\w+\b(?!\s*\()", re.I)
#: pg_catalog. before a cast's type (``$1::pg_catalog.int4``, ``CAST(x AS pg_catalog.interval)``):
#: the type, not the catalog
_TYPE_QUALIFIER = re.compile(r"(::|\bAS)\s*pg_catalog\s*\.", re.I)


def _align(oid: int, length: int) -> str:
    """A base type's typalign (its array type's too): "d" for the 8-byte ones, interval
    and timetz, as in PostgreSQL 15; "i" for the others."""
    return "d" if length == 8 or oid in (_types.INTERVAL, _types.TIMETZ) else "i"


@functools.lru_cache(maxsize=1024)
def handles(sql: str) -> bool:
    """Whether ``sql`` is a query over ``pg_catalog`` answered here (it names one of the
    tables, or calls its functions without a FROM); cached per text."""
    lower = sql.lower()
    if ("pg_" not in lower and "format_type" not in lower) or \
            (_sqltext.first_words(sql, 1) or [""])[0] not in ("SELECT", "WITH"):
        return False
    try:
        text = _sqltext.strip_strings(sql)
    except Exception:
        return False
    # one of the tables; or pg_catalog's functions alone (a query of the engine's tables
    # that calls pg_catalog.lower(...) is the engine's), format_type also unqualified (DuckDB
    # has its own, which names types as DuckDB does)
    if "::" in text or "as" in lower:
        text = _TYPE_QUALIFIER.sub(r"\1 ", text)
    words = {m.group().lower() for m in _SCAN.finditer(text)}
    return bool(words & _TABLE_NAMES) or (
        ("pg_catalog" in words or _FORMAT_TYPE.search(text) is not None)
        and (_FROM.search(text) is None
                                   or _CATALOG_RELATION.search(text) is not None))


def _macros() -> list[str]:
    """pg_catalog's functions as DuckDB macros in the private schema."""
    s = _SCHEMA
    settings = "CASE lower(n) " + " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in (
        ("default_table_access_method", "heap"), ("server_version", "15.0"),
        ("server_version_num", "150000"), ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"), ("standard_conforming_strings", "on"),
        ("search_path", '"$user", public'), ("max_identifier_length", "63"))) + \
        " ELSE CAST(NULL AS VARCHAR) END"
    names = " ".join(f"WHEN {oid} THEN '{name}'" for oid, name in _FORMAT.items())
    elements = " ".join(f"WHEN {array} THEN {oid}" for array, oid in _ELEMENTS.items())
    definition = "(SELECT min(definition) FROM cd_pg_catalog.cd_definitions WHERE oid = o)"
    index_column = "(SELECT min(name) FROM cd_pg_catalog.cd_index_columns WHERE oid = o AND n = c)"
    pairs = ", ".join(f"({', '.join(f'k{i}, v{i}' for i in range(n))}) AS "
                      f"json_object({', '.join(f'k{i}::VARCHAR, v{i}' for i in range(n))})"
                      for n in range(1, 13))
    return [
        f"CREATE TYPE {s}.name AS VARCHAR",
        *(f"CREATE TYPE {s}.{alias} AS {duck}" for alias, duck in (
            ("text", "VARCHAR"), ("varchar", "VARCHAR"), ('"char"', "VARCHAR"),
            ("int2", "SMALLINT"), ("int4", "INTEGER"), ("int8", "BIGINT"), ("oid", "BIGINT"),
            ("bool", "BOOLEAN"), ("float4", "REAL"), ("float8", "DOUBLE"))),
        f"CREATE TYPE {s}.regtype AS BIGINT",
        f"CREATE TYPE {s}.regclass AS BIGINT",
        f"CREATE TYPE {s}.regproc AS VARCHAR",
        f"CREATE TYPE {s}.regnamespace AS BIGINT",
        # a numeric's typmod is ((precision << 16) | scale) + 4; a varchar's, length + 4
        # (a time's, a timestamp's: the precision)
        f"CREATE MACRO {s}.cd_format_element(t, m) AS CASE "
        f"WHEN t = {_types.NUMERIC} AND m >= 4 THEN 'numeric(' || ((m - 4) >> 16) || ',' "
        f"|| ((m - 4) & 65535) || ')' WHEN t = {_types.VARCHAR} AND m >= 4 THEN "
        f"'character varying(' || (m - 4) || ')' WHEN t = {_types.BPCHAR} AND m >= 4 THEN "
        f"'character(' || (m - 4) || ')' WHEN t = {_types.BPCHAR} AND m IS NULL THEN "
        f"'character' WHEN t IN {_PRECISIONS} AND m >= 0 THEN "
        f"regexp_replace(CASE t {names} END, '^(\\w+)', '\\1(' || m || ')') "
        f"ELSE CASE t {names} ELSE '???' END END",
        f"CREATE MACRO {s}.format_type(t, m) AS CASE WHEN t IS NULL THEN NULL "
        f"WHEN t IN {tuple(_ELEMENTS)} THEN {s}.cd_format_element(CASE t {elements} END, m) "
        f"|| '[]' ELSE {s}.cd_format_element(t, m) END",
        f"CREATE MACRO {s}.pg_get_expr(e, r) AS e, (e, r, p) AS e",
        f"CREATE MACRO {s}.pg_table_is_visible(o) AS true",
        f"CREATE MACRO {s}.pg_type_is_visible(o) AS true",
        f"CREATE MACRO {s}.pg_collation_is_visible(o) AS true",
        f"CREATE MACRO {s}.pg_get_serial_sequence(t, c) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.pg_get_constraintdef(o) AS {definition}, (o, p) AS {definition}",
        f"CREATE MACRO {s}.pg_get_indexdef(o) AS {definition}, "
        f"(o, c, p) AS CASE WHEN c = 0 THEN {definition} ELSE {index_column} END",
        # the schemas of the search path, and an array's upper bound (the JDBC driver's
        # getTypeInfo orders the types by them)
        f"CREATE MACRO {s}.current_schemas(implicit) AS CASE WHEN implicit THEN "
        "['pg_catalog', 'public'] ELSE ['public'] END",
        f"CREATE MACRO {s}.array_upper(a, d) AS CASE WHEN d = 1 AND len(a) > 0 THEN len(a) "
        "END",
        # information_schema._pg_expandarray(a): a row (x, n) per element (the JDBC
        # driver's getPrimaryKeys and getIndexInfo call it in the select list)
        f"CREATE MACRO {s}._pg_expandarray(a) AS "
        "unnest(list_transform(range(1, len(a) + 1), lambda i: {'x': a[i], 'n': i}))",
        "CREATE MACRO cd_pg_catalog.pg_get_viewdef(o) AS (SELECT definition FROM "
        "cd_pg_catalog.pg_views v JOIN cd_pg_catalog.pg_class c ON c.relname = v.viewname "
        "WHERE c.oid = o), (o, p) AS (SELECT definition FROM cd_pg_catalog.pg_views v JOIN "
        "cd_pg_catalog.pg_class c ON c.relname = v.viewname WHERE c.oid = o)",
        f"CREATE MACRO {s}.pg_get_userbyid(o) AS 'cryptdisk'",
        f"CREATE MACRO {s}.obj_description(o) AS CAST(NULL AS VARCHAR), "
        "(o, c) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.col_description(o, n) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.shobj_description(o, c) AS CAST(NULL AS VARCHAR)",
        "CREATE MACRO cd_pg_catalog.to_regtype(n) AS (SELECT min(oid) FROM "
        "cd_pg_catalog.pg_type WHERE typname = lower(n))",
        "CREATE MACRO cd_pg_catalog.to_regclass(n) AS (SELECT min(oid) FROM "
        "cd_pg_catalog.pg_class WHERE relname = n OR 'public.' || relname = n)",
        f"CREATE MACRO {s}.has_table_privilege(t, p) AS true, (u, t, p) AS true",
        f"CREATE MACRO {s}.has_schema_privilege(n, p) AS true, (u, n, p) AS true",
        f"CREATE MACRO {s}.pg_encoding_to_char(e) AS 'UTF8'",
        f"CREATE MACRO {s}.pg_function_is_visible(o) AS true",
        f"CREATE MACRO {s}.pg_tablespace_location(o) AS ''",
        f"CREATE MACRO {s}.pg_get_function_result(o) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.pg_get_function_arguments(o) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.pg_get_function_identity_arguments(o) AS CAST(NULL AS VARCHAR)",
        f"CREATE MACRO {s}.current_setting(n) AS {settings}, (n, missing_ok) AS {settings}",
        f"CREATE MACRO {s}.json_build_object() AS json_object(), {pairs}",
    ]


_MACRO_NAMES = frozenset(m.lower() for st in _macros()
                         for m in re.findall(rf"^CREATE MACRO {_SCHEMA}\.(\w+)", st))
_QUALIFIED_CALL = re.compile(rf"\b{_SCHEMA}\s*\.\s*(\w+)\s*\(", re.I)
#: a name cast to an OID type (``'t'::regclass``, ``'int4'::pg_catalog.regtype``): looked up
#: by name, as PostgreSQL does (the types are BIGINT here, which the name is not)
_NAME_TO_OID = re.compile(
    r"('(?:[^']|'')*')\s*::\s*(?:\"?pg_catalog\"?\s*\.\s*)?\"?(regclass|regtype)\"?\b", re.I)
_EXPANDARRAY = re.compile(r"\binformation_schema\s*\.\s*_pg_expandarray\s*\(", re.I)
_INDOPTION_BIT = re.compile(r"\b[\w.]*indoption\s*\[[^\[\]]*\]\s*&\s*1(?:\s*::\s*smallint)?",
                            re.I)
_DEFAULT_COLLATION = re.compile(rf"\s+COLLATE\s+{_SCHEMA}\s*\.\s*\"?default\"?", re.I)


def _typmod(oid: int, type_name: str) -> int:
    m = re.search(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)", type_name)
    if m is None:
        return -1
    if oid == _types.NUMERIC:
        return ((int(m[1]) << 16) | int(m[2] or 0)) + 4
    if oid == _types.VARCHAR:
        return int(m[1]) + 4
    return -1


def _rows(engine: EngineSession, privileges: Any, wanted: set[str],
          database: str) -> dict[str, list[Any]]:
    """The rows of the tables in ``wanted`` for this session (``database``: the one the
    client named, the one pg_database lists)."""
    visible = _visible(engine, privileges)
    admin = privileges is None or privileges.admin
    rows: dict[str, list[Any]] = {name: [] for name in wanted}
    rows["pg_namespace"] = [(_PG_CATALOG, "pg_catalog", _OWNER, None),
                            (_PUBLIC, "public", _OWNER, None),
                            (_INFORMATION_SCHEMA, "information_schema", _OWNER, None)]
    rows["pg_am"] = [(2, "heap", "heap_tableam_handler", "t"), (_BTREE, "btree", "bthandler", "i")]
    rows["pg_database"] = [(16384, database, _OWNER, 6, "c", False, True, -1, 0, 0, 1663,
                            "C", "C", None, None, None)]
    rows["pg_settings"] = [(name, value, unit, category, None, None, "internal", vartype,
                            "default", None, None, None, value, value, None, None, False)
                           for name, value, unit, category, vartype in _PG_SETTINGS]
    rows["pg_tablespace"] = [(1663, "pg_default", _OWNER, None, None),
                             (1664, "pg_global", _OWNER, None, None)]
    rows["pg_type"] = [(oid, name, _PG_CATALOG, _OWNER, length, length in (1, 2, 4, 8), "b",
                        category, False, True, ",", 0, None, 0, array, None, None, None,
                        None, None, None, None, _align(oid, length), "p", False, 0, -1, 0,
                        _COLLATIONS.get(oid, 0), None, None, None)
                       for oid, name, length, category, array in _BASE_TYPES
                       if oid != _INT2VECTOR]
    # int2vector (pg_index's indoption): an array of int2, as PostgreSQL has it
    rows["pg_type"].append((
        _INT2VECTOR, "int2vector", _PG_CATALOG, _OWNER, -1, False, "b", "A", False, True, ",",
        0, "array_subscript_handler", _types.INT2, 1006, "int2vectorin", "int2vectorout",
        "int2vectorrecv", "int2vectorsend", None, None, None, "i", "p", False, 0, -1, 0, 0,
        None, None, None))
    # their array types, as PostgreSQL has them (asyncpg reads an array by its typelem)
    rows["pg_type"] += [(array, f"_{name}", _PG_CATALOG, _OWNER, -1, False, "b", "A", False,
                         True, ",", 0, "array_subscript_handler", oid, 0, "array_in",
                         "array_out", "array_recv", "array_send", None, None,
                         "array_typanalyze",
                         _align(oid, length), "x", False,
                         0, -1, 0, _COLLATIONS.get(oid, 0), None, None, None)
                        for oid, name, length, _category, array in _BASE_TYPES if array]
    if {"pg_roles", "pg_user"} & wanted:
        roles = _roles(privileges)
        rows["pg_roles"] = [(name, admin, True, admin, admin, login, False, -1,
                             "********" if login else None, None, admin, None, oid)
                            for name, admin, login, oid in roles]
        rows["pg_user"] = [(name, oid, admin, admin, False, admin, "********", None, None)
                           for name, admin, login, oid in roles if login]
    rows["pg_tables"] = [("public", n, "cryptdisk", None, False, False, False, False)
                         for n, k in visible if k == "r"]
    rows["pg_views"] = [("public", n, "cryptdisk", engine.view_definition(n) if admin else None)
                        for n, k in visible if k == "v"]
    columns = {"pg_class", "pg_attribute", "pg_attrdef"} & wanted
    for name, kind in visible:
        oid = relation_oid(name)
        described = engine.columns(name) if columns else []
        if "pg_class" in wanted:
            rows["pg_class"].append((
                oid, name, _PUBLIC, 0, 0, _OWNER, 2 if kind == "r" else 0, 0, 0, 0, -1.0, 0, 0,
                False, False, "p", kind, len(described), 0, False, False, False, False,
                False, True, "d", False, 0, 0, 0, None, None, None))
        if not {"pg_attribute", "pg_attrdef"} & wanted:
            continue
        oids = column_oids(engine, name, kind, described)
        for i, ((column, type_name, notnull, default), type_oid) in enumerate(
                zip(described, oids, strict=True)):
            length = next((b[2] for b in _BASE_TYPES if b[0] == type_oid), -1)
            if "pg_attribute" in wanted:
                rows["pg_attribute"].append((
                    oid, column, type_oid, -1, length, i + 1, 0, -1,
                    _typmod(type_oid, type_name), length in (1, 2, 4, 8), "i", "p", "",
                    bool(notnull), default is not None, False, "", "", False, True, 0,
                    _COLLATIONS.get(type_oid, 0), None, None, None, None))
            if default is not None and "pg_attrdef" in wanted:
                rows["pg_attrdef"].append((oid * 1000 + i + 1, oid, i + 1, default))
    if {"pg_constraint", "pg_index"} & wanted:
        _key_rows(engine, visible, rows, "pg_class" in wanted and "pg_index" in wanted)
    return rows


def _roles(privileges: Any) -> list[tuple[str, bool, bool, int]]:
    """(name, superuser, can log in, OID) of each role, as PostgreSQL's ``pg_roles`` shows
    them to every user: the server's users (an admin is a superuser) and roles, never a
    verifier; without users (no authentication), the owner ``cryptdisk``."""
    store = getattr(privileges, "store", None)
    if store is None:
        return [("cryptdisk", True, True, _OWNER)]
    found = [(name, bool(user.get("admin")), True) for name, user in store.users.items()]
    found += [(name, False, False) for name in store.roles]
    return [(name, admin, login, relation_oid(f"\0role {name}"))
            for name, admin, login in sorted(found)]


def _ident(name: str) -> str:
    """``name`` as PostgreSQL writes an identifier (quoted when it needs to be)."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else \
        '"' + name.replace('"', '""') + '"'


def _key_rows(engine: EngineSession, visible: list[tuple[str, str]],
              rows: dict[str, list[Any]], index_relations: bool) -> None:
    """The rows of ``pg_constraint``, ``pg_index`` (and with ``index_relations`` the
    indexes' ``pg_class`` rows) of the tables the session may read: SQLite's primary keys,
    unique constraints, indexes and foreign keys (a foreign key only where the session may
    read the table it names, as no other catalog names a table it may not read)."""
    names = {n.lower(): n for n, k in visible if k == "r"}
    attnums: dict[str, dict[str, int]] = {}

    def numbers(table: str, columns: list[str]) -> list[int] | None:
        if table not in attnums:
            attnums[table] = {c.lower(): i + 1 for i, (c, *_) in enumerate(
                engine.columns(table))}
        found = [attnums[table].get(c.lower()) for c in columns]
        return None if None in found else [n for n in found if n is not None]

    for table in names.values():
        keys = engine.keys(table)
        if not (keys.primary or keys.indexes or keys.foreign):
            continue
        oid = relation_oid(table)
        indexes: list[tuple[str, bool, str | None, list[str], str | None]] = \
            [(f"{table}_pkey", True, "p", keys.primary, None)] if keys.primary else []
        indexes += [(f"{table}_{'_'.join(columns)}_key" if constraint else name, unique,
                     "u" if constraint else None, columns, where)
                    for name, unique, constraint, columns, where in keys.indexes]
        for name, unique, contype, columns, where in indexes:
            key = numbers(table, columns)
            if key is None:
                continue
            index_oid = relation_oid(name)
            listed = ", ".join(_ident(c) for c in columns)
            rows["cd_index_columns"] += [(index_oid, n, _ident(c))
                                         for n, c in enumerate(columns, 1)]
            rows["cd_definitions"].append((index_oid, (
                f"CREATE {'UNIQUE ' if unique else ''}INDEX {_ident(name)} ON "
                f"public.{_ident(table)} USING btree ({listed})"
                + (f" WHERE ({where})" if where else ""))))
            rows["pg_index"].append((
                index_oid, oid, len(key), len(key), unique, False, contype == "p", False,
                True, False, True, False, True, True, False, key, [0] * len(key),
                [0] * len(key), " ".join(["0"] * len(key)), None, where))
            if index_relations:
                rows["pg_class"].append((
                    index_oid, name, _PUBLIC, 0, 0, _OWNER, _BTREE, 0, 0, 0, -1.0, 0, 0,
                    False, False, "p", "i", len(key), 0, False, False, False, False, False,
                    True, "n", False, 0, 0, 0, None, None, None))
            if contype is not None:
                constraint_oid = index_oid + 1
                rows["cd_definitions"].append((constraint_oid, (
                    "PRIMARY KEY" if contype == "p" else "UNIQUE") + f" ({listed})"))
                rows["pg_constraint"].append(_constraint(
                    constraint_oid, name, contype, oid, index_oid, 0, key, None, " "))
        for columns, parent, parent_columns, on_update, on_delete in keys.foreign:
            referred = names.get(parent.lower())
            if referred is None:  # a table the session may not read, or none
                continue
            if parent_columns is None:
                parent_columns = engine.keys(referred).primary
            key, parent_key = numbers(table, columns), numbers(referred, parent_columns)
            if key is None or parent_key is None or len(key) != len(parent_key):
                continue
            name = f"{table}_{'_'.join(columns)}_fkey"
            constraint_oid = relation_oid(name) + 1
            actions = "".join(f" ON {event} {action.upper()}" for event, action in (
                ("UPDATE", on_update), ("DELETE", on_delete))
                if action.upper() not in ("NO ACTION", ""))
            rows["cd_definitions"].append((constraint_oid, (
                f"FOREIGN KEY ({', '.join(_ident(c) for c in columns)}) REFERENCES "
                f"{_ident(referred)}({', '.join(_ident(c) for c in parent_columns)})"
                + actions)))
            rows["pg_constraint"].append(_constraint(
                constraint_oid, name, "f", oid, _key_index(engine, referred, parent_columns),
                relation_oid(referred), key, parent_key,
                _ACTIONS.get(on_update.upper(), "a"), _ACTIONS.get(on_delete.upper(), "a")))


def _key_index(engine: EngineSession, table: str, columns: list[str]) -> int:
    """The OID of ``table``'s unique index on ``columns`` (its primary key's, or a unique
    constraint's or index's, named as :func:`_key_rows` names them): a foreign key's
    ``conindid``, which the JDBC driver's getImportedKeys joins on; 0 if none."""
    keys = engine.keys(table)
    wanted = [c.lower() for c in columns]
    if [c.lower() for c in keys.primary] == wanted:
        return relation_oid(f"{table}_pkey")
    for name, unique, constraint, cols, _where in keys.indexes:
        if unique and [c.lower() for c in cols] == wanted:
            return relation_oid(f"{table}_{'_'.join(cols)}_key" if constraint else name)
    return 0


#: pg_constraint's letters for a foreign key's ON UPDATE / ON DELETE actions
_ACTIONS = {"NO ACTION": "a", "RESTRICT": "r", "CASCADE": "c", "SET NULL": "n",
            "SET DEFAULT": "d"}


def _constraint(oid: int, name: str, contype: str, relation: int, index: int, referred: int,
                key: list[int], referred_key: list[int] | None, on_update: str,
                on_delete: str = " ") -> tuple[Any, ...]:
    return (oid, name, _PUBLIC, contype, False, False, True, relation, 0, index, 0, referred,
            on_update, on_delete, "s" if contype == "f" else " ", True, 0, True, key,
            referred_key, None, None, None, None, None, None)


def _arrow(name: str, rows: list[Any]) -> Any:
    import pyarrow as pa

    return pa.table({column: [r[i] for r in rows] for i, (column, _) in
                     enumerate(_TABLES[name])}) if rows else None


def query(sql: str, params: list[Any], engine: EngineSession, privileges: Any,
          database: str = "cryptdisk") -> Result:
    """Run ``sql`` (see :func:`handles`) over this session's ``pg_catalog``
    (``database``: the name of the database, as the client named it)."""
    sql = _NAME_TO_OID.sub(lambda m: f"to_{m[2].lower()}({m[1]})", sql)
    text = private_text(sql, params, "pg_catalog", _SCHEMA)
    # DuckDB's own functions (array_to_string, ...) are not in the private schema, nor is
    # PostgreSQL's collation "default" (psql's COLLATE pg_catalog.default)
    text = _QUALIFIED_CALL.sub(lambda m: m[0] if m[1].lower() in _MACRO_NAMES else m[1] + "(",
                               text)
    text = _DEFAULT_COLLATION.sub("", text)
    text = _EXPANDARRAY.sub(f"{_SCHEMA}._pg_expandarray(", text)
    # an index's option of a key (int2vector text here): 0, as every key is ascending
    # (the JDBC driver's getIndexInfo: indoption[n - 1] & 1)
    text = _INDOPTION_BIT.sub("0", text)
    words = {w.lower() for w in re.findall(r"\w+", text)}
    wanted = set(_TABLES) & words
    if "pg_get_viewdef" in words:
        wanted |= {"pg_views", "pg_class"}
    if "to_regclass" in words:
        wanted.add("pg_class")
    if {"pg_get_constraintdef", "pg_get_indexdef"} & words:
        wanted |= {"pg_constraint", "pg_index"}
    if {"pg_constraint", "pg_index"} & wanted:
        wanted |= {"pg_constraint", "pg_index", "cd_definitions", "cd_index_columns"}
    wanted |= {"pg_type"}  # (to_regtype, format_type's callers)
    rows = _rows(engine, privileges, wanted, database)

    def load(con: Any) -> None:
        con.execute(f"CREATE SCHEMA {_SCHEMA}")
        for name, columns in _TABLES.items():
            con.execute(f"CREATE TABLE {_SCHEMA}.{name} "
                        f"({', '.join(f'{c} {t}' for c, t in columns)})")
            table = _arrow(name, rows[name]) if name in wanted else None
            if table is not None:
                con.register("__cd_source", table)
                con.execute(f"INSERT INTO {_SCHEMA}.{name} SELECT * FROM __cd_source")  # noqa: S608
                con.unregister("__cd_source")
        for statement in _macros():
            con.execute(statement)
        con.execute(f"SET search_path = '{_SCHEMA},main'")

    result = private_query(text, load, engine, (_SCHEMA, "pg_catalog"))
    if result.columns is not None:  # int2vector, as drivers read it (pg8000: a list)
        result.columns = [(name, _INT2VECTOR if name == "indoption" and oid == _types.TEXT
                           else oid) for name, oid in result.columns]
        # a list of BIGINTs here is of OIDs (conpfeqop, proargtypes, array_agg(atttypid)):
        # oid[] as in PostgreSQL, which asyncpg reads without looking it up (its type
        # lookup's own attrtypoids: as int8[] it would look int8[] up again, forever)
        oid_arrays = [i for i, (_, oid) in enumerate(result.columns) if oid == _INT8_ARRAY]
        if oid_arrays:
            for i in oid_arrays:
                result.columns[i] = (result.columns[i][0], _OID_ARRAY)
            for row in result.rows:
                for i in oid_arrays:
                    if isinstance(row[i], _types.PgArray):
                        row[i].element = _types.OID
    return result
