"""The session functions and settings drivers and ORMs ask for when they connect.

SQLAlchemy runs ``select pg_catalog.version()``, ``select current_schema()``, ``show
standard_conforming_strings`` and ``show transaction isolation level`` on its first
connection; JDBC drivers and BI tools ask for ``current_database()``, ``SHOW search_path``
and the like. Neither engine knows them (SQLite has no ``SHOW``; DuckDB's ``version()`` is
its own), so the server answers them itself, as PostgreSQL 15 would for this session:
``SELECT`` of one or more of the functions below (no ``FROM``, optional aliases), and
``SHOW name`` of the settings below; ``SET`` / ``RESET`` of the settings clients set
(``application_name``, ``extra_float_digits``, ...; those the server has one value of
only to that value) and of a transaction's characteristics (its access mode kept:
``READ ONLY`` makes writes fail with 25006; its isolation level ignored, as ``BEGIN``'s
is). Anything else goes to the engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .. import __version__
from ._engines import Result, StatementError
from ._protocol import parameter_status
from ._types import INT4, TEXT

__all__ = ["answer", "answers", "columns", "engine_resets", "names_time_zone",
           "parse_message_level", "resets_time_zone", "sets_global_time_zone"]

#: function -> (result type, value for the session)
_FUNCTIONS: dict[str, tuple[int, Callable[[Any], Any]]] = {
    "version": (TEXT, lambda s: f"PostgreSQL 15.0 (cryptdisk {__version__})"),
    "current_schema": (TEXT, lambda s: "public"),
    "current_database": (TEXT, lambda s: s.database),
    "current_catalog": (TEXT, lambda s: s.database),
    "pg_backend_pid": (INT4, lambda s: s.pid),
}
_ITEM = re.compile(r"\s*(?:pg_catalog\s*\.\s*)?([A-Za-z_]+)\s*\(\s*\)"
                   r"(?:\s+(?:AS\s+)?(\"(?:[^\"]|\"\")+\"|[A-Za-z_][A-Za-z0-9_]*))?\s*", re.I)
#: current_setting('name' [, missing_ok]) of a setting SHOW answers (JDBC tools and
#: ORMs read server_version_num so)
_CURRENT_SETTING = re.compile(
    r"\s*(?:pg_catalog\s*\.\s*)?current_setting\s*\(\s*'([A-Za-z_]+)'\s*"
    r"(?:,\s*(?:true|false)\s*)?\)(?:\s*::\s*(integer|int|int4|bigint|int8|text))?"
    r"(?:\s+(?:AS\s+)?(\"(?:[^\"]|\"\")+\"|[A-Za-z_][A-Za-z0-9_]*))?\s*", re.I)
_SELECT = re.compile(r"\s*SELECT\s+(.*?)\s*;?\s*", re.I | re.S)
_SHOW = re.compile(r"\s*SHOW\s+([A-Za-z_][A-Za-z0-9_]*(?:\s+[A-Za-z_]+)*)\s*;?\s*", re.I)


#: The settings ``SHOW`` answers that are the same for every session, by lower-case name.
_FIXED = {
    "server_version": "15.0", "server_version_num": "150000",
    "server_encoding": "UTF8", "client_encoding": "UTF8", "datestyle": "ISO, MDY",
    "bytea_output": "hex",
    "intervalstyle": "postgres", "integer_datetimes": "on",
    "standard_conforming_strings": "on", "search_path": '"$user", public',
    "max_identifier_length": "63", "lc_collate": "C", "lc_ctype": "C",
}


def _isolation(session: Any) -> str:
    # SQLite's transactions are serializable; the analytical engine's queries see
    # every statement committed before they start, as PostgreSQL's default
    return "serializable" if session.server.engine.transactions else "read committed"


def _timeout(session: Any) -> str:
    """As PostgreSQL shows a time: in the largest unit that holds it whole (``5s``)."""
    ms = round((session.statement_timeout() or 0) * 1000)
    if not ms:
        return "0"
    unit = next(u for u, n in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000),
                               ("s", 1000), ("ms", 1)) if ms % n == 0)
    return f"{ms // _UNIT_MS[unit]}{unit}"


_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "min": 60_000, "s": 1000, "ms": 1}
#: the settings a client may SET to any (valid) value, and their defaults
_SESSION_DEFAULTS = {"extra_float_digits": "1", "client_min_messages": "notice"}
_MESSAGE_LEVELS = ("debug5", "debug4", "debug3", "debug2", "debug1", "debug", "log",
                   "info", "notice", "warning", "error")  # (info, debug: PostgreSQL's hidden)


_UNITS = {"": 0.001, "ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_timeout(value: str) -> float:
    """A statement_timeout setting as seconds (PostgreSQL's: milliseconds, or a number
    with a unit, ``'5s'``; 0 or DEFAULT: the server's)."""
    text = _unquote(value).strip().lower()
    if text in ("default", ""):
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h|d|)", text)
    if m is None:
        raise StatementError(f'invalid value for parameter "statement_timeout": "{text}"',
                             "22023", hint='valid units for this parameter are "ms", "s", '
                             '"min", "h", and "d"')
    return float(m[1]) * _UNITS[m[2]]


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", re.I)


