"""The olap_db experiment runs end to end on a few rows (no timing is asserted)."""

from cryptdisk.bench import olap_db
from cryptdisk.bench._model import BenchOptions, Measurement


def test_olap_db_records_every_case_for_both_strategies(tmp_path):
    got = []
    progress = []
    olap_db.run(BenchOptions(tmp_path, rows=3000, repeats=2), got.append,
                lambda what, n, total: progress.append((n, total)))
    assert all(isinstance(m, Measurement) for m in got)
    cases = {(m.case, m.strategy) for m in got}
    for case in ("insert", "avg(c_float) cold threads=all", "sum(c_int) warm threads=1"):
        assert (case, "plain") in cases and (case, "cryptdisk") in cases
    insert = next(m for m in got if m.case == "insert" and m.strategy == "cryptdisk")
    assert len(insert.values) == 2 and all(v > 0 for v in insert.values)
    assert insert.extra["rows"] == 3000
    assert 0 < insert.extra["cache_peak_bytes"] <= insert.extra["cache_bound_bytes"]
    assert insert.peak_rss_mb > 0 and insert.work > 0
    assert progress[-1][0] == progress[-1][1]
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created


def test_olap_db_main_prints_a_table(tmp_path, capsys):
    assert olap_db.main(["--rows", "2000", "--repeats", "1", "--json",
                         str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "avg(c_float) warm threads=all" in out and "ratio" in out
    assert (tmp_path / "r.json").stat().st_size > 0
