"""The SQLite fuzz target on generated edits, for both VFSes: documented outcomes only."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk.sqlite as csql

from .fuzz_sqlite import BASES, COMMITS, base_files, target

EDITS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1 << 16), st.integers(0, 255)),
                 max_size=4)
CUTS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1 << 16)), max_size=1)


@pytest.mark.parametrize("base", BASES)
def test_the_base_files_hold_all_commits(tmp_path, base):
    files = base_files(base)
    assert files[""] and files["-wal"][9] == (3 if base == "framed" else 2)  # the WAL's kind
    assert ("-wal-cdtail" in files) == (base == "legacy")  # side file: legacy WALs only
    for implementation in csql.IMPLEMENTATIONS:  # untouched: every commit, by both VFSes
        assert target([], [], implementation, str(tmp_path), base) == COMMITS
        # the WAL cut after its file header: the checkpointed half only
        assert target([], [(1, 128 + 32)], implementation, str(tmp_path), base) == COMMITS // 2 + 1


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("implementation", csql.IMPLEMENTATIONS)
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS, cuts=CUTS)
def test_edited_files(tmp_path, implementation, base, edits, cuts):
    target(edits, cuts, implementation, str(tmp_path), base)
