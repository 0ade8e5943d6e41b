"""python -m cryptdisk.bench.backup_speed runs end to end on a small database."""

from __future__ import annotations

from pathlib import Path

from cryptdisk.bench.backup_speed import main


def test_backup_speed_small(tmp_path: Path, capsys) -> None:
    assert main(["--rows", "20000", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rows 20000" in out and "ok=True" in out and "restore" in out
    assert list(tmp_path.iterdir()) == []  # its temporary directory is gone
