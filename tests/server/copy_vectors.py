"""Regenerates tests/server/copy_vectors.json: each case's bytes sent with psycopg's COPY
... FROM STDIN to a real PostgreSQL 15 (a table of ``columns`` text columns c1, c2, ...),
and what it answered: the rows, or the SQLSTATE and message. The test
(test_copy_vectors.py) reads the file, not a live server.

    PG=\'host=127.0.0.1 port=55442 user=postgres dbname=postgres\' \\
        python tests/server/copy_vectors.py tests/server/copy_vectors.json
"""

from __future__ import annotations

import json
import os
import sys

# (columns, options, data)
CASES = [
 # (columns, options, data)
 (2, "", b"a\tb\n"),
 (2, "", b"a\tb"),
 (2, "", b""),
 (2, "", b"a\tb\\\nc\n"),      # backslash before newline
 (2, "", b"a\tb\\"),           # backslash at end of input
 (2, "", b"a\tb\\\n"),
 (1, "", b"\\777\n"),
 (1, "", b"\\400\n"),
 (1, "", b"\\303\\251\n"),
 (1, "", b"\\x41\\xe9\n"),
 (1, "", b"\\0\n"),
 (1, "", b"a\\0b\n"),
 (1, "", b"a\rb\n"),
 (1, "", b"a\r\nb\r\n"),
 (1, "", b"a\rb\r"),
 (1, "", b"a\r\nb\n"),
 (1, "", b"a\nb\r\n"),
 (1, "", b"a\rb\n"),
 (1, "", b"a\n\\.\nb\n"),
 (1, "", b"a\n\\."),
 (1, "", b"a\nx\\.\nb\n"),
 (1, "", b"a\n\\.x\nb\n"),
 (1, "", b"a\r\n\\.\nb\n"),
 (1, "", b"a\r\n\\.\r\n"),
 (1, "", b"a\n\\\\.\n"),
 (1, "", b"\\N\n"),
 (1, "", b"\\\\N\n"),
 (1, "", b"\\q\n"),
 (1, "", b"\\x\n"),
 (1, "", b"\\xg\n"),
 (2, "", b"a\\\tb\n"),
 (2, "", b"a\n"),
 (2, "", b"a\tb\tc\n"),
 (1, "", b"\n"),
 (1, "(HEADER)", b"h\na\n"),
 (1, "(HEADER MATCH)", b"c1\na\n"),
 (1, "(HEADER MATCH)", b"x\na\n"),
 (2, "(HEADER MATCH)", b"c1\na\tb\n"),
 (2, "(HEADER MATCH)", b"c1\tc2\tc3\na\tb\n"),
 (1, "(HEADER MATCH)", b"\\N\na\n"),
 (1, "(HEADER MATCH)", b""),
 (2, "(FORMAT csv, HEADER MATCH)", b"c1,c2\na,b\n"),
 (2, "(FORMAT csv, HEADER MATCH)", b"\"c1\",c2\na,b\n"),
 (2, "(FORMAT csv, HEADER MATCH)", b"c2,c1\na,b\n"),
 (2, "(FORMAT csv, HEADER MATCH)", b",c2\na,b\n"),
 (1, "(FORMAT csv)", b"a\n\\.\nb\n"),
 (1, "(FORMAT csv)", b"a\n\"\\.\"\nb\n"),
 (1, "(FORMAT csv)", b"a\n\\."),
 (1, "(FORMAT csv)", b"a\n\\.x\n"),
 (1, "(FORMAT csv)", b"\"a\n\\.\nb\"\n"),
 (2, "(FORMAT csv)", b"\\.,x\n"),
 (1, "(FORMAT csv, NULL '\\.')", b"a\n\\.\nb\n"),
 (1, "(FORMAT csv, NULL '\\.')", b"\"\\.\"\n"),
 (2, "(FORMAT csv, NULL '\\.')", b"\\.,\\.\n"),
 (1, "(FORMAT csv)", b"a\rb\n"),
 (1, "(FORMAT csv)", b"\"a\rb\"\n"),
 (1, "(FORMAT csv)", b"a\r\nb\r\n"),
 (1, "(FORMAT csv)", b"a\rb\r"),
 (1, "(FORMAT csv)", b"a\r\nb\n"),
 (1, "(FORMAT csv)", b"a\r\n\\.\n"),
 (1, "(FORMAT csv)", b"a"),
 (1, "(FORMAT csv)", b""),
 (1, "(FORMAT csv)", b"\n"),
 (1, "(FORMAT csv)", b"\"\"\n"),
 (1, "(FORMAT csv)", b"\"abc\n"),
 (1, "(FORMAT csv)", b"a\"b\"c\n"),
 (1, "(FORMAT csv)", b"\"a\"b\n"),
 (2, "(FORMAT csv, FORCE_NOT_NULL (c1))", b",\n\"\",\n"),
 (2, "(FORMAT csv, FORCE_NULL (c1))", b",\n\"\",\n"),
 (2, "(FORMAT csv, FORCE_NULL (c1, c2), NULL 'x')", b"x,\"x\"\n\"\",\n"),
 (2, "(FORMAT csv, FORCE_NOT_NULL (c1, c2), NULL 'x')", b"x,\"x\"\n\"\",\n"),
 (2, "(FORMAT csv, FORCE_NOT_NULL *)", b",\n"),
 (2, "(FORMAT csv, FORCE_NULL *)", b",\"\"\n"),
 (2, "(FORMAT csv, FORCE_NULL (c3))", b",\n"),
 (2, "(FORCE_NULL (c1))", b"a\tb\n"),
 (2, "(FORMAT csv, FORCE_NOT_NULL (c1), FORCE_NULL (c1))", b",\n"),
 (1, "(FORMAT csv)", b"a\x00b\n"),
 (1, "", b"a\x00b\n"),
 (1, "", b"\xff\n"),
 (1, "", b"\\xff\n"),
 (2, "", b"\\N\t\\N\n"),
 (1, "", b"\\\n\n"),
 (1, "", b"a\\\rb\n"),

 (1, "", b"a\r"),
 (1, "(FORMAT csv)", b"a\r"),
 (1, "", b"a\r\n\\.\r"),
 (1, "", b"a\n\\.\r"),
 (1, "", b"\\.\n"),
 (1, "", b"\\.\r\nb"),
 (1, "(FORMAT csv)", b"a\n\\.\r\n"),
 (1, "(FORMAT csv)", b"a\r\n\\.\r"),
 (1, "(FORMAT csv)", b"a\n\\.\r"),
 (2, "(FORMAT csv, FORCE_NULL (c1))", b"\"\",a\n"),
 (1, "", b"\\xe9a\n"),
 (1, "", b"\xe9a\n"),
 (1, "(HEADER true)", b"x\n"),
 (1, "(FORMAT csv, HEADER MATCH)", b"C1\n"),
 (1, "(FORMAT csv, HEADER MATCH)", b"\n"),
 (1, "(FORMAT csv, HEADER MATCH)", b""),
 (2, "(FORMAT csv, QUOTE '''', ESCAPE '\\')", b"'it\\'s','a\\\\b'\r\n'x\ny',\r\n"),
 (2, "(FORMAT csv, DELIMITER ';', NULL 'NULL')", b"NULL;\"NULL\"\n;\n"),
 (2, "", b"\\N\t\\\\N\n\\\\\t\\t\n"),
 (1, "", b"a\\"),
 (1, "", b"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\n"),
 (1, "", b"\\101\\1010\\x414\n"),
 (1, "(FORMAT csv)", b"\"a\"\"b\"\n\"\"\"\"\n"),
 (2, "(DELIMITER '|')", b"a\\|b|c\n"),
 (1, "(FORMAT csv)", b"\"a\r\n\"\r\n"),
 (1, "(FORMAT csv)", b"\"a\n\"\r\n"),
]


def main(path: str) -> None:
    import psycopg

    con = psycopg.connect(os.environ["PG"], autocommit=True, prepare_threshold=None)
    out = []
    for columns, options, data in CASES:
        cur = con.cursor()
        cur.execute("DROP TABLE IF EXISTS t")
        cur.execute("CREATE TABLE t (" + ", ".join(f"c{i + 1} text" for i in range(columns))
                    + ")")
        try:
            with cur.copy(f"COPY t FROM STDIN {options}") as copy:
                copy.write(data)
            cur.execute("SELECT * FROM t", prepare=False)
            answer: dict[str, object] = {"rows": [list(r) for r in cur.fetchall()]}
        except psycopg.Error as exc:
            answer = {"sqlstate": exc.sqlstate, "message": exc.diag.message_primary}
        out.append({"columns": columns, "options": options, "data": data.decode("latin-1"),
                    **answer})
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
