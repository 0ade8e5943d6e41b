"""The names benchmark runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

from cryptdisk.bench import names


def test_names_benchmark_runs(tmp_path: Path) -> None:
    said: list[str] = []
    result = names.run(tmp_path, files=30, rounds=2, say=said.append)
    assert set(result) == {"plain names", "encrypted names"}
    for steps in result.values():
        assert set(steps) == {"list", "open+read"} and all(v > 0 for v in steps.values())
    assert said[-1] == "round 2/2 done"
    stored = [p.name for p in (tmp_path / "names").rglob("*")]
    assert len(stored) == 30 + 2 and not any("part=" in n or "file-" in n for n in stored)
    assert any(p.name.startswith("part=") for p in (tmp_path / "plain").rglob("*"))