def parse_extra_float_digits(value: str) -> int:
    """An extra_float_digits setting (-15 .. 3; a fraction rounded, DEFAULT: 1) as
    PostgreSQL reads it; its errors as PostgreSQL words them (22023)."""
    text = _unquote(value).strip()
    if text.lower() in ("default", ""):
        return 1
    number = float(text) if _NUMBER.fullmatch(text) else math.nan
    if not math.isfinite(number):
        raise StatementError(f'invalid value for parameter "extra_float_digits": "{text}"',
                             "22023")
    digits = round(number)  # (to even, as PostgreSQL's rint)
    if not -15 <= digits <= 3:
        raise StatementError(f'{digits} is outside the valid range for parameter '
                             f'"extra_float_digits" (-15 .. 3)', "22023")
    return digits


def _constant(value: str) -> Callable[[Any], str]:
    return lambda _session: value


def _session_setting(name: str, default: str) -> Callable[[Any], str]:
    """A setting the session holds once SET (``session.settings``)."""
    return lambda session: str(session.settings.get(name, default))


#: Every setting ``SHOW`` answers, by lower-case name: its value for a session.
_SETTINGS: dict[str, Callable[[Any], str]] = {
    **{name: _constant(value) for name, value in _FIXED.items()},
    "transaction_isolation": _isolation,
    "default_transaction_isolation": _isolation,
    "statement_timeout": _timeout,
    "timezone": lambda session: session.settings.get("timezone", session.time_zone),
    "application_name": lambda session: session.application_name,
    **{name: _session_setting(name, default) for name, default in
       [*_SESSION_DEFAULTS.items(), ("search_path", _FIXED["search_path"])]},
    "is_superuser": lambda session: "on" if session.server.is_admin(session.user) else "off",
    "session_authorization": lambda session: session.user,
    "transaction_read_only": lambda session: "on" if session.read_only_block()
    or session.read_only() else "off",
    "default_transaction_read_only": lambda session: "on" if session.read_only_default
    else "off",
}


#: the column a SHOW names, where PostgreSQL's name of the setting has capitals
_SHOWN = {"timezone": "TimeZone", "datestyle": "DateStyle", "intervalstyle": "IntervalStyle"}


def _parse(sql: str) -> str | list[tuple[str, str]] | None:
    """The setting a ``SHOW`` names, or the (function, column name) a ``SELECT`` calls;
    None when ``sql`` is neither (see the module)."""
    head = sql.lstrip()[:4].upper()
    if head == "SHOW":
        m = _SHOW.fullmatch(sql)
        if m is None:
            return None
        name = " ".join(m[1].lower().split())
        name = {"transaction isolation level": "transaction_isolation",
                "time zone": "timezone"}.get(name, name)
        return name if name in _SETTINGS else f"?{name}"
    if head != "SELE" or "(" not in sql:
        return None
    m = _SELECT.fullmatch(sql)
    if m is None:
        return None
    calls = []
    for item in _items(m[1]):
        setting = _CURRENT_SETTING.fullmatch(item)
        if setting is not None and setting[1].lower() in _SETTINGS:
            alias = setting[3]
            if alias is not None:
                alias = alias[1:-1].replace('""', '"') if alias.startswith('"') \
                    else alias.lower()
            cast = ":int" if setting[2] and setting[2].lower() != "text" else ""
            calls.append((f"current_setting:{setting[1].lower()}{cast}",
                          alias or "current_setting"))
            continue
        call = _ITEM.fullmatch(item)
        if call is None or call[1].lower() not in _FUNCTIONS:
            return None
        alias = call[2]
        if alias is not None:
            alias = alias[1:-1].replace('""', '"') if alias.startswith('"') else alias.lower()
        calls.append((call[1].lower(), alias or call[1].lower()))
    return calls


