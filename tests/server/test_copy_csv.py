"""COPY's CSV format as PostgreSQL's: NULL and the empty string kept apart both ways,
quoting, QUOTE/ESCAPE, the end-of-data marker, and the options PostgreSQL refuses."""

from __future__ import annotations

import itertools

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cryptdisk.server import _copy
from cryptdisk.server._engines import StatementError

#: the option combinations PostgreSQL accepts of: delimiter, NULL, QUOTE, ESCAPE, HEADER
DELIMITERS = [",", ";", "\t", "|"]
NULLS = ["", "NULL", "\\N", "x"]
QUOTES = ['"', "'"]
ESCAPES = [None, "\\"]  # None: the same as QUOTE (the default)
COMBINATIONS = [c for c in itertools.product(DELIMITERS, NULLS, QUOTES, ESCAPES, [False, True])
                if c[0] != c[2] and c[0] not in c[1] and c[2] not in c[1]]


def _options(delimiter: str, null: str, quote: str, escape: str | None, header: bool) -> str:
    def lit(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"
    opts = [f"FORMAT csv, DELIMITER {lit(delimiter)}, NULL {lit(null)}, QUOTE {lit(quote)}"]
    if escape is not None:
        opts.append(f"ESCAPE {lit(escape)}")
    if header:
        opts.append("HEADER")
    return "(" + ", ".join(opts) + ")"


#: strings made of what CSV treats specially (every delimiter, quote and escape, line ends,
#: the end-of-data marker's characters), the NULL strings and plain text
VALUE = hs.one_of(hs.none(), hs.sampled_from(["", "\\.", "NULL", "\\N", "x", " "]),
                  hs.text(alphabet=",;\t|\"'\\\n\r.xNUL é", max_size=8))


@settings(max_examples=300, deadline=None)
@given(options=hs.sampled_from(COMBINATIONS), width=hs.integers(1, 4), data=hs.data())
def test_csv_round_trip_keeps_null_and_every_string(options, width, data) -> None:
    rows = data.draw(hs.lists(hs.lists(VALUE, min_size=width, max_size=width), max_size=6))
    names = data.draw(hs.lists(hs.text(alphabet=",\"'\n x", max_size=3), min_size=width,
                               max_size=width))
    opts = _options(*options)
    out = _copy.parse_copy(f"COPY t TO STDOUT {opts}")
    encoded = b"".join(_copy.encode_rows(out, names, [tuple(r) for r in rows]))
    assert _copy.decode_rows(_copy.parse_copy(f"COPY t FROM STDIN {opts}"), encoded) == rows
    if options[4]:  # the header line reads back as the names (quoted if one is NULL's)
        plain = _copy.parse_copy(f"COPY t FROM STDIN {_options(*options[:4], False)}")
        assert _copy.decode_rows(plain, encoded)[0] == names

def test_csv_is_written_as_postgresql_writes_it() -> None:
    st = _copy.parse_copy("COPY t TO STDOUT CSV")
    assert list(_copy.encode_rows(st, ["a", "b"], [("x", ""), ("y", None)])) == [
        b'x,""\n', b"y,\n"]
    assert list(_copy.encode_rows(st, ["a"], [("",), (None,), ("\\.",), ("a\rb",)])) == [
        b'""\n', b"\n", b'"\\."\n', b'"a\rb"\n']
    assert list(_copy.encode_rows(st, ["a", "b"], [("\\.", 'say "hi"')])) == [
        b'\\.,"say ""hi"""\n']
    st = _copy.parse_copy("COPY t TO STDOUT (FORMAT csv, NULL 'n', QUOTE '''', "
                          "ESCAPE '\\', HEADER)")
    assert b"".join(_copy.encode_rows(st, ["n", "b"], [("n", ""), ("it's", "a\\b,")])) == \
        b"'n',b\n'n',\n'it\\'s','a\\\\b,'\n"


def test_csv_is_read_as_postgresql_reads_it() -> None:
    st = _copy.parse_copy("COPY t FROM STDIN CSV")
    assert _copy.decode_rows(st, b'x,""\ny,\n""\n\n"a""b","c\nd"\n') == [
        ["x", ""], ["y", None], [""], [None], ['a"b', "c\nd"]]
    # quoted and unquoted parts make one field, never NULL once a part is quoted
    assert _copy.decode_rows(st, b'a"b,c"d,""""\n') == [["ab,cd", '"']]
    # CRLF line ends; a quoted \. is a value, an unquoted one alone ends the data
    assert _copy.decode_rows(st, b'1,2\r\n"\\."\r\n\\.\r\nnot read\r\n') == [
        ["1", "2"], ["\\."]]
    # \. at the very end, without a line ending, is a value (PostgreSQL 15 reads it so)
    assert _copy.decode_rows(st, b"\\.x,\\.\n\\.") == [["\\.x", "\\."], ["\\."]]
    st = _copy.parse_copy("COPY t FROM STDIN (FORMAT csv, NULL 'NULL', HEADER)")
    assert _copy.decode_rows(st, b'"h\n1",h2\nNULL,"NULL"\n,\n') == [
        [None, "NULL"], ["", ""]]
    st = _copy.parse_copy("COPY t FROM STDIN (FORMAT csv, QUOTE '''', ESCAPE '\\')")
    assert _copy.decode_rows(st, b"'it\\'s','a\\\\b',a\\b,'\\x'\n") == [
        ["it's", "a\\b", "a\\b", "\\x"]]


@pytest.mark.parametrize("data, message", [
    (b'1,"open\n', r"unterminated CSV quoted field \(COPY line 1\)"),
    (b"1,2\n3,4\r\n", r"unquoted carriage return found in data \(COPY line 2\)"),
    (b"1,2\r\n3,4\n5\r\n", r"unquoted newline found in data \(COPY line 2\)"),
])
def test_malformed_csv_is_a_clear_error(data, message) -> None:
    with pytest.raises(StatementError, match=message) as err:
        _copy.decode_rows(_copy.parse_copy("COPY t FROM STDIN CSV"), data)
    assert err.value.sqlstate == "22P04"


@pytest.mark.parametrize("sql, sqlstate, message", [
    ("COPY t TO STDOUT (FORMAT csv, FORCE_QUOTE (a, b))", "0A000", "FORCE_QUOTE"),
    ("COPY t TO STDOUT (FORMAT csv, FORCE_QUOTE *)", "0A000", "FORCE_QUOTE"),
    ("COPY t FROM STDIN (FORMAT csv, FORCE_NOT_NULL *)", "22023",
     'argument to option "force_not_null" must be a list of column names'),
    ("COPY t FROM STDIN (FORCE_NULL (a))", "0A000", "COPY force null available only in CSV"),
    ("COPY t TO STDOUT (FORMAT csv, FORCE_NULL (b))", "0A000",
     "COPY force null only available using COPY FROM"),
    ("COPY t TO STDOUT (HEADER match)", "0A000", 'cannot use "match" with HEADER in COPY TO'),
    ("COPY t FROM STDIN (HEADER 'foo')", "42601", 'header requires a Boolean value or "match"'),
    ("COPY t FROM STDIN CSV FORCE NOT NULL a", "0A000", "FORCE"),
    ("COPY t TO STDOUT CSV FORCE QUOTE a", "0A000", "FORCE"),
    ("COPY t TO STDOUT (QUOTE '\"')", "0A000", "quote available only in CSV mode"),
    ("COPY t TO STDOUT (ESCAPE '\\')", "0A000", "escape available only in CSV mode"),
    ("COPY t TO STDOUT (FORMAT csv, QUOTE 'ab')", "0A000", "single one-byte character"),
    ("COPY t TO STDOUT (FORMAT csv, DELIMITER '\"')", "22023", "delimiter and quote"),
    ("COPY t TO STDOUT (FORMAT csv, NULL 'a,b')", "0A000", "delimiter must not appear"),
    ("COPY t TO STDOUT (FORMAT csv, NULL '\"')", "0A000", "quote character must not"),
    ("COPY t TO STDOUT (FORMAT csv, NULL 'a\nb')", "22023", "newline"),
    ("COPY t TO STDOUT (FORMAT csv, DELIMITER ';', DELIMITER ',')", "42601", "redundant"),
])
def test_csv_options_postgresql_refuses_or_that_are_not_supported(sql, sqlstate,
                                                                  message) -> None:
    with pytest.raises(StatementError, match=message) as err:
        _copy.parse_copy(sql)
    assert err.value.sqlstate == sqlstate


#: PostgreSQL 15's answers to COPY (SELECT 1 AS a, 'x' AS b) TO STDOUT (options), as psql
#: printed them (None: accepted): text format refuses a delimiter its escapes or the NULL
#: string could take for data, every format a newline in either
PG_OPTION_ERRORS = [
    ("DELIMITER 'n'", "22023", 'COPY delimiter cannot be "n"'),
    ("DELIMITER '\\'", "22023", 'COPY delimiter cannot be "\\"'),
    ("DELIMITER '.'", "22023", 'COPY delimiter cannot be "."'),
    ("DELIMITER '7'", "22023", 'COPY delimiter cannot be "7"'),
    ("DELIMITER 'N'", "0A000", "COPY delimiter must not appear in the NULL specification"),
    ("DELIMITER '|', NULL 'a|b'", "0A000",
     "COPY delimiter must not appear in the NULL specification"),
    ("DELIMITER '\n'", "22023", "COPY delimiter cannot be newline or carriage return"),
    ("DELIMITER '\r'", "22023", "COPY delimiter cannot be newline or carriage return"),
    ("DELIMITER ''", "0A000", "COPY delimiter must be a single one-byte character"),
    ("DELIMITER ';;'", "0A000", "COPY delimiter must be a single one-byte character"),
    ("DELIMITER '\u00e9'", "0A000", "COPY delimiter must be a single one-byte character"),
    ("NULL 'a\nb'", "22023", "COPY null representation cannot use newline or carriage return"),
    ("NULL '\r'", "22023", "COPY null representation cannot use newline or carriage return"),
    ("FORMAT csv, DELIMITER 'n'", None, None),
    ("FORMAT csv, DELIMITER '\\'", None, None),
    ("FORMAT csv, DELIMITER 'x', NULL 'x'", "0A000",
     "COPY delimiter must not appear in the NULL specification"),
    ("FORMAT csv, QUOTE 'x', NULL 'x'", "0A000",
     "CSV quote character must not appear in the NULL specification"),
    ("FORMAT csv, QUOTE ','", "22023", "COPY delimiter and quote must be different"),
    ("FORMAT csv, DELIMITER '\r'", "22023",
     "COPY delimiter cannot be newline or carriage return"),
    ("FORMAT csv, NULL '\n'", "22023",
     "COPY null representation cannot use newline or carriage return"),
    ("FORMAT csv, QUOTE 'ab'", "0A000", "COPY quote must be a single one-byte character"),
    ("FORMAT csv, QUOTE ''", "0A000", "COPY quote must be a single one-byte character"),
    ("FORMAT csv, ESCAPE 'ab'", "0A000", "COPY escape must be a single one-byte character"),
    ("FORMAT csv, DELIMITER ''", "0A000", "COPY delimiter must be a single one-byte character"),
    ("QUOTE 'a'", "0A000", "COPY quote available only in CSV mode"),
    ("ESCAPE 'a'", "0A000", "COPY escape available only in CSV mode"),
    ("FORMAT binary, HEADER", "0A000", "cannot specify HEADER in BINARY mode"),
    ("FORMAT binary, DELIMITER ','", "42601", "cannot specify DELIMITER in BINARY mode"),
    ("FORMAT binary, NULL 'x'", "42601", "cannot specify NULL in BINARY mode"),
    ("FORMAT binary, QUOTE 'x'", "0A000", "COPY quote available only in CSV mode"),
    ("FORMAT csv, HEADER, HEADER", "42601", "conflicting or redundant options"),
    ("FORMAT text, DELIMITER ','", None, None),
    ("FORMAT csv, DELIMITER ',', QUOTE ''''", None, None),
]


@pytest.mark.parametrize("options, sqlstate, message", PG_OPTION_ERRORS)
def test_copy_options_are_checked_as_postgresql_checks_them(options, sqlstate,
                                                           message) -> None:
    sql = f"COPY (SELECT 1 AS a, 'x' AS b) TO STDOUT ({options})"
    if sqlstate is None:
        _copy.parse_copy(sql)
        return
    with pytest.raises(StatementError) as err:
        _copy.parse_copy(sql)
    assert (err.value.sqlstate, str(err.value)) == (sqlstate, message)


def test_a_comma_delimiter_in_the_new_syntax() -> None:
    st = _copy.parse_copy("COPY t FROM STDIN (FORMAT text, DELIMITER ',')")
    assert (st.csv, st.delimiter, st.null) == (False, ",", "\\N")
    st = _copy.parse_copy("COPY t FROM STDIN (FORMAT csv, QUOTE ',', DELIMITER ';')")
    assert (st.delimiter, st.quote, st.escape, st.null) == (";", ",", ",", "")


#: what the client sends (PostgreSQL's CSV, by hand): '', NULL, quotes and a delimiter, a
#: newline, the text \N (a string in CSV), the text NULL
SENT = b'1,""\n2,\n3,"a ""q"", b"\n4,"line\nbreak"\n5,\\N\n6,NULL\n'
ROWS = [(1, ""), (2, None), (3, 'a "q", b'), (4, "line\nbreak"), (5, "\\N"), (6, "NULL")]


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_csv_copy_keeps_null_and_the_empty_string_apart_with_psycopg(start_server, engine,
                                                                      request) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        with c.cursor() as cur:
            with cur.copy("COPY t FROM STDIN (FORMAT csv)") as copy:
                copy.write(SENT)
            assert c.execute("SELECT a, b FROM t ORDER BY a").fetchall() == ROWS

            def out(sql: str) -> bytes:
                with cur.copy(sql) as copy:
                    return b"".join(bytes(b) for b in copy)

            # PostgreSQL's bytes, written by hand from its documented rules
            assert out("COPY (SELECT a, b FROM t ORDER BY a) TO STDOUT CSV") == SENT
            assert out("COPY (SELECT a, b FROM t ORDER BY a) TO STDOUT "
                       "(FORMAT csv, NULL 'NULL', HEADER)") == (
                b'a,b\n1,\n2,NULL\n3,"a ""q"", b"\n4,"line\nbreak"\n5,\\N\n6,"NULL"\n')
            assert out("COPY (SELECT b FROM t ORDER BY a) TO STDOUT CSV") == (
                b'""\n\n"a ""q"", b"\n"line\nbreak"\n\\N\nNULL\n')
            # and what it wrote reads back as the same rows
            c.execute("DELETE FROM t")
            with cur.copy("COPY t FROM STDIN (FORMAT csv, NULL 'NULL', HEADER)") as copy:
                copy.write(b'a,b\n1,\n2,NULL\n3,"a ""q"", b"\n4,"line\nbreak"\n5,\\N\n'
                           b'6,"NULL"\n')
            assert c.execute("SELECT a, b FROM t ORDER BY a").fetchall() == ROWS


def test_text_format_is_written_as_postgresql_writes_it() -> None:
    """PostgreSQL 15's bytes (COPY (SELECT E'\\b\\f\\u000b|\\\\\\t\\n\\r\\u0001x' AS "a<tab>b|",
    'p' AS c) TO STDOUT ...): backspace, form feed and vertical tab as \\b \\f \\v, the
    delimiter after a backslash, other control characters as they are; the header's
    names escaped as values are."""
    value, names = "\b\f\v|\\\t\n\r\x01x", ["a\tb|", "c"]

    def out(options: str) -> bytes:
        st = _copy.parse_copy(f"COPY t TO STDOUT ({options})")
        return b"".join(_copy.encode_rows(st, names, [(value, "p")]))

    assert out("HEADER") == b"a\\tb|\tc\n\\b\\f\\v|\\\\\\t\\n\\r\x01x\tp\n"
    assert out("DELIMITER '|', HEADER") == \
        b"a\\tb\\||c\n\\b\\f\\v\\|\\\\\\t\\n\\r\x01x|p\n"
    assert out("DELIMITER '\x01'") == b"\\b\\f\\v|\\\\\\t\\n\\r\\\x01x\x01p\n"
    assert out("DELIMITER '\v'") == b"\\b\\f\\v|\\\\\\t\\n\\r\x01x\x0bp\n"


@pytest.mark.parametrize("delimiter", ["|", ",", ";", "\x01"])
def test_text_format_reads_back_what_it_writes_with_any_delimiter(delimiter) -> None:
    """A value holding the delimiter is written with it escaped (``a\\|b``), and read
    back whole, as PostgreSQL reads it (the fields split at unescaped delimiters only; a
    backslash before a delimiter that ends a field is itself escaped)."""
    d = delimiter
    rows = [(f"a{d}b", "x"), ("\\", f"{d}"), (f"\\{d}", "\\N"), (None, f"end\\{d}{d}")]
    opts = f"DELIMITER '{d}'"
    out = b"".join(_copy.encode_rows(_copy.parse_copy(f"COPY t TO STDOUT ({opts})"),
                                     ["a", "b"], rows))
    back = _copy.decode_rows(_copy.parse_copy(f"COPY t FROM STDIN ({opts})"), out)
    assert back == [list(r) for r in rows]
    # PostgreSQL 15 read b'1|a\\|b\n2|a<tab>b\n' with DELIMITER '|' as (1, 'a|b'), (2, 'a\tb')
    st = _copy.parse_copy("COPY t FROM STDIN (DELIMITER '|')")
    assert _copy.decode_rows(st, b"1|a\\|b\n2|a\tb\n") == [["1", "a|b"], ["2", "a\tb"]]
