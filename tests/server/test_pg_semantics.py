"""Statement and transaction semantics against PostgreSQL 15's, differentially.

Each scenario is a sequence of simple queries (one Query message each, several statements
in some) sent on one connection; each query's answer is reduced to its command tags, the
SQLSTATEs of its errors, ``EMPTY`` for an EmptyQueryResponse, its rows (``row:a|b``) and,
last, the transaction status of its ReadyForQuery (``I``, ``T`` or ``E``). The expected
answers were taken from a real PostgreSQL 15 (``python -m tests.server.test_pg_semantics
HOST:PORT`` checks them against one again); every engine must give them, except for the
differences ``DIFFERENCES`` lists, each documented (docs/server-protocol.md, *Differences
from PostgreSQL*). A hypothesis test runs random sequences of BEGIN, COMMIT, ROLLBACK,
savepoints, errors, writes and reads against a model of PostgreSQL's rules (checked
against PostgreSQL the same way).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.rawclient import Raw, cstr, msg

ENGINES = ["analytical", "sqlite_engine"]


def run_steps(raw: Raw, sql: str) -> list[str]:
    """One simple query's answer, reduced (see the module)."""
    raw.send(msg(b"Q", cstr(sql)))
    return _reduce(raw.until(b"Z"))


def _reduce(messages: list[tuple[bytes, bytes]]) -> list[str]:
    out = []
    for kind, body in messages:
        if kind == b"C":
            out.append(body.rstrip(b"\0").decode())
        elif kind == b"E":
            fields = {f[:1]: f[1:].decode() for f in body.split(b"\0") if f}
            out.append("E:" + fields.get(b"C", ""))
        elif kind == b"I":
            out.append("EMPTY")
        elif kind == b"D":
            (n,), pos, values = struct.unpack("!h", body[:2]), 2, []
            for _ in range(n):
                (size,) = struct.unpack("!i", body[pos:pos + 4])
                pos += 4
                values.append("NULL" if size < 0 else body[pos:pos + size].decode())
                pos += max(size, 0)
            out.append("row:" + "|".join(values))
        elif kind == b"Z":
            out.append(body.decode())
    return out


def run_pipeline(raw: Raw, steps: list[str]) -> list[str]:
    """Each of ``steps`` through the extended protocol (Parse, Bind, Execute of the
    unnamed statement and portal), ``SYNC`` a Sync, all sent at once; the answers reduced
    as :func:`run_steps` reduces them, a status after each Sync."""
    out = b""
    for sql in steps:
        if sql == "SYNC":
            out += msg(b"S")
            continue
        out += msg(b"P", cstr("") + cstr(sql) + struct.pack("!h", 0))
        out += msg(b"B", cstr("") + cstr("") + struct.pack("!hhh", 0, 0, 0))
        out += msg(b"E", cstr("") + struct.pack("!i", 0))
    raw.send(out)
    answer: list[str] = []
    for _ in range(steps.count("SYNC")):
        answer += _reduce(raw.until(b"Z"))
    return answer


