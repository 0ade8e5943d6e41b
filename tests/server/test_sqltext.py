"""The server's SQL lexing: statements, parameters, and what strings and comments hide."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest

from cryptdisk.errors import ServerError
from cryptdisk.server import _sqltext
from cryptdisk.server._sqltext import (
    first_words,
    placeholders,
    split_statements,
    substitute,
)


def test_split_respects_strings_comments_and_triggers() -> None:
    sql = ("SELECT ';' AS a; -- ; comment\nSELECT \"x;y\" FROM t /* ; */;"
           "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1); "
           "DELETE FROM v; END; SELECT $$;$$;;")
    assert split_statements(sql) == [
        "SELECT ';' AS a", "-- ; comment\nSELECT \"x;y\" FROM t /* ; */",
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1); "
        "DELETE FROM v; END", "SELECT $$;$$"]
    assert split_statements(" ; -- nothing\n ;") == []


def test_parameters_outside_strings_only() -> None:
    sql = "SELECT $1, '$2', \"$3\", E'\\'$4', $tag$ $5 $tag$, a$6, $2 -- $7"
    assert placeholders(sql) == 2
    assert substitute(sql, lambda n: f"<{n}>") == \
        "SELECT <1>, '$2', \"$3\", E'\\'$4', $tag$ $5 $tag$, a$6, <2> -- $7"


@pytest.mark.parametrize("bad", ["SELECT 'open", 'SELECT "open', "SELECT /* open",
                                 "SELECT $x$ open"])
def test_unterminated(bad: str) -> None:
    with pytest.raises(ServerError):
        split_statements(bad)


def test_replace_words_only_bare_words() -> None:
    sql = ("SELECT current_user, \"current_user\", 'current_user', t.current_user -- current_user\n"
           "/* current_user */ , $$current_user$$, CURRENT_USER, xcurrent_user FROM t")
    out = _sqltext.replace_words(sql, lambda w: "'u'" if w.lower() == "current_user" else None)
    assert out == ("SELECT 'u', \"current_user\", 'current_user', t.current_user -- current_user\n"
                   "/* current_user */ , $$current_user$$, 'u', xcurrent_user FROM t")


def test_strip_strings() -> None:
    assert _sqltext.strip_strings("GRANT r TO \"on\" -- ON\n") == "GRANT r TO      " + " " * 6


@pytest.mark.parametrize("sql", [
    "SELECT 1;", "  ;  ", "", "SELECT 1 ;  \n", "UPDATE a SET b = b + -5 WHERE c = 3;",
    "SELECT 1; SELECT 2", "select 'a;b';", "SELECT 1 -- c\n;", "SELECT /* x */ 1;",
    "CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1;", "SELECT $1;", "END;",
    "SELECT a/b FROM t;", ";;", "SELECT 1;;", "\t\n", "select -1 - -2;", "select 1 -",
])
def test_split_statements_fast_path_agrees_with_the_scan(sql, monkeypatch) -> None:
    fast = split_statements(sql)
    monkeypatch.setattr(_sqltext, "_single_statement", lambda _sql: None)
    assert fast == split_statements(sql)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.text(alphabet="SELECTfromab_ \t\n(1;-*/'", max_size=30))
def test_first_words_fast_path_agrees_with_the_scan(sql: str) -> None:
    from cryptdisk.server._sqltext import _ALPHA, _strip_comments

    words = [m.group().upper() for m in _ALPHA.finditer(_strip_comments(sql))]
    assert first_words(sql, 2) == words[:2]
    assert first_words(sql, 1) == words[:1]
