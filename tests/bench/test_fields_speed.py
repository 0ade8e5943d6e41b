"""python -m cryptdisk.bench.fields_speed runs end to end on a few values (no timing checked)."""

from cryptdisk.bench.fields_speed import main


def test_fields_speed_prints_every_function_and_the_scan(capsys):
    assert main(["--values", "2000", "--scan-rows", "1000"]) == 0
    out = capsys.readouterr().out
    for name in ("fpe_encrypt FF1", "encrypt_deterministic AES-SIV", "1 MiB values",
                 "mask_hash", "warm scan of 1,000 rows"):
        assert name in out
    assert len([line for line in out.splitlines() if line.endswith("x  ") or "x  1.5x" in line
                ]) == 3