_SET = re.compile(r"\s*SET\s+(?:SESSION\s+|LOCAL\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:=|\bTO\b)"
                  r"\s*(.*?)\s*;?\s*", re.I | re.S)
_SET_TIME_ZONE = re.compile(r"\s*SET\s+(?:SESSION\s+|LOCAL\s+)?TIME\s+ZONE\s+(.*?)\s*;?\s*",
                            re.I | re.S)
_LOCAL = re.compile(r"\s*SET\s+LOCAL\b", re.I)
_RESET = re.compile(r"\s*RESET\s+([A-Za-z_][A-Za-z0-9_]*)\s*;?\s*", re.I)
#: SET SESSION CHARACTERISTICS AS TRANSACTION ... / SET TRANSACTION ...: a transaction's
#: options (SQLAlchemy's isolation_level and postgresql_readonly on pg8000 send it): READ
#: ONLY / READ WRITE kept, the isolation level ignored as BEGIN's is
_SET_TRANSACTION = re.compile(r"\s*SET\s+(?:SESSION\s+CHARACTERISTICS\s+AS\s+)?TRANSACTION\s+"
                              r"(?:ISOLATION\s+LEVEL\s+(?:SERIALIZABLE|REPEATABLE\s+READ|READ\s+"
                              r"COMMITTED|READ\s+UNCOMMITTED)|READ\s+(?:ONLY|WRITE)|(?:NOT\s+)?"
                              r"DEFERRABLE|[\s,])+;?\s*", re.I)
#: settings a client may SET to any value; the session keeps application_name and
#: statement_timeout
_ACCESS_MODE = re.compile(r"\bREAD\s+(ONLY|WRITE)\b", re.I)
_FREE = frozenset({"application_name", "extra_float_digits", "client_min_messages",
                   "statement_timeout"})
#: the access mode of the session's transactions, and of the one in progress
_MODES = frozenset({"default_transaction_read_only", "transaction_read_only"})
_ON = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False,
       "no": False, "0": False}
#: settings a client may SET (or RESET) on every engine only to the value the server has:
#: the value's words, as a set, against the ones allowed (DuckDB knows none of these)
_ONLY = {"bytea_output": ("hex", {"hex"}), "client_encoding": ("UTF8", {"utf8"}),
         "datestyle": ("ISO, MDY", {"iso", "mdy"}), "intervalstyle": ("postgres", {"postgres"}),
         "standard_conforming_strings": ("on", {"on", "true", "1"})}
#: on SQLite, which has no SET, also these (on the analytical engine DuckDB's SET takes them)
_ONLY_SQLITE = {"timezone": ("UTC", {"utc", "gmt", "etc/utc", "z", "zulu", "0", "00:00"}),
                "search_path": ('"$user", public', {"$user", "public"})}
_CHECKED = {**_ONLY, **_ONLY_SQLITE}
#: the values PostgreSQL takes for those of its settings that are lists of names: another
#: is 22023 there, as here (one of these but the server's: 0A000)
_ENUMS = {"intervalstyle": ("postgres", "postgres_verbose", "sql_standard", "iso_8601"),
          "bytea_output": ("escape", "hex")}
_VALUE_WORD = re.compile(r"'((?:[^']|'')*)'|\"((?:[^\"]|\"\")*)\"|([^,\s]+)")
_ALIASES = {"utf-8": "utf8", "unicode": "utf8", "+00:00": "utc", "etc/gmt": "utc"}
#: the name PostgreSQL 15 shows (SHOW, ParameterStatus) for each UTC zone SQLite's
#: sessions take, by the name SET gave (another is shown as given: 00:00, +00:00)
_UTC_NAMES = {"utc": "UTC", "gmt": "GMT", "etc/utc": "Etc/UTC", "etc/gmt": "Etc/GMT",
              "z": "Etc/UTC", "zulu": "Zulu", "0": "<+00>-00"}


