"""cryptdisk protect: load CSV or Parquet with named columns encrypted, tokenized or masked."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import FieldError

__all__ = ["register"]

_EPILOG = """rules: COLUMN=FUNCTION:KEY[,option=value...], KEY a [fields.keys.NAME] of the config:
  pan=tokenize:cards,keep_first=6,keep_last=4,luhn=true
  ssn=fpe_encrypt:ids[,alphabet=digits|alnum|...][,version=N]
  email=encrypt_deterministic:emails   notes=encrypt:notes   user=mask_hash:ids
  phone=mask_last4   name=mask_full   mail=mask_email   comment=mask_null
fpe_encrypt, tokenize and mask_hash take version=N (a key id), required when the key has
several.
encrypt and encrypt_deterministic write base64 text, or bytes with --ciphertexts binary
(Parquet output, or --into a BLOB column: there the column's type decides).
"""


def cmd_protect(args: argparse.Namespace) -> int:
    from ..fields import FieldKeys, parse_rule, protect_file, protect_insert

    rules = [parse_rule(text) for text in args.rule]
    keys = FieldKeys.from_config(args.config)
    if args.into is not None:
        from ..db import connect

        db_path, _, table = args.into.rpartition(":")
        if not db_path or not table:
            raise FieldError(f"--into {args.into!r}: give DATABASE:TABLE")
        if args.output is not None:
            raise FieldError("give an output file or --into DATABASE:TABLE, not both")
        with connect(db_path, args.config) as db:
            rows = protect_insert(db, table, args.input, rules, keys,
                                  input_format=args.input_format,
                                  ciphertexts=args.ciphertexts)
        print(f"cryptdisk: inserted {rows} rows into {table} of {db_path} with "
              f"{', '.join(r.column for r in rules)} protected", file=sys.stderr)
        return 0
    if args.output is None:
        raise FieldError("give an output file, or --into DATABASE:TABLE")
    if args.output == "-":
        raise FieldError("protect writes a file, not stdout (-): its output is written "
                         "whole, then renamed into place", hint="give an output file")
    summary = protect_file(args.input, args.output, rules, keys,
                           input_format=args.input_format, output_format=args.output_format,
                           ciphertexts=args.ciphertexts or "base64", replace=args.force)
    print(f"cryptdisk: protected {summary.rows} rows ({', '.join(summary.columns)}) into "
          f"{args.output}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("protect", help="copy CSV or Parquet with named columns encrypted, "
                       "tokenized or masked (docs/fields-ingestion.md)", epilog=_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="CSV or Parquet file (by extension, or --input-format)")
    p.add_argument("output", nargs="?",
                   help="Parquet or CSV file to write (an existing one only with --force, "
                   "replaced only when complete)")
    p.add_argument("--into", metavar="DATABASE:TABLE",
                   help="insert into a table of the embedded database instead of writing a "
                   "file (one commit: all rows or none)")
    p.add_argument("-c", "--config", required=True, help="cryptdisk TOML config with "
                   "[fields.keys.NAME] entries")
    p.add_argument("-r", "--rule", action="append", required=True,
                   help="COLUMN=FUNCTION:KEY[,option=value...]; repeat for more columns")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file (refused otherwise)")
    p.add_argument("--input-format", choices=["csv", "parquet"])
    p.add_argument("--output-format", choices=["csv", "parquet"])
    p.add_argument("--ciphertexts", choices=["base64", "binary"],
                   help="the form of encrypt and encrypt_deterministic output: base64 text "
                   "(default for a file) or bytes (binary: Parquet BYTE_ARRAY, SQL BLOB; "
                   "smaller, and cheaper to decrypt); with --into, the table's column type "
                   "decides (BLOB: binary, else base64)")
    p.set_defaults(func=cmd_protect)
