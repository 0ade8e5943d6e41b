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


def test_paired_rounds_measure_both_strategies_in_turn(tmp_path):
    from cryptdisk.bench._oltp_pairs import paired_ratios
    from cryptdisk.bench.oltp import BIG_CACHE_KIB, Case

    case = Case("tpcb-like", 1, "delete", "full", BIG_CACHE_KIB, 1)
    ratios, runs = paired_ratios(case, 2, 0.3, str(tmp_path))
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    assert [len(runs[s]) for s in ("plain", "cryptdisk")] == [2, 2]
    assert all(r["txns"] > 0 for figures in runs.values() for r in figures)
    assert ratios[0] == runs["cryptdisk"][0]["tps"] / runs["plain"][0]["tps"]
    raw = (tmp_path / "cryptdisk.db").read_bytes()
    assert b"pgbench_accounts" not in raw  # the cryptdisk side is the encrypted store


def test_the_pairs_tool_prints_each_ratio_their_median_and_its_interval(monkeypatch, capsys):
    import re
    import statistics
    import sys

    from cryptdisk.bench import _oltp_pairs

    monkeypatch.setattr(sys, "argv", ["_oltp_pairs", "select-only", "--rounds", "3",
                                      "--duration", "0.3"])
    _oltp_pairs.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.search(r"per round \[(.*)\]; median ([\d.]+) "
                  r"\(90% bootstrap interval ([\d.]+)-([\d.]+)\)", last)
    assert m, last
    ratios = [float(x) for x in m.group(1).split(", ")]
    median, low, high = (float(m.group(i)) for i in (2, 3, 4))
    assert len(ratios) == 3 and median == round(statistics.median(ratios), 3)
    assert min(ratios) <= low <= median <= high <= max(ratios)