def _setting(sql: str, sqlite: bool) -> tuple[str, str | None] | None:
    """(name, value; None: RESET) of a SET or RESET the server answers itself."""
    head = sql.lstrip()[:5].upper()
    if head.startswith("RESET"):
        m = _RESET.fullmatch(sql)
        name = m[1].lower() if m else ""
        known = _FREE | _MODES | set(_ONLY) | (set(_ONLY_SQLITE) if sqlite else set())
        return (name, None) if name == "all" or name in known else None
    if not head.startswith("SET"):
        return None
    if _SET_TRANSACTION.fullmatch(sql):
        return ("transaction", sql)
    m = _SET_TIME_ZONE.fullmatch(sql)
    if m is not None:
        return ("timezone", m[1]) if sqlite else None
    m = _SET.fullmatch(sql)
    if m is None:
        return None
    name = m[1].lower()
    if name in _FREE or name in _MODES or name in _ONLY or (sqlite and name in _ONLY_SQLITE):
        return name, m[2]
    if name == "search_path" and _public_path(m[2]):  # (DuckDB's SET takes the others)
        return name, m[2]
    return None


_TIME_ZONE = re.compile(r"(?:\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/))*"  # (comments before it)
                        r"\s*(?:SET\s+(?:SESSION\s+|LOCAL\s+)?(?:TIME\s+ZONE\b|"
                        r"\"?TimeZone\"?\s*(?:=|\bTO\b))|RESET\s+(?:\"?TimeZone\"?|ALL)\s*;?\s*$)",
                        re.I | re.S)


_GLOBAL_TIME_ZONE = re.compile(r"(?:\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/))*\s*(?:SET|RESET)\s+"
                               r"GLOBAL\s+(?:TIME\s+ZONE\b|\"?TimeZone\"?(?!\w))",
                               re.I | re.S)


def sets_global_time_zone(sql: str) -> bool:
    """Whether ``sql`` is DuckDB's ``SET GLOBAL TimeZone`` (or its ``RESET``), which the
    server refuses: it would change the zone of the sessions that set none, while each
    reports its own (``SHOW``, ``current_setting``, its ParameterStatus)."""
    return _GLOBAL_TIME_ZONE.match(sql) is not None


def names_time_zone(sql: str) -> bool:
    """Whether ``sql`` is a ``SET`` or ``RESET`` of ``TimeZone`` (``SET TIME ZONE``,
    ``RESET ALL``): the session's zone may have changed."""
    return _TIME_ZONE.match(sql) is not None


_RESET_TIME_ZONE = re.compile(r"(?:\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/))*\s*(?:RESET\s+(?:\"?TimeZone"
                              r"\"?|ALL)|SET\s+(?:SESSION\s+)?(?:TIME\s+ZONE\s+(?:DEFAULT|LOCAL)|"
                              r"\"?TimeZone\"?\s*(?:=|\bTO\b)\s*DEFAULT))\s*;?\s*$", re.I | re.S)


def resets_time_zone(sql: str) -> bool:
    """Whether ``sql`` sets ``TimeZone`` back to the session's default (``RESET``,
    ``RESET ALL``, ``SET TimeZone TO DEFAULT``, ``SET TIME ZONE LOCAL``)."""
    return _RESET_TIME_ZONE.match(sql) is not None


def _public_path(value: str) -> bool:
    """Whether a search_path is PostgreSQL's default one's schema (``public``,
    ``"$user", public``), which is the analytical engine's own (DuckDB's ``main``)."""
    words = set()
    for m in _VALUE_WORD.finditer(value):
        text = m[1].replace("''", "'") if m[1] is not None else \
            m[2].replace('""', '"') if m[2] is not None else m[3]
        words |= {w for w in re.split(r"[,\s]+", text.lower()) if w}
    return "public" in words and words <= {"$user", "public"}


def engine_resets(sql: str) -> list[str]:
    """On the analytical engine, the DuckDB settings (run on the session's reader) that a
    ``SET search_path`` to ``public`` or ``RESET ALL`` resets as well, beside the server's."""
    setting = _setting(sql, False)
    if setting is None or setting[0] not in ("search_path", "all"):
        return []
    return ["RESET search_path"] + (["RESET TimeZone"] if setting[0] == "all" else [])


def _shown_path(value: str) -> str:
    """A search_path as PostgreSQL shows it: ``public``, ``"$user", public``."""
    items = []
    for item in _items(value):
        item = item.strip()
        if item.startswith("'"):
            item = _unquote(item)
        elif not item.startswith('"'):
            item = item.lower()
        items.append(item)
    return ", ".join(items)


def _session_value(name: str, text: str) -> str:
    """``text`` as PostgreSQL keeps it for ``name`` (22023 for a value it refuses)."""
    if name == "extra_float_digits":  # (how floats are written in text: see _textout)
        return str(parse_extra_float_digits(text))
    level = text.lower()
    if level not in _MESSAGE_LEVELS:
        raise StatementError(f'invalid value for parameter "{name}": "{text}"', "22023")
    return "debug2" if level == "debug" else level