#: scenario -> [(query, PostgreSQL 15's answer)]
SCENARIOS: dict[str, list[tuple[str, list[str]]]] = {
    'tags': [
        ("CREATE TABLE t (id INTEGER, v VARCHAR(5) NOT NULL DEFAULT 'd', n INTEGER)",
         ['CREATE TABLE', 'I']),
        ("INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2)", ['INSERT 0 2', 'I']),
        ('UPDATE t SET n = 5 WHERE id = 1', ['UPDATE 1', 'I']),
        ('DELETE FROM t WHERE id = 99', ['DELETE 0', 'I']),
        ('SELECT id, v, n FROM t ORDER BY id', ['row:1|a|5', 'row:2|b|2', 'SELECT 2', 'I']),
        ('INSERT INTO t (id) VALUES (3)', ['INSERT 0 1', 'I']),
        ('SELECT v, n FROM t WHERE id = 3', ['row:d|NULL', 'SELECT 1', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('START TRANSACTION', ['START TRANSACTION', 'T']),
        ('END', ['COMMIT', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('ABORT', ['ROLLBACK', 'I']),
        ('COMMIT', ['COMMIT', 'I']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'errors': [
        ('CREATE TABLE t (id INTEGER, v VARCHAR(5) NOT NULL, n INTEGER)', ['CREATE TABLE', 'I']),
        ('CREATE TABLE u (id INTEGER, n INTEGER)', ['CREATE TABLE', 'I']),
        ('INSERT INTO t VALUES (5, NULL, 1)', ['E:23502', 'I']),
        ('SELECT 1/0', ['E:22012', 'I']),
        ('SELECT 9223372036854775807::bigint + 1', ['E:22003', 'I']),
        ('SELECT nope FROM t', ['E:42703', 'I']),
        ('SELECT * FROM nope', ['E:42P01', 'I']),
        ('SELEC 1', ['E:42601', 'I']),
        ('SELECT id FROM t, u', ['E:42702', 'I']),
        ("SELECT 'abc'::int", ['E:22P02', 'I']),
        ('', ['EMPTY', 'I']),
        (' ; ', ['EMPTY', 'I']),
    ],
    'block': [
        ('BEGIN', ['BEGIN', 'T']),
        ('SELECT 1/0', ['E:22012', 'E']),
        ('SELECT 1', ['E:25P02', 'E']),
        ('', ['EMPTY', 'E']),
        ('SHOW TimeZone', ['E:25P02', 'E']),
        ('SAVEPOINT s', ['E:25P02', 'E']),
        ('RELEASE s', ['E:25P02', 'E']),
        ('COMMIT', ['ROLLBACK', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SELECT 1', ['row:1', 'SELECT 1', 'T']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'savepoints': [
        ('SAVEPOINT a', ['E:25P01', 'I']),
        ('RELEASE a', ['E:25P01', 'I']),
        ('ROLLBACK TO a', ['E:25P01', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SAVEPOINT a', ['SAVEPOINT', 'T']),
        ('SELECT 1/0', ['E:22012', 'E']),
        ('ROLLBACK TO a', ['ROLLBACK', 'T']),
        ('SELECT 1', ['row:1', 'SELECT 1', 'T']),
        ('RELEASE a', ['RELEASE', 'T']),
        ('RELEASE a', ['E:3B001', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SAVEPOINT a', ['SAVEPOINT', 'T']),
        ('SAVEPOINT b', ['SAVEPOINT', 'T']),
        ('RELEASE a', ['RELEASE', 'T']),
        ('ROLLBACK TO b', ['E:3B001', 'E']),
        ('ROLLBACK TO a', ['E:3B001', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SAVEPOINT "Q"', ['SAVEPOINT', 'T']),
        ('ROLLBACK TO SAVEPOINT q', ['E:3B001', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'chain': [
        ('COMMIT AND CHAIN', ['E:25P01', 'I']),
        ('ROLLBACK AND CHAIN', ['E:25P01', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('COMMIT AND CHAIN', ['COMMIT', 'T']),
        ('SELECT 1', ['row:1', 'SELECT 1', 'T']),
        ('ROLLBACK AND CHAIN', ['ROLLBACK', 'T']),
        ('SELECT 1/0', ['E:22012', 'E']),
        ('COMMIT AND CHAIN', ['ROLLBACK', 'T']),
        ('SELECT 1', ['row:1', 'SELECT 1', 'T']),
        ('COMMIT AND NO CHAIN', ['COMMIT', 'I']),
        ('START TRANSACTION READ ONLY', ['START TRANSACTION', 'T']),
        ('COMMIT AND CHAIN', ['COMMIT', 'T']),
        ('SHOW transaction_read_only', ['row:on', 'SHOW', 'T']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'multi': [
        ('SELECT 1; SELECT 2', ['row:1', 'SELECT 1', 'row:2', 'SELECT 1', 'I']),
        ('SELECT 1;;SELECT 2', ['row:1', 'SELECT 1', 'row:2', 'SELECT 1', 'I']),
        ('SELECT 1; SELECT 1/0; SELECT 2', ['row:1', 'SELECT 1', 'E:22012', 'I']),
        ('BEGIN; SELECT 1; SELECT 1/0; COMMIT', ['BEGIN', 'row:1', 'SELECT 1', 'E:22012', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('BEGIN; SELECT 1', ['BEGIN', 'row:1', 'SELECT 1', 'T']),
        ('SELECT 2; COMMIT', ['row:2', 'SELECT 1', 'COMMIT', 'I']),
        ('SELECT 1; BEGIN', ['row:1', 'SELECT 1', 'BEGIN', 'T']),
        ('COMMIT; SELECT 1', ['COMMIT', 'row:1', 'SELECT 1', 'I']),
        ('SELECT 1; SAVEPOINT a; RELEASE a', ['row:1', 'SELECT 1', 'E:25P01', 'I']),
        ('BEGIN; SAVEPOINT a; SELECT 1/0', ['BEGIN', 'SAVEPOINT', 'E:22012', 'E']),
        ('ROLLBACK TO a; SELECT 3; COMMIT', ['ROLLBACK', 'row:3', 'SELECT 1', 'COMMIT', 'I']),
    ],
    'settings': [
        ("SET client_encoding = 'UTF8'", ['SET', 'I']),
        ('SHOW client_encoding', ['row:UTF8', 'SHOW', 'I']),
        ("SET DateStyle = 'ISO, MDY'", ['SET', 'I']),
        ('SHOW DateStyle', ['row:ISO, MDY', 'SHOW', 'I']),
        ("SET TimeZone = 'UTC'", ['SET', 'I']),
        ('SHOW TimeZone', ['row:UTC', 'SHOW', 'I']),
        ("SET TIME ZONE 'UTC'", ['SET', 'I']),
        ("SET application_name = 'x'", ['SET', 'I']),
        ('SHOW application_name', ['row:x', 'SHOW', 'I']),
        ('SET statement_timeout = 0', ['SET', 'I']),
        ('SHOW statement_timeout', ['row:0', 'SHOW', 'I']),
        ("SET statement_timeout = '5s'", ['SET', 'I']),
        ('SHOW statement_timeout', ['row:5s', 'SHOW', 'I']),
        ('SET statement_timeout = 1500', ['SET', 'I']),
        ('SHOW statement_timeout', ['row:1500ms', 'SHOW', 'I']),
        ('RESET statement_timeout', ['RESET', 'I']),
        ('SHOW statement_timeout', ['row:0', 'SHOW', 'I']),
        ('SET extra_float_digits = 3', ['SET', 'I']),
        ('SHOW extra_float_digits', ['row:3', 'SHOW', 'I']),
        ('SET extra_float_digits = 4', ['E:22023', 'I']),
        ('RESET extra_float_digits', ['RESET', 'I']),
        ('SHOW extra_float_digits', ['row:1', 'SHOW', 'I']),
        ("SET client_min_messages TO 'WARNING'", ['SET', 'I']),
        ('SHOW client_min_messages', ['row:warning', 'SHOW', 'I']),
        ('SET client_min_messages = bogus', ['E:22023', 'I']),
        ('SET client_min_messages = info', ['SET', 'I']),
        ('SHOW client_min_messages', ['row:info', 'SHOW', 'I']),
        ('SET client_min_messages = fatal', ['E:22023', 'I']),
        ('SET standard_conforming_strings = on', ['SET', 'I']),
        ('SHOW standard_conforming_strings', ['row:on', 'SHOW', 'I']),
        ('SHOW server_encoding', ['row:UTF8', 'SHOW', 'I']),
        ('SHOW integer_datetimes', ['row:on', 'SHOW', 'I']),
        ('SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED', ['SET', 'I']),
    ],
    'cursors': [
        ('CREATE TABLE t (id INTEGER)', ['CREATE TABLE', 'I']),
        ('INSERT INTO t VALUES (1), (2), (3)', ['INSERT 0 3', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id; FETCH 2 FROM c',
         ['DECLARE CURSOR', 'row:1', 'row:2', 'FETCH 2', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id', ['E:25P01', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id', ['DECLARE CURSOR', 'T']),
        ('FETCH 2 FROM c', ['row:1', 'row:2', 'FETCH 2', 'T']),
        ('CLOSE c', ['CLOSE CURSOR', 'T']),
        ('FETCH 1 FROM c', ['E:34000', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'edge_cases': [
        ('CREATE TABLE t (id INTEGER, v VARCHAR(5), n INTEGER)', ['CREATE TABLE', 'I']),
        ("INSERT INTO t VALUES (1, 'toolongvalue', 1)", ['E:22001', 'I']),
        ("UPDATE t SET n = 'abc' WHERE id = 999", ['E:22P02', 'I']),
        ('INSERT INTO t VALUES (2, DEFAULT, DEFAULT)', ['INSERT 0 1', 'I']),
        ('SELECT 1e400::float8', ['E:22003', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ("SET application_name = 'y'", ['SET', 'T']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('SHOW application_name', ['row:', 'SHOW', 'I']),
        ('SET search_path = public', ['SET', 'I']),
        ('RESET ALL', ['RESET', 'I']),
        ("INSERT INTO t VALUES (3, 'a', 3); SELECT 1/0", ['INSERT 0 1', 'E:22012', 'I']),
        ('SELECT count(*) FROM t', ['row:1', 'SELECT 1', 'I']),
    ],
    'sqlite_only': [
        ('CREATE TABLE k (id INTEGER PRIMARY KEY, n INTEGER)', ['CREATE TABLE', 'I']),
        ('INSERT INTO k VALUES (1, 1)', ['INSERT 0 1', 'I']),
        ('INSERT INTO k VALUES (1, 2)', ['E:23505', 'I']),
        ('INSERT INTO k VALUES (2, 2) RETURNING id, n', ['row:2|2', 'INSERT 0 1', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('INSERT INTO k VALUES (3, 3)', ['INSERT 0 1', 'T']),
        ('SELECT count(*) FROM k', ['row:3', 'SELECT 1', 'T']),
        ('INSERT INTO k VALUES (1, 1)', ['E:23505', 'E']),
        ('SELECT count(*) FROM k', ['E:25P02', 'E']),
        ('COMMIT', ['ROLLBACK', 'I']),
        ('SELECT count(*) FROM k', ['row:2', 'SELECT 1', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('INSERT INTO k VALUES (4, 4)', ['INSERT 0 1', 'T']),
        ('SAVEPOINT s', ['SAVEPOINT', 'T']),
        ('INSERT INTO k VALUES (5, 5)', ['INSERT 0 1', 'T']),
        ('ROLLBACK TO s', ['ROLLBACK', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('SELECT id FROM k ORDER BY id', ['row:1', 'row:2', 'row:4', 'SELECT 3', 'I']),
        ('INSERT INTO k VALUES (6, 6); INSERT INTO k VALUES (7, 7); SELECT 1/0',
         ['INSERT 0 1', 'INSERT 0 1', 'E:22012', 'I']),
        ('INSERT INTO k VALUES (6, 6); BEGIN; INSERT INTO k VALUES (7, 7); COMMIT; SELECT 1/0',
         ['INSERT 0 1', 'BEGIN', 'INSERT 0 1', 'COMMIT', 'E:22012', 'I']),
        ('SELECT id FROM k ORDER BY id',
         ['row:1', 'row:2', 'row:4', 'row:6', 'row:7', 'SELECT 5', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM k ORDER BY id; FETCH 2 FROM c',
         ['DECLARE CURSOR', 'row:1', 'row:2', 'FETCH 2', 'I']),
        ('SHOW nosuch', ['E:42704', 'I']),
        ('SET nosuch = 1', ['E:42704', 'I']),
        ('SET search_path = public', ['SET', 'I']),
        ('SHOW search_path', ['row:public', 'SHOW', 'I']),
    ],
    'errors_more': [
        ('CREATE TABLE t (id INTEGER, n INTEGER, s VARCHAR)', ['CREATE TABLE', 'I']),
        ("INSERT INTO t VALUES (1, 2, 'c', 4)", ['E:42601', 'I']),
        ('INSERT INTO t (nope) VALUES (1)', ['E:42703', 'I']),
        ('SELECT abs()', ['E:42883', 'I']),
        ('SELECT id, count(*) FROM t', ['E:42803', 'I']),
        ("SELECT 'x'::date", ['E:22007', 'I']),
        ('CREATE TABLE t3 AS SELECT * FROM t', ['SELECT 0', 'I']),
        ('TRUNCATE t3', ['TRUNCATE TABLE', 'I']),
        ('DROP TABLE t, t3', ['DROP TABLE', 'I']),
        ('SELECT $1', ['E:42P02', 'I']),
    ],
    'discard': [
        ("SET application_name = 'x'", ['SET', 'I']),
        ('SET extra_float_digits = 2', ['SET', 'I']),
        ('SET default_transaction_read_only = on', ['SET', 'I']),
        ('PREPARE p AS SELECT 1', ['PREPARE', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('DECLARE c CURSOR WITH HOLD FOR SELECT 1', ['DECLARE CURSOR', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('DISCARD ALL', ['DISCARD ALL', 'I']),
        ('SHOW application_name', ['row:', 'SHOW', 'I']),
        ('SHOW extra_float_digits', ['row:1', 'SHOW', 'I']),
        ('SHOW default_transaction_read_only', ['row:off', 'SHOW', 'I']),
        ('EXECUTE p', ['E:26000', 'I']),
        ('FETCH 1 FROM c', ['E:34000', 'I']),
        ('DISCARD PLANS', ['DISCARD PLANS', 'I']),
        ('DISCARD SEQUENCES', ['DISCARD SEQUENCES', 'I']),
        ('DISCARD TEMPORARY', ['DISCARD TEMP', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('DISCARD ALL', ['E:25001', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('SELECT 1; DISCARD ALL', ['row:1', 'SELECT 1', 'E:25001', 'I']),
    ],
    'failed_before_engine': [
        ('BEGIN', ['BEGIN', 'T']),
        ('FETCH 1 FROM nosuch', ['E:34000', 'E']),
        ('SELECT 1', ['E:25P02', 'E']),
        ('COMMIT', ['ROLLBACK', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('DEALLOCATE nosuch', ['E:26000', 'E']),
        ('COMMIT', ['ROLLBACK', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SET extra_float_digits = 9', ['E:22023', 'E']),
        ('SELECT 1', ['E:25P02', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
    ],
    'settings_rollback': [
        ('BEGIN', ['BEGIN', 'T']),
        ("SET application_name = 'a'", ['SET', 'T']),
        ('SAVEPOINT s', ['SAVEPOINT', 'T']),
        ("SET application_name = 'b'", ['SET', 'T']),
        ('SET extra_float_digits = 2', ['SET', 'T']),
        ('ROLLBACK TO s', ['ROLLBACK', 'T']),
        ('SHOW application_name', ['row:a', 'SHOW', 'T']),
        ('SHOW extra_float_digits', ['row:1', 'SHOW', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('SHOW application_name', ['row:a', 'SHOW', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ("SET application_name = 'y'", ['SET', 'T']),
        ("SET statement_timeout = '3s'", ['SET', 'T']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('SHOW application_name', ['row:a', 'SHOW', 'I']),
        ('SHOW statement_timeout', ['row:0', 'SHOW', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SET default_transaction_read_only = on', ['SET', 'T']),
        ('SELECT 1/0', ['E:22012', 'E']),
        ('COMMIT', ['ROLLBACK', 'I']),
        ('SHOW default_transaction_read_only', ['row:off', 'SHOW', 'I']),
        ("SET application_name = 'c'; SELECT 1/0", ['SET', 'E:22012', 'I']),
        ('SHOW application_name', ['row:a', 'SHOW', 'I']),
    ],
    'cursors_in_a_query': [
        ('CREATE TABLE t (id INTEGER)', ['CREATE TABLE', 'I']),
        ('INSERT INTO t VALUES (1), (2), (3)', ['INSERT 0 3', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id; FETCH 2 FROM c',
         ['DECLARE CURSOR', 'row:1', 'row:2', 'FETCH 2', 'I']),
        ('FETCH 1 FROM c', ['E:34000', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id; FETCH 1 FROM c; FETCH 1 FROM c; '
         'CLOSE c',
         ['DECLARE CURSOR', 'row:1', 'FETCH 1', 'row:2', 'FETCH 1', 'CLOSE CURSOR', 'I']),
        ('DECLARE d CURSOR WITH HOLD FOR SELECT id FROM t ORDER BY id; FETCH 1 FROM d',
         ['DECLARE CURSOR', 'row:1', 'FETCH 1', 'I']),
        ('FETCH 1 FROM d', ['row:2', 'FETCH 1', 'I']),
        ('CLOSE d', ['CLOSE CURSOR', 'I']),
        ('BEGIN; DECLARE e CURSOR FOR SELECT 1', ['BEGIN', 'DECLARE CURSOR', 'T']),
        ('FETCH 1 FROM e', ['row:1', 'FETCH 1', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id; SELECT 1/0',
         ['DECLARE CURSOR', 'E:22012', 'I']),
        ('FETCH 1 FROM c', ['E:34000', 'I']),
    ],
    # a query of several statements outside a block: an implicit block, from each statement
    # on (a COMMIT or ROLLBACK in it ends it, a BEGIN makes it the explicit one; SAVEPOINT,
    # RELEASE and ROLLBACK TO fail in it, and roll it back)
    'implicit_blocks': [
        ('CREATE TABLE t (id INTEGER PRIMARY KEY)', ['CREATE TABLE', 'I']),
        ('INSERT INTO t VALUES (1); SAVEPOINT a; SELECT 1', ['INSERT 0 1', 'E:25P01', 'I']),
        ('INSERT INTO t VALUES (2); RELEASE a', ['INSERT 0 1', 'E:25P01', 'I']),
        ('INSERT INTO t VALUES (3); ROLLBACK TO a', ['INSERT 0 1', 'E:25P01', 'I']),
        ('INSERT INTO t VALUES (4); ROLLBACK; SELECT 1',
         ['INSERT 0 1', 'ROLLBACK', 'row:1', 'SELECT 1', 'I']),
        ('INSERT INTO t VALUES (5); COMMIT; INSERT INTO t VALUES (6); SELECT 1/0',
         ['INSERT 0 1', 'COMMIT', 'INSERT 0 1', 'E:22012', 'I']),
        ('INSERT INTO t VALUES (7); COMMIT AND CHAIN', ['INSERT 0 1', 'E:25P01', 'I']),
        ('SELECT id FROM t ORDER BY id', ['row:5', 'SELECT 1', 'I']),
        ('INSERT INTO t VALUES (8); BEGIN; INSERT INTO t VALUES (9); SELECT 1/0',
         ['INSERT 0 1', 'BEGIN', 'INSERT 0 1', 'E:22012', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('INSERT INTO t VALUES (10); BEGIN; INSERT INTO t VALUES (11)',
         ['INSERT 0 1', 'BEGIN', 'INSERT 0 1', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('BEGIN; INSERT INTO t VALUES (12); COMMIT; INSERT INTO t VALUES (13); SELECT 1/0',
         ['BEGIN', 'INSERT 0 1', 'COMMIT', 'INSERT 0 1', 'E:22012', 'I']),
        ('SELECT id FROM t ORDER BY id', ['row:5', 'row:10', 'row:11', 'row:12', 'SELECT 4', 'I']),
        ('DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id; COMMIT; FETCH 1 FROM c',
         ['DECLARE CURSOR', 'COMMIT', 'E:34000', 'I']),
        ('INSERT INTO t VALUES (14); BEGIN READ ONLY; INSERT INTO t VALUES (15)',
         ['INSERT 0 1', 'BEGIN', 'E:25006', 'E']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('SELECT id FROM t ORDER BY id', ['row:5', 'row:10', 'row:11', 'row:12', 'SELECT 4', 'I']),
    ],
    'update_constants': [
        ('CREATE TABLE t (id INTEGER, n INTEGER, s VARCHAR, d DATE)', ['CREATE TABLE', 'I']),
        ("INSERT INTO t VALUES (1, 1, 'a', '2024-01-01')", ['INSERT 0 1', 'I']),
        ("UPDATE t SET n = 'abc' WHERE id = 999", ['E:22P02', 'I']),
        ("UPDATE t SET n = '5' WHERE id = 999", ['UPDATE 0', 'I']),
        ('UPDATE t SET n = n + 1 WHERE id = 999', ['UPDATE 0', 'I']),
        ('UPDATE t SET n = 1/0 WHERE id = 999', ['E:22012', 'I']),
        ("UPDATE t SET d = 'x' WHERE id = 999", ['E:22007', 'I']),
        ('UPDATE t SET s = 5 WHERE id = 999', ['UPDATE 0', 'I']),
        ('UPDATE t SET n = 3000000000 WHERE id = 999', ['E:22003', 'I']),
        ('UPDATE t SET n = NULL WHERE id = 999', ['UPDATE 0', 'I']),
        ("UPDATE t SET n = '7' WHERE id = 1", ['UPDATE 1', 'I']),
        ('SELECT id, n, s FROM t', ['row:1|7|a', 'SELECT 1', 'I']),
    ],
    'set_local': [
        ('BEGIN', ['BEGIN', 'T']),
        ("SET LOCAL application_name = 'x'", ['SET', 'T']),
        ('SHOW application_name', ['row:x', 'SHOW', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('SHOW application_name', ['row:', 'SHOW', 'I']),
        ("SET LOCAL statement_timeout = '1s'", ['SET', 'I']),
        ('SHOW statement_timeout', ['row:0', 'SHOW', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ('SET LOCAL extra_float_digits = 2', ['SET', 'T']),
        ("SET application_name = 'keep'", ['SET', 'T']),
        ("SET LOCAL statement_timeout = '2s'", ['SET', 'T']),
        ('SHOW statement_timeout', ['row:2s', 'SHOW', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('SHOW extra_float_digits', ['row:1', 'SHOW', 'I']),
        ('SHOW application_name', ['row:keep', 'SHOW', 'I']),
        ('SHOW statement_timeout', ['row:0', 'SHOW', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ("SET LOCAL application_name = 'l'", ['SET', 'T']),
        ("SET application_name = 's'", ['SET', 'T']),
        ('COMMIT', ['COMMIT', 'I']),
        ('SHOW application_name', ['row:s', 'SHOW', 'I']),
        ('BEGIN', ['BEGIN', 'T']),
        ("SET LOCAL application_name = 'r'", ['SET', 'T']),
        ('ROLLBACK', ['ROLLBACK', 'I']),
        ('SHOW application_name', ['row:s', 'SHOW', 'I']),
    ],
}

#: Pipelines (the extended protocol; ``SYNC``: a Sync) sent in turn on one connection,
#: and PostgreSQL 15's answers: the statements before a Sync are one implicit transaction
#: (not a transaction block: no savepoint, no cursor), an error skips to the Sync
PIPELINES: list[tuple[list[str], list[str]]] = [
    (['CREATE TABLE t (a INTEGER)', 'SYNC'],
     ['CREATE TABLE', 'I']),
    (['INSERT INTO t VALUES (1)', 'INSERT INTO t VALUES (2)', 'SELECT 1/0',
      'INSERT INTO t VALUES (3)', 'SYNC'],
     ['INSERT 0 1', 'INSERT 0 1', 'E:22012', 'I']),
    (['SELECT count(*) FROM t', 'SYNC'],
     ['row:0', 'SELECT 1', 'I']),
    (['INSERT INTO t VALUES (1)', 'SYNC', 'SELECT count(*) FROM t', 'SYNC'],
     ['INSERT 0 1', 'I', 'row:1', 'SELECT 1', 'I']),
    (['SELECT 1', 'COMMIT', 'SELECT 2', 'SYNC'],
     ['row:1', 'SELECT 1', 'COMMIT', 'row:2', 'SELECT 1', 'I']),
    (['', 'SYNC'],
     ['EMPTY', 'I']),
    (['SAVEPOINT a', 'SYNC'],
     ['E:25P01', 'I']),
    (['SELECT 1', 'SAVEPOINT a', 'SELECT 2', 'SYNC'],
     ['row:1', 'SELECT 1', 'E:25P01', 'I']),
    (['DECLARE c CURSOR FOR SELECT 1', 'SYNC'],
     ['E:25P01', 'I']),
    (['SELECT 1', 'DECLARE c CURSOR FOR SELECT 1', 'FETCH 1 FROM c', 'SYNC'],
     ['row:1', 'SELECT 1', 'E:25P01', 'I']),
    (['BEGIN', 'SELECT 1/0', 'SYNC', 'SELECT 1', 'SYNC', 'COMMIT', 'SYNC'],
     ['BEGIN', 'E:22012', 'E', 'E:25P02', 'E', 'ROLLBACK', 'I']),
    (['BEGIN', 'SELECT 1', 'SYNC', 'SELECT 2', 'SYNC', 'COMMIT', 'SYNC'],
     ['BEGIN', 'row:1', 'SELECT 1', 'T', 'row:2', 'SELECT 1', 'T', 'COMMIT', 'I']),
    (["SET application_name = 'p'", 'SELECT 1/0', 'SYNC'],
     ['SET', 'E:22012', 'I']),
    (['SHOW application_name', 'SYNC'],
     ['row:', 'SHOW', 'I']),
    (['DISCARD ALL', 'SYNC'],
     ['DISCARD ALL', 'I']),
    (['SELECT 1; SELECT 2', 'SYNC'],
     ['E:42601', 'I']),
    (['COMMIT AND CHAIN', 'SYNC'],
     ['E:25P01', 'I']),
    (['START TRANSACTION', 'SELECT 1', 'ROLLBACK', 'SELECT 2', 'SYNC'],
     ['START TRANSACTION', 'row:1', 'SELECT 1', 'ROLLBACK', 'row:2', 'SELECT 1', 'I']),
]


#: (engine, scenario, query's index) -> the engine's answer where it differs from
#: PostgreSQL's, each in docs/server-protocol.md's *Differences from PostgreSQL*
DIFFERENCES: dict[tuple[str, str, int], list[str]] = {
    # neither engine checks varchar(n)'s length
    ("analytical", "edge_cases", 1): ["INSERT 0 1", "I"],
    ("sqlite_engine", "edge_cases", 1): ["INSERT 0 1", "I"],
    # (SQLite) a SET value the column's type cannot read, where no row matches: nothing
    # converted, nothing refused
    ("sqlite_engine", "edge_cases", 2): ["UPDATE 0", "I"],
    ("sqlite_engine", "update_constants", 2): ["UPDATE 0", "I"],
    ("sqlite_engine", "update_constants", 5): ["UPDATE 0", "I"],
    ("sqlite_engine", "update_constants", 6): ["UPDATE 0", "I"],
    ("sqlite_engine", "update_constants", 8): ["UPDATE 0", "I"],
    # SQLite has no DEFAULT in VALUES
    ("sqlite_engine", "edge_cases", 3): ["E:42601", "I"],
    # a float literal past float8's range is infinity
    ("analytical", "edge_cases", 4): ["row:Infinity", "SELECT 1", "I"],
    ("sqlite_engine", "edge_cases", 4): ["row:Infinity", "SELECT 1", "I"],
    # the analytical engine undoes no write: a query's INSERT stays when a later
    # statement of the query fails
    ("analytical", "edge_cases", 12): ["row:3", "SELECT 1", "I"],
    # CREATE TABLE AS is tagged as such (PostgreSQL: SELECT n)
    ("analytical", "errors_more", 6): ["CREATE TABLE", "I"],
    ("sqlite_engine", "errors_more", 6): ["CREATE TABLE", "I"],
    # one table per DROP (DuckDB: not implemented; SQLite: its syntax)
    ("analytical", "errors_more", 8): ["E:0A000", "I"],
    ("sqlite_engine", "errors_more", 8): ["E:42601", "I"],
    # SQLite's own rules: a bare column beside an aggregate, no TRUNCATE
    ("sqlite_engine", "errors_more", 4): ["row:NULL|0", "SELECT 1", "I"],
    ("sqlite_engine", "errors_more", 7): ["E:42601", "I"],
    # (a query of several statements is no transaction on the analytical engine)
    ("analytical", "settings_rollback", 22): ["row:c", "SHOW", "I"],
    # nor the statements of a pipeline (docs/server-operations.md)
    ("analytical", "pipelines", 2): ["row:2", "SELECT 1", "I"],
    ("analytical", "pipelines", 3): ["INSERT 0 1", "I", "row:3", "SELECT 1", "I"],
    ("analytical", "pipelines", 13): ["row:p", "SHOW", "I"],
}

#: scenarios of tables with keys and of writes in transaction blocks: SQLite only (the
#: analytical engine has no keys, and its blocks are read-only: docs/server-operations.md)
SQLITE_ONLY = {"sqlite_only", "implicit_blocks"}


def _connect(srv: Any) -> Raw:
    raw = Raw(srv.port)
    raw.startup()
    return raw


@pytest.mark.parametrize(("engine", "scenario"), [
    (engine, scenario) for scenario in sorted(SCENARIOS) for engine in ENGINES
    if scenario not in SQLITE_ONLY or engine == "sqlite_engine"])
def test_as_postgresql_answers(start_server, request, engine, scenario) -> None:
    srv = start_server(request.getfixturevalue(engine), secure=False)
    raw = _connect(srv)
    try:
        got = [run_steps(raw, sql) for sql, _ in SCENARIOS[scenario]]
    finally:
        raw.close()
    expected = [DIFFERENCES.get((engine, scenario, i), pg)
                for i, (_, pg) in enumerate(SCENARIOS[scenario])]
    for (sql, _), want, have in zip(SCENARIOS[scenario], expected, got, strict=True):
        assert (sql, have) == (sql, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_pipelines_as_postgresql_answers(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine), secure=False)
    raw = _connect(srv)
    try:
        got = [run_pipeline(raw, steps) for steps, _ in PIPELINES]
    finally:
        raw.close()
    for i, ((steps, pg), have) in enumerate(zip(PIPELINES, got, strict=True)):
        assert (steps, have) == (steps, DIFFERENCES.get((engine, "pipelines", i), pg))


# -- random sequences against a model of PostgreSQL's rules -----------------------------------

STEPS = ["BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT a", "SAVEPOINT b", "RELEASE a",
         "RELEASE b", "ROLLBACK TO a", "ROLLBACK TO b", "SELECT 1", "SELECT 1/0",
         "INSERT INTO t VALUES (1)", "SELECT count(*) FROM t", "COMMIT AND CHAIN",
         "SELECT 1; SELECT 1/0", "INSERT INTO t VALUES (1); SELECT 1/0"]


class Model:
    """PostgreSQL 15's answers to ``STEPS`` (checked against it: see the module)."""

    def __init__(self, writes_in_blocks: bool = True) -> None:
        self.status = "I"
        self.rows = 0  # committed
        self.tx_rows = 0  # seen in the block
        self.marks: list[tuple[str, int]] = []
        #: False: the analytical engine, whose blocks refuse writes (0A000)
        self.writes_in_blocks = writes_in_blocks

    def _fail(self, code: str) -> list[str]:
        if self.status == "T":
            self.status = "E"
        return [f"E:{code}"]

    def _end(self) -> None:
        self.status, self.tx_rows, self.marks = "I", self.rows, []

    def _one(self, sql: str) -> list[str]:
        words = sql.split()
        if self.status == "E" and words[0] not in ("COMMIT", "ROLLBACK"):
            return ["E:25P02"]
        if sql == "BEGIN":
            if self.status == "I":
                self.status, self.tx_rows = "T", self.rows
            return ["BEGIN"]
        if words[0] == "COMMIT":
            chain = sql.endswith("AND CHAIN")
            if chain and self.status == "I":
                return ["E:25P01"]
            tag = "ROLLBACK" if self.status == "E" else "COMMIT"
            if self.status == "T":
                self.rows = self.tx_rows
            self._end()
            if chain:
                self.status = "T"
            return [tag]
        if sql == "ROLLBACK":
            self._end()
            return ["ROLLBACK"]
        name = words[-1]
        names = [n for n, _ in self.marks]
        if words[0] in ("SAVEPOINT", "RELEASE") or words[:2] == ["ROLLBACK", "TO"]:
            if self.status == "I":
                return ["E:25P01"]
            if words[0] == "SAVEPOINT":
                self.marks.append((name, self.tx_rows))
                return ["SAVEPOINT"]
            if name not in names:
                return self._fail("3B001")
            last = len(names) - 1 - names[::-1].index(name)
            if words[0] == "RELEASE":
                del self.marks[last:]
                return ["RELEASE"]
            del self.marks[last + 1:]
            self.tx_rows, self.status = self.marks[-1][1], "T"
            return ["ROLLBACK"]
        if sql == "SELECT 1":
            return ["row:1", "SELECT 1"]
        if sql == "SELECT 1/0":
            return self._fail("22012")
        if sql.startswith("INSERT"):
            if self.status == "I":
                self.rows += 1
                self.tx_rows = self.rows
            elif not self.writes_in_blocks:
                return self._fail("0A000")
            else:
                self.tx_rows += 1
            return ["INSERT 0 1"]
        assert sql == "SELECT count(*) FROM t"
        return [f"row:{self.tx_rows if self.status == 'T' else self.rows}", "SELECT 1"]

    def answer(self, sql: str) -> list[str]:
        """One query (of one or more statements) and the status after it."""
        parts = [p.strip() for p in sql.split(";")]
        if len(parts) == 1:
            return [*self._one(sql), self.status]
        # several: one implicit transaction when outside a block (none of STEPS' several
        # holds a transaction statement); an error stops it and undoes its writes
        implicit = self.status == "I"
        before, out = self.rows, []
        for part in parts:
            got = self._one(part)
            out += got
            if got[0].startswith("E:"):
                if implicit:
                    self.rows = self.tx_rows = before
                break
        return [*out, self.status]


def _check_sequence(raw: Raw, steps: list[str], model: Model) -> None:
    for sql in ["ROLLBACK", "DROP TABLE IF EXISTS t", "CREATE TABLE t (a INTEGER)"]:
        run_steps(raw, sql)
    done = []
    for sql in steps:
        want = model.answer(sql)
        have = run_steps(raw, sql)
        done.append(sql)
        assert have == want, done


@pytest.mark.parametrize("engine", ENGINES)
def test_random_transaction_sequences_as_postgresql(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine), secure=False)
    sqlite = engine == "sqlite_engine"
    # the analytical engine undoes no write: a query's statements that fail after an
    # INSERT keep it (docs/server-operations.md); its model has no such step
    steps = STEPS if sqlite else [s for s in STEPS if not s.startswith("INSERT INTO t VALUES "
                                                                       "(1);")]

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.sampled_from(steps), max_size=14))
    def check(sequence: list[str]) -> None:
        raw = _connect(srv)
        try:
            _check_sequence(raw, sequence, Model(writes_in_blocks=sqlite))
        finally:
            raw.close()

    check()


# -- the same through psycopg (libpq's PQexec for a query without parameters) ---------------

def psycopg_flow(conninfo: str, *, writes_in_blocks: bool) -> list[str]:
    """What a psycopg user sees of tags, SQLSTATEs and transaction status, autocommit off
    and on, in the simple protocol (several statements in one ``execute``) and the
    extended one (``prepare=True``)."""
    import psycopg

    seen: list[str] = []

    def run(conn: Any, sql: str, **kw: Any) -> None:
        cur = conn.cursor()
        try:
            cur.execute(sql, **kw)
            results = []
            while True:
                results.append(f"{cur.statusmessage}"
                               + (f":{cur.fetchall()}" if cur.description else ""))
                if not cur.nextset():
                    break
            seen.append(f"{sql} -> {' / '.join(results)}")
        except psycopg.Error as exc:
            seen.append(f"{sql} -> {exc.sqlstate}")
        seen.append(conn.info.transaction_status.name)

    with psycopg.connect(conninfo, autocommit=True) as conn:
        run(conn, "DROP TABLE IF EXISTS t")
        run(conn, "CREATE TABLE t (a INTEGER)")
        run(conn, "INSERT INTO t VALUES (1), (2)")
        run(conn, "UPDATE t SET a = a + 10 WHERE a > 1")
        run(conn, "SELECT a FROM t ORDER BY a; SELECT count(*) FROM t")
        run(conn, "SELECT 1; SELECT 1/0; SELECT 2")
        run(conn, "SELECT 2::int", prepare=True)
        run(conn, "DELETE FROM t WHERE a = 1", prepare=True)
        run(conn, "SAVEPOINT s")
    with psycopg.connect(conninfo) as conn:  # autocommit off: psycopg sends BEGIN
        run(conn, "SELECT count(*) FROM t")
        run(conn, "SELECT 1/0", prepare=True)
        run(conn, "SELECT 1", prepare=True)
        run(conn, "SELECT 1")
        conn.rollback()
        seen.append(conn.info.transaction_status.name)
        run(conn, "SAVEPOINT s")
        run(conn, "SELECT 1/0")
        run(conn, "ROLLBACK TO SAVEPOINT s")
        run(conn, "SELECT count(*) FROM t")
        if writes_in_blocks:
            with conn.transaction():
                run(conn, "INSERT INTO t VALUES (3)")
                try:
                    with conn.transaction():
                        run(conn, "INSERT INTO t VALUES (4)")
                        raise ValueError
                except ValueError:
                    pass
            run(conn, "SELECT a FROM t ORDER BY a")
        conn.commit()
        seen.append(conn.info.transaction_status.name)
    return seen


#: psycopg_flow's answer from PostgreSQL 15 (writes_in_blocks=True; the analytical
#: engine's, without its writes in blocks, is the same with those lines left out)
PSYCOPG_FLOW: list[str] = [
    'DROP TABLE IF EXISTS t -> DROP TABLE',
    'IDLE',
    'CREATE TABLE t (a INTEGER) -> CREATE TABLE',
    'IDLE',
    'INSERT INTO t VALUES (1), (2) -> INSERT 0 2',
    'IDLE',
    'UPDATE t SET a = a + 10 WHERE a > 1 -> UPDATE 1',
    'IDLE',
    'SELECT a FROM t ORDER BY a; SELECT count(*) FROM t -> SELECT 2:[(1,), (12,)] / SELECT '
    '1:[(2,)]',
    'IDLE',
    'SELECT 1; SELECT 1/0; SELECT 2 -> 22012',
    'IDLE',
    'SELECT 2::int -> SELECT 1:[(2,)]',
    'IDLE',
    'DELETE FROM t WHERE a = 1 -> DELETE 1',
    'IDLE',
    'SAVEPOINT s -> 25P01',
    'IDLE',
    'SELECT count(*) FROM t -> SELECT 1:[(1,)]',
    'INTRANS',
    'SELECT 1/0 -> 22012',
    'INERROR',
    'SELECT 1 -> 25P02',
    'INERROR',
    'SELECT 1 -> 25P02',
    'INERROR',
    'IDLE',
    'SAVEPOINT s -> SAVEPOINT',
    'INTRANS',
    'SELECT 1/0 -> 22012',
    'INERROR',
    'ROLLBACK TO SAVEPOINT s -> ROLLBACK',
    'INTRANS',
    'SELECT count(*) FROM t -> SELECT 1:[(1,)]',
    'INTRANS',
    'INSERT INTO t VALUES (3) -> INSERT 0 1',
    'INTRANS',
    'INSERT INTO t VALUES (4) -> INSERT 0 1',
    'INTRANS',
    'SELECT a FROM t ORDER BY a -> SELECT 2:[(3,), (12,)]',
    'INTRANS',
    'IDLE',
]


@pytest.mark.parametrize("engine", ENGINES)
def test_psycopg_sees_what_postgresql_gives(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine), secure=False)
    writes = engine == "sqlite_engine"
    got = psycopg_flow(f"host=127.0.0.1 port={srv.port} user=u dbname=db sslmode=disable",
                       writes_in_blocks=writes)
    assert got == (PSYCOPG_FLOW if writes else _without_block_writes(PSYCOPG_FLOW))


def _without_block_writes(flow: list[str]) -> list[str]:
    """PSYCOPG_FLOW without the lines of the writes in blocks and what they show."""
    out, skip = [], False
    for line in flow:
        if line.startswith(("INSERT INTO t VALUES (3)", "INSERT INTO t VALUES (4)",
                            "SELECT a FROM t ORDER BY a ->")):
            skip = True
            continue
        if skip:  # (the status line after each)
            skip = False
            continue
        out.append(line)
    return out


def _against_postgresql(port: int) -> int:
    """Check the pinned answers and the model against a real PostgreSQL (user postgres,
    trust authentication, on 127.0.0.1:port); print each difference."""
    import random

    wrong = 0
    for name, steps in SCENARIOS.items():
        raw = Raw(port)
        raw.startup("postgres")
        for table in ("t", "u", "k"):
            run_steps(raw, f"DROP TABLE IF EXISTS {table}")
        for sql, want in steps:
            have = run_steps(raw, sql)
            if have != want:
                wrong += 1
                print(f"{name}: {sql!r}: PostgreSQL {have}, pinned {want}")
        raw.close()
    raw = Raw(port)
    raw.startup("postgres")
    run_steps(raw, "DROP TABLE IF EXISTS t")
    for steps, want in PIPELINES:
        have = run_pipeline(raw, steps)
        if have != want:
            wrong += 1
            print(f"pipeline {steps}: PostgreSQL {have}, pinned {want}")
    raw.close()
    rng = random.Random(1)
    for _ in range(300):
        sequence = [rng.choice(STEPS) for _ in range(rng.randint(0, 14))]
        raw = Raw(port)
        raw.startup("postgres")
        try:
            _check_sequence(raw, sequence, Model())
        except AssertionError as exc:
            wrong += 1
            print(f"model: {sequence}: {exc}")
        raw.close()
    flow = psycopg_flow(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                        writes_in_blocks=True)
    if flow != PSYCOPG_FLOW:
        wrong += 1
        print("psycopg:", flow)
    print("all as pinned" if not wrong else f"{wrong} differences")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(_against_postgresql(int(sys.argv[1].rpartition(":")[2])))


#: RESET, SET ... TO DEFAULT, RESET ALL and DISCARD ALL restore what the client gave at
#: startup (application_name, options -c statement_timeout / extra_float_digits), not the
#: server's defaults: PostgreSQL 15's answers (psycopg's statusmessage or SHOW's value)
STARTUP_RESETS = [
    ("SET application_name = 'x'", 'SET'), ("SET statement_timeout = '3s'", 'SET'),
    ('SET extra_float_digits = 0', 'SET'), ('RESET ALL', 'RESET'),
    ('SHOW application_name', 'abc'), ('SHOW statement_timeout', '7s'),
    ('SHOW extra_float_digits', '3'),
    ("SET application_name = 'y'", 'SET'), ('SET statement_timeout = 5', 'SET'),
    ('SET extra_float_digits = 1', 'SET'), ('RESET application_name', 'RESET'),
    ('RESET statement_timeout', 'RESET'), ('RESET extra_float_digits', 'RESET'),
    ('SHOW application_name', 'abc'), ('SHOW statement_timeout', '7s'),
    ('SHOW extra_float_digits', '3'),
    ('SET application_name TO DEFAULT', 'SET'), ('SET statement_timeout TO DEFAULT', 'SET'),
    ('SET extra_float_digits TO DEFAULT', 'SET'),
    ('SHOW application_name', 'abc'), ('SHOW statement_timeout', '7s'),
    ('SHOW extra_float_digits', '3'),
    ("SET application_name = 'z'", 'SET'), ('DISCARD ALL', 'DISCARD ALL'),
    ('SHOW application_name', 'abc'), ('SHOW statement_timeout', '7s'),
    ('SHOW extra_float_digits', '3'),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_resets_restore_the_startup_values(start_server, request, engine) -> None:
    import psycopg

    srv = start_server(request.getfixturevalue(engine), secure=False)
    got = []
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="db",
                         application_name="abc", autocommit=True,
                         options="-c statement_timeout=7000 -c extra_float_digits=3") as c:
        for sql, _ in STARTUP_RESETS:
            cur = c.execute(sql)
            got.append((sql, cur.fetchone()[0] if cur.description else cur.statusmessage))
    assert got == STARTUP_RESETS


@pytest.mark.parametrize("engine", ENGINES)
def test_client_min_messages_and_application_name_in_startup_options(start_server, request,
                                                                     engine) -> None:
    """``options=-c client_min_messages=...`` and ``-c application_name=...`` are the
    session's (SHOW, the application_name ParameterStatus) and what RESET ALL restores,
    as in PostgreSQL 15 (they were ignored: notice, ''); a level PostgreSQL refuses fails
    the connection with its 22023."""
    import psycopg

    srv = start_server(request.getfixturevalue(engine), secure=False)
    dsn = {"host": "127.0.0.1", "port": srv.port, "user": "u", "dbname": "db"}
    with psycopg.connect(**dsn, autocommit=True,
                         options="-c client_min_messages=warning -c application_name=opt") as c:
        assert c.info.parameter_status("application_name") == "opt"
        for _ in range(2):
            assert c.execute("SHOW client_min_messages").fetchone() == ("warning",)
            assert c.execute("SHOW application_name").fetchone() == ("opt",)
            c.execute("SET client_min_messages = error")
            c.execute("SET application_name = 'x'")
            c.execute("RESET ALL")
    with pytest.raises(psycopg.OperationalError,
                       match='invalid value for parameter "client_min_messages": "bogus"'):
        psycopg.connect(**dsn, options="-c client_min_messages=bogus")


#: statements PostgreSQL 15 answers with a WARNING, and its SQLSTATE (checked there)
WARNINGS = [("BEGIN", None), ("BEGIN", ("25001", "there is already a transaction in progress")),
            ("COMMIT", None), ("COMMIT", ("25P01", "there is no transaction in progress")),
            ("ROLLBACK", ("25P01", "there is no transaction in progress")),
            ("SET LOCAL application_name = 'x'",
             ("25P01", "SET LOCAL can only be used in transaction blocks")),
            ("SET TRANSACTION READ ONLY",
             ("25P01", "SET TRANSACTION can only be used in transaction blocks"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_warnings_are_warnings_and_client_min_messages_filters_them(start_server, request,
                                                                    engine) -> None:
    """The transaction-state warnings are WARNINGs with PostgreSQL 15's SQLSTATE (they
    were NOTICEs, 00000), sent at client_min_messages warning and below, and not at
    error, as there."""
    import psycopg

    srv = start_server(request.getfixturevalue(engine), secure=False)
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="db",
                         autocommit=True) as c:
        got: list[tuple[str | None, str | None, str | None]] = []
        c.add_notice_handler(lambda d: got.append((d.severity_nonlocalized, d.sqlstate,
                                                   d.message_primary)))
        for level, sent in (("notice", True), ("warning", True), ("error", False)):
            c.execute(f"SET client_min_messages = {level}")
            for sql, warning in WARNINGS:
                got.clear()
                c.execute(sql)
                assert got == ([("WARNING", *warning)] if warning and sent else []), \
                    (level, sql)

@pytest.mark.parametrize("engine", ENGINES)
def test_startup_parameters_count_after_options(start_server, request, engine) -> None:
    """A startup parameter (application_name, statement_timeout, extra_float_digits,
    client_min_messages) wins over the same setting in options' -c, and is what RESET
    restores; a value PostgreSQL refuses in either fails the connection (22023): PostgreSQL
    15's answers, through psycopg and asyncpg (which sends any startup parameter)."""
    import asyncio

    import asyncpg
    import psycopg

    srv = start_server(request.getfixturevalue(engine), secure=False)
    names = ["application_name", "statement_timeout", "extra_float_digits",
             "client_min_messages"]
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="db",
                         autocommit=True, application_name="plain",
                         options="-c application_name=opt") as c:
        assert c.info.parameter_status("application_name") == "plain"
        assert c.execute("SHOW application_name").fetchone() == ("plain",)

    async def shown(settings: dict[str, str]) -> list[list[str]]:
        c = await asyncpg.connect(host="127.0.0.1", port=srv.port, user="u", database="db",
                                  ssl=False, server_settings=settings)
        try:
            got = [await c.fetchval(f"SHOW {n}") for n in names]
            for n in names:
                await c.execute(f"RESET {n}")
            return [got, [await c.fetchval(f"SHOW {n}") for n in names]]
        finally:
            await c.close()

    options = ("-c application_name=opt -c statement_timeout=7000 -c extra_float_digits=3 "
               "-c client_min_messages=error")
    assert asyncio.run(shown({"application_name": "plain", "statement_timeout": "3000",
                              "extra_float_digits": "2", "client_min_messages": "warning",
                              "options": options})) == [["plain", "3s", "2", "warning"]] * 2
    assert asyncio.run(shown({"options": options})) == [["opt", "7s", "3", "error"]] * 2
    for startup, message in [
            ({"statement_timeout": "3000", "options": "-c statement_timeout=bogus"},
             'invalid value for parameter "statement_timeout": "bogus"'),
            ({"client_min_messages": "bogus", "options": "-c client_min_messages=error"},
             'invalid value for parameter "client_min_messages": "bogus"')]:
        with pytest.raises(asyncpg.PostgresError) as info:
            asyncio.run(shown(startup))
        assert (info.value.sqlstate, str(info.value)) == ("22023", message)
