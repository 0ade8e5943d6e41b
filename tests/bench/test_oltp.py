"""The OLTP experiment's run order (cryptdisk.bench.oltp)."""

from __future__ import annotations

from cryptdisk.bench.oltp import round_order


def test_rounds_rotate_so_each_strategy_takes_each_place_once():
    strategies = ["plain", "cryptdisk", "sqlcipher"]
    rounds = [round_order(strategies, r) for r in range(3)]
    assert rounds == [["plain", "cryptdisk", "sqlcipher"], ["cryptdisk", "sqlcipher", "plain"],
                      ["sqlcipher", "plain", "cryptdisk"]]
    for place in range(3):
        assert sorted(r[place] for r in rounds) == sorted(strategies)
    assert round_order(strategies, 3) == rounds[0]
    assert strategies == ["plain", "cryptdisk", "sqlcipher"]  # not reordered in place


def test_with_two_strategies_neither_always_follows_the_other():
    firsts = {round_order(["plain", "cryptdisk"], r)[0] for r in range(4)}
    assert firsts == {"plain", "cryptdisk"}


def test_one_case_in_paired_rounds(tmp_path, monkeypatch):
    """``cryptdisk bench oltp --case TEXT`` runs only the matching case, every strategy in
    rotated paired rounds, each run a worker that starts the clients."""
    from cryptdisk.bench import BenchOptions, Measurement, _oltp_pg
    from cryptdisk.bench.oltp import run

    monkeypatch.setattr(_oltp_pg, "find_pg_bin", lambda: None)  # PostgreSQL: not this test's

    got: list = []
    name = "tpcb-like scale=1 in-cache delete+full clients=1"
    run(BenchOptions(tmp_path, quick=True, duration=0.3, repeats=2, case="delete+full"),
        got.append, lambda *a: None)
    ms = {m.strategy: m for m in got if isinstance(m, Measurement) and m.case == name}
    assert {"plain", "cryptdisk"} <= set(ms)
    assert {m.case for m in got if isinstance(m, Measurement)} == {name}  # no other case ran
    for m in ms.values():
        assert len(m.values) == 2 and all(v > 0 for v in m.values) and m.work > 0
        assert m.extra["p50_ms"] > 0 and m.peak_rss_mb > 0
    assert ms["cryptdisk"].extra["baseline"] == "plain"
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_case_names_the_cases(tmp_path):
    import pytest

    from cryptdisk.bench import BenchOptions
    from cryptdisk.bench.oltp import run

    with pytest.raises(ValueError, match=r"no oltp case matches --case 'nope' \(cases: "
                       r"select-only scale=1 in-cache wal\+normal clients=1;"):
        run(BenchOptions(tmp_path, quick=True, case="nope"), lambda m: None, lambda *a: None)


def test_many_paired_rounds_give_the_median_a_bootstrap_interval():
    import statistics

    from cryptdisk.bench import Measurement, Results, summary_lines
    from cryptdisk.bench._stats import median_interval, paired_ratio

    plain = [100.0, 104.0, 98.0, 101.0, 99.0, 103.0]
    ours = [96.0, 99.0, 95.0, 97.0, 96.0, 100.0]
    ratios = [a / b for a, b in zip(ours, plain, strict=True)]
    r = paired_ratio(ours, plain)
    assert r.median == statistics.median(ratios) and r.interval == median_interval(ratios)
    assert min(ratios) <= r.interval[0] <= r.median <= r.interval[1] <= max(ratios)
    assert paired_ratio(ours[:4], plain[:4]).interval is None  # too few rounds for one
    res = Results({}, {}, "cmd")
    res.record(Measurement("oltp", "c", "plain", "TPS", plain))
    res.record(Measurement("oltp", "c", "cryptdisk", "TPS", ours))
    line = next(x for x in summary_lines(res) if "cryptdisk" in x)
    assert f"x{r.median:.2f} [90% {r.interval[0]:.3f}-{r.interval[1]:.3f}]" in line