def parse_message_level(text: str) -> str:
    """A client_min_messages setting as PostgreSQL keeps it (22023 for a level it
    refuses)."""
    return _session_value("client_min_messages", text.strip())


def _unquote(value: str) -> str:
    value = value.strip()
    if value.startswith("'") and value.endswith("'") and len(value) > 1:
        return value[1:-1].replace("''", "'")
    return value


def _set(name: str, value: str | None, session: Any) -> Result:
    if value is not None and re.fullmatch(r"\s*\$\d+\s*", value):
        raise StatementError(f'syntax error at or near "{value.strip()}"', "42601",
                             hint="SET takes a value, not a parameter (as in PostgreSQL)")
    if name == "transaction":  # SET [SESSION CHARACTERISTICS AS] TRANSACTION ...
        mode = _ACCESS_MODE.search(value or "")
        if re.match(r"\s*SET\s+SESSION\b", value or "", re.I):
            if mode is not None:
                session.read_only_default = mode[1].upper() == "ONLY"
        elif not session.in_block():  # (as PostgreSQL: a warning, and nothing changes)
            session.warn("SET TRANSACTION can only be used in transaction blocks", "25P01")
        elif mode is not None:
            session.block_read_only = mode[1].upper() == "ONLY"
        return Result(None, [], "SET")
    session.keep_settings()  # (a rollback undoes it)
    if name in _MODES:
        text = "" if value is None else _unquote(value).strip().lower()
        on = False if text in ("", "default") else _ON.get(text)
        if on is None:
            raise StatementError(f'parameter "{name}" requires a Boolean value', "22023")
        if name == "default_transaction_read_only":
            session.read_only_default = on
        elif session.in_block():
            session.block_read_only = on
        return Result(None, [], "RESET" if value is None else "SET")
    if name == "all":  # (RESET ALL: the access mode of later transactions too)
        session.read_only_default = False
    # RESET, SET ... TO DEFAULT: the session's default, what the client gave at startup
    default = value is None or value.strip().lower() == "default"
    given = "" if value is None else value
    start: tuple[str, dict[str, str], float] = getattr(session, "startup_settings",
                                                       ("", {}, 0.0))
    start_name, start_settings, start_timeout = start
    if name in _SESSION_DEFAULTS or name == "all":
        if not default:
            session.settings[name] = _session_value(name, _unquote(given).strip())
        elif name == "all":
            session.settings.clear()
            session.settings.update(start_settings)
        elif name in start_settings:
            session.settings[name] = start_settings[name]
        else:
            session.settings.pop(name, None)
    if name in ("statement_timeout", "all"):  # (shorter than the server's: see Session)
        session.session_timeout = start_timeout if default else parse_timeout(given)
    if name in ("search_path", "all"):
        if value is None or value.strip().lower() == "default":
            session.settings.pop("search_path", None)
        elif _public_path(value):  # (another is refused below, on SQLite)
            session.settings["search_path"] = _shown_path(value)
    if name in ("application_name", "all"):
        text = start_name if default else _unquote(given)
        session.application_name = text[:63]  # (PostgreSQL's NAMEDATALEN - 1)
        session.send(parameter_status("application_name", session.application_name))
    elif name in _CHECKED and value is not None and value.strip().lower() != "default":
        if name in _ENUMS:
            _check_enum(name, value)
        shown, allowed = _CHECKED[name]
        words = set()
        for m in _VALUE_WORD.finditer(value):
            text = m[1].replace("''", "'") if m[1] is not None else \
                m[2].replace('""', '"') if m[2] is not None else m[3]
            words |= {_ALIASES.get(w, w) for w in re.split(r"[,\s]+", text.lower()) if w}
        if not words or not words <= allowed or (name == "search_path" and "public" not in words):
            raise StatementError(f"SET {name}: the server's sessions have {name} {shown!r} "
                                 "only", "0A000")
        if name == "timezone":  # (SQLite's: UTC, under the name PostgreSQL shows for it)
            text = _unquote(value).strip()
            _shown_zone(session, _UTC_NAMES.get(text.lower(), text))
    elif name == "timezone" and "timezone" in session.settings:
        _shown_zone(session, session.time_zone)  # (RESET: UTC, as the session started)
    return Result(None, [], "RESET" if value is None else "SET")


