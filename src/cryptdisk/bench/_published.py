"""Figures published by the reference documents, shown beside the measured ones.

Sources (``docs/references/`` of the design notes):

- ``vertica``: Avi Haim (Emerson), *Evaluating Encryption Strategies for Vertica*,
  vioperf on LUKS (dm-crypt AES-XTS) vs plain ext4/XFS.
- ``clickhouse``: Altinity KB, *ClickHouse data/disk encryption (at rest)*, 100M rows,
  AES_128_CTR encrypted disk vs plain.
- ``pg-tde``: CYBERTEC, *PostgreSQL performance: encrypted vs. unencrypted*, pgbench on
  PostgreSQL 13 TDE, Ryzen 5950X.
- ``design``: measurements on this kind of machine (2 cores) in the project's design notes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PUBLISHED", "SOURCES", "Published"]


@dataclass(frozen=True)
class Published:
    what: str
    plain: str
    encrypted: str
    change: str
    source: str


SOURCES = {
    "vertica": "Emerson/Vertica vioperf, LUKS (AES-XTS) vs plain "
               "(vertica-encryption-strategies.txt)",
    "clickhouse": "Altinity KB, ClickHouse encrypted disk AES_128_CTR vs plain, 100M rows "
                  "(clickhouse-encrypted-disk.txt)",
    "pg-tde": "CYBERTEC, PostgreSQL 13 TDE vs stock, pgbench (postgresql-tde-benchmark.txt)",
    "design": "earlier measurement on this kind of machine (design notes, medians, noisy)",
}

PUBLISHED: dict[str, list[Published]] = {
    "io": [
        Published("CPU utilisation, write/read/rewrite/skip-read", "~16-25 %", "~25-38 %",
                  "+35-50 % CPU", "vertica"),
        Published("throughput (MB/s, seeks/s)", "-", "-", "almost identical", "vertica"),
        Published("gocryptfs 2.3, fio O_DIRECT 2 jobs, write", "2757 MB/s", "521 MB/s", "-81 %",
                  "design"),
        Published("gocryptfs 2.3, fio O_DIRECT 2 jobs, read", "1800 MB/s", "883 MB/s", "-51 %",
                  "design"),
    ],
    "olap": [
        Published("INSERT 100M rows", "31.175 s", "33.357 s", "+7 %", "clickhouse"),
        Published("avg(c_float), all threads", "0.150 s", "0.195 s", "+30 %", "clickhouse"),
        Published("sum(c_int), all threads", "0.193 s", "0.281 s", "+46 %", "clickhouse"),
        Published("avg(c_float), max_threads=1", "0.874 s", "0.934 s", "+7 %", "clickhouse"),
        Published("chdb 10M rows avg(c_float) wall (AES_128 / AES_256)", "69.6 ms",
                  "78.7 / 80.3 ms", "+13 / +15 %", "design"),
        Published("chdb 10M rows sum(c_int) wall (AES_128 / AES_256)", "20.9 ms",
                  "29.7 / 31.7 ms", "+42 / +52 %", "design"),
        Published("chdb 10M rows INSERT (AES_128 / AES_256)", "2.7 s", "3.8 / 3.7 s",
                  "+41 / +37 %", "design"),
        Published("Parquet modular encryption 10M rows, write / read", "2.12 / 1.55 s",
                  "2.34 / 1.72 s", "+10 / +11 %", "design"),
        Published("DuckDB native encryption, cold scans (OpenSSL, 1.5.5)", "-", "-", "+5-8 %",
                  "design"),
        Published("DuckDB native encryption, cold scans (Mbed TLS, 2.0.1)", "-", "-",
                  "4.8-5.8x slower", "design"),
    ],
    "oltp": [
        Published("pgbench read-only, scale 50, 12 clients", "598k TPS", "no meaningful diff.",
                  "~0 %", "pg-tde"),
        Published("pgbench read-only, scale 500 (fits in RAM)", "-", "-", "~0 %", "pg-tde"),
        Published("pgbench read-write (TPC-B-like)", "-", "-", "significantly slower", "pg-tde"),
        Published("SQLite TPC-B-like, scale 1, WAL: plain vs SQLCipher", "20-22k TPS", "~8k TPS",
                  "-57 %", "design"),
        Published("PostgreSQL 15, pgbench scale 10, 2 clients, read-only / TPC-B",
                  "17-20k / 375 TPS", "-", "-", "design"),
    ],
    "crypto": [
        Published("cryptography 50 AES-GCM encrypt_into, 64 KiB, per core", "-", "10-12 GB/s",
                  "-", "design"),
        Published("same, two threads (GIL released)", "-", "~20 GB/s", "2x", "design"),
        Published("target: format vs raw AES-GCM, one thread", "-", ">= 80 %", "-", "design"),
        Published("target: peak RSS encrypt/decrypt/verify, any size", "-", "< 100 MB", "-",
                  "design"),
    ],
    "fs_scan": [
        Published("DuckDB avg() over 10M-row Parquet via fsspec: plain pass-through vs "
                  "encrypting file, 64 KiB segments", "0.066 s", "0.094 s", "+42 %", "design"),
        Published("same, DuckDB reading the local file directly", "0.032 s", "-", "-", "design"),
    ],
}
PUBLISHED["olap-db"] = PUBLISHED["olap"][:4]
