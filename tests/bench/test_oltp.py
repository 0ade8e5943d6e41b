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