def _shown_zone(session: Any, zone: str) -> None:
    """The SQLite session's ``TimeZone`` is shown as ``zone`` (reported to the client in a
    ParameterStatus when it changes, as PostgreSQL reports it)."""
    if zone != session.settings.get("timezone", session.time_zone):
        session.send(parameter_status("TimeZone", zone))
    if zone == session.time_zone:
        session.settings.pop("timezone", None)
    else:
        session.settings["timezone"] = zone


def _check_enum(name: str, value: str) -> None:
    """22023 for a value of ``name`` (one of :data:`_ENUMS`) PostgreSQL does not take."""
    items = [m[1].replace("''", "'") if m[1] is not None else
             m[2].replace('""', '"') if m[2] is not None else m[3]
             for m in _VALUE_WORD.finditer(value)]
    if len(items) != 1:
        raise StatementError(f"SET {name} takes only one argument", "22023")
    if items[0].lower() not in _ENUMS[name]:
        raise StatementError(f'invalid value for parameter "{name}": "{items[0]}"', "22023",
                             hint=f"Available values: {', '.join(_ENUMS[name])}.")


def answers(sql: str, sqlite: bool = False) -> bool:
    """Whether :func:`answer` answers ``sql`` (the text alone decides it)."""
    parsed = _parse(sql)
    if isinstance(parsed, str) and parsed.startswith("?"):
        return sqlite
    return parsed is not None or _setting(sql, sqlite) is not None


def columns(sql: str, session: Any) -> list[tuple[str, int]] | None:
    """The columns :func:`answer` gives ``sql`` (a Describe; a SET is not applied)."""
    parsed = _parse(sql)
    if parsed is None or (isinstance(parsed, str) and parsed.startswith("?")):
        return None
    result = answer(sql, session)
    return result.columns if result is not None else None


def answer(sql: str, session: Any) -> Result | None:
    """``sql`` answered for ``session`` (see the module), or None when it is none of these."""
    parsed = _parse(sql)
    sqlite = bool(session.server.engine.transactions)
    if parsed is None:
        setting = _setting(sql, sqlite)
        if setting is None and sqlite:  # (SQLite has no SET; DuckDB's takes its own)
            m = _SET.fullmatch(sql)
            if m is not None and m[1].lower() not in ("role", "session_authorization"):
                raise _unrecognized(m[1].lower())
        if setting is None and not sqlite and _LOCAL.match(sql) and names_time_zone(sql) \
                and not session.in_block():  # (DuckDB has no SET LOCAL: 0A000 there)
            session.warn("SET LOCAL can only be used in transaction blocks", "25P01")
            return Result(None, [], "SET")  # (as PostgreSQL: a warning, and nothing changes)
        if setting is None:
            return None
        if _LOCAL.match(sql) and setting[0] != "transaction":
            if not session.in_block():  # (as PostgreSQL: a warning, and nothing changes)
                session.warn("SET LOCAL can only be used in transaction blocks", "25P01")
                return Result(None, [], "SET")
            session.keep_local(setting[0])
        else:
            session.drop_local(setting[0])
        return _set(*setting, session)
    if isinstance(parsed, str) and parsed.startswith("?"):  # a setting SHOW does not know
        if sqlite:  # (DuckDB's SHOW names a table, or its own settings)
            raise _unrecognized(parsed[1:])
        return None
    if isinstance(parsed, str):
        value = _SETTINGS[parsed](session)
        return Result([(_SHOWN.get(parsed, parsed), TEXT)], [(value,)], "SHOW")
    columns = [(name, _call(function)[0]) for function, name in parsed]
    values = tuple(_call(function)[1](session) for function, _ in parsed)
    return Result(columns, [values], "SELECT 1")


def _unrecognized(name: str) -> StatementError:
    return StatementError(f'unrecognized configuration parameter "{name}"', "42704")


def _call(function: str) -> tuple[int, Callable[[Any], Any]]:
    """The type and the value of one select item :func:`_parse` found."""
    if not function.startswith("current_setting:"):
        return _FUNCTIONS[function]
    name, _, cast = function.removeprefix("current_setting:").partition(":")
    if cast:  # current_setting('server_version_num')::integer
        def number(session: Any) -> int:
            value = _SETTINGS[name](session)
            try:
                return int(value)
            except ValueError:
                raise StatementError(f'invalid input syntax for type integer: "{value}"',
                                     "22P02") from None

        return INT4, number
    return TEXT, _SETTINGS[name]


def _items(text: str) -> list[str]:
    """A select list's items: split at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items
