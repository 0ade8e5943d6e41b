"""End to end: ``cryptdisk bench`` as a real subprocess (structure, never timings)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    return env


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cryptdisk", "bench", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env())


def test_crypto_quick_writes_json_and_report(tmp_path):
    out, rep, work = tmp_path / "out.json", tmp_path / "rep", tmp_path / "work"
    r = _bench("crypto", "--quick", "--size", "4M", "--duration", "0.1", "--repeats", "2",
               "--workdir", str(work), "--json", str(out), "--report", str(rep))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["schema"] == "cryptdisk-bench/1" and d["environment"]["cores"] == os.cpu_count()
    assert "cryptography" in d["environment"]["packages"]
    cases = {(m["case"], m["strategy"]) for m in d["measurements"]}
    for case in ("seq-encrypt threads=1", "seq-decrypt threads=1"):
        assert {(case, "raw AES-GCM"), (case, "format (memory)"), (case, "format (file)")} <= cases
    assert ("random-read 4 KiB", "cryptdisk") in cases
    assert any(c.startswith("stream verify") for c, _ in cases)
    for m in d["measurements"]:
        assert m["values"] and m["median"] > 0 and m["peak_rss_mb"] > 0
        if m["case"].startswith("seq-"):
            assert len(m["values"]) == 2 and m["unit"] == "GB/s" and m["cpu_s_per_gb"] > 0
    assert d["skipped"] == []
    text = (rep / "README.md").read_text()
    assert "the format against raw AES-GCM" in text and "80 % target" in text.replace("80%", "80 %")
    assert list(rep.glob("crypto-*.png"))
    assert list(work.iterdir()) == []  # scratch space removed
    assert "`" + str(out) + "`" in text  # the report names where every run is
    assert not (rep / "results.json").exists()  # --json put them elsewhere


def test_a_report_keeps_every_run_beside_it(tmp_path):
    rep = tmp_path / "rep"
    r = _bench("crypto", "--quick", "--size", "1M", "--duration", "0.05", "--repeats", "2",
               "--workdir", str(tmp_path / "work"), "--report", str(rep))
    assert r.returncode == 0, r.stderr
    d = json.loads((rep / "results.json").read_text())
    assert d["schema"] == "cryptdisk-bench/1"
    seq = [m for m in d["measurements"] if m["case"].startswith("seq-")]
    assert seq and all(len(m["values"]) == 2 for m in seq)  # each run, not only the median
    assert "`results.json`" in (rep / "README.md").read_text()


def test_bad_arguments_are_clear_errors(tmp_path):
    r = _bench("crypto", "--repeats", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr and "Traceback" not in r.stderr
    r = _bench("crypto", "--json", str(tmp_path / "missing" / "x.json"))
    assert r.returncode == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr


#: as root, run without the capability that overrides file modes (others lack it anyway)
_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
           "--inh-caps=-all"] if os.geteuid() == 0 else []


@pytest.mark.parametrize("case", ["report is a file", "json is a directory",
                                  "parent is a file", "parent not writable"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_run(
        tmp_path: Path, case: str) -> None:
    """A --report that is a file or a --json that is a directory (or one in a directory
    this user cannot write) was found out only when the report was written, after every
    run: the whole benchmark's work was lost on a traceback-free but late error. Now it is
    refused at once (a run of the quick crypto experiment takes minutes on this machine,
    more than the timeout below). As root, the directory is made unwritable by dropping
    the capability that overrides file modes (setpriv)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    args, prefix, said = {
        "report is a file": (["--report", str(a_file)], [], f"--report {a_file} is not a "
                             "directory"),
        "json is a directory": (["--json", str(tmp_path)], [], f"--json {tmp_path} is a "
                                "directory; give a file name"),
        "parent is a file": (["--json", str(a_file / "x.json")], [], f"{a_file} is not a "
                             f"directory (needed for {a_file / 'x.json'})"),
        "parent not writable": (["--report", str(locked / "r")], _NO_DAC, f"{locked} is not "
                                f"writable (needed for {locked / 'r'})"),
    }[case]
    r = subprocess.run([*prefix, sys.executable, "-m", "cryptdisk", "bench", "crypto",
                        "--quick", "--no-venv", *args], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 1, r
    assert r.stderr == f"cryptdisk: error: {said}\n", r.stderr
    assert r.stdout == ""
    assert not (locked / "r").exists() and a_file.read_text() == ""


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/mounts") as f:
        return [line for line in f if str(path) in line]


def _ctrl_c_bench_io(tmp_path, before_ctrl_c=None):
    """Run ``cryptdisk bench io``, Ctrl-C it (SIGINT) once a timed worker runs (after
    ``before_ctrl_c(processes)``), and check that it exits 130 within 60 s leaving no
    process, mount or file behind."""
    work, log = tmp_path / "work", tmp_path / "stderr.txt"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "bench", "io", "--quick",
                                 "--duration", "5", "--workdir", str(work)],
                                stdout=subprocess.DEVNULL, stderr=err, env=_env())
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        parent = psutil.Process(proc.pid)
        # Wait until a timed worker is running (a child python busy on a test).
        while time.monotonic() < deadline:
            kids = [p for p in parent.children(recursive=True)
                    if "cryptdisk.bench._worker" in " ".join(_cmdline(p))]
            seen |= {p.pid for p in parent.children(recursive=True)}
            if kids:
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        else:
            pytest.fail("no benchmark worker started")
        time.sleep(0.5)
        seen |= {p.pid for p in parent.children(recursive=True)}
        if before_ctrl_c is not None:
            before_ctrl_c(parent.children(recursive=True))
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, log.read_text()
    assert "Traceback" not in log.read_text()
    alive = [p for p in seen if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [psutil.Process(p).cmdline() for p in alive]
    assert _mounts_under(tmp_path) == []
    assert list(work.iterdir()) == []


def _cmdline(p):
    try:
        return p.cmdline()
    except psutil.Error:  # gone, or a zombie (gocryptfs -init, just exited)
        return []


def test_ctrl_c_leaves_no_processes_mounts_or_files(tmp_path):
    _ctrl_c_bench_io(tmp_path)


def test_ctrl_c_with_a_hung_gocryptfs_daemon_still_cleans_up(tmp_path):
    """A FUSE daemon that answers nothing (stopped here with SIGSTOP; a starved or stuck
    one does the same) must not hold Ctrl-C up or leave its mount: the mount is detached
    (fusermount -u -z) and the daemon killed, which ends any request a worker waits in."""
    from cryptdisk.bench._gocryptfs import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

    def hang(processes):
        (daemon,) = [p for p in processes if _cmdline(p)[:2] == ["gocryptfs", "-fg"]]
        daemon.suspend()

    _ctrl_c_bench_io(tmp_path, hang)


def test_olap_tiny_runs_every_peer_and_checks_answers(tmp_path):
    out = tmp_path / "olap.json"
    r = _bench("olap", "--quick", "--rows", "3000", "--repeats", "1", "--no-venv",
               "--workdir", str(tmp_path / "w"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    strategies = {m["strategy"] for m in d["measurements"]}
    assert {"chdb plain", "chdb AES_128_CTR", "chdb AES_256_CTR", "duckdb plain",
            "duckdb encrypted (Mbed TLS)", "parquet plain",
            "parquet encrypted (AES_GCM_V1)"} <= strategies
    cases = {m["case"] for m in d["measurements"]}
    assert {"insert 3,000 rows", "avg(c_float) threads=all cold",
            "sum(c_int) threads=1 warm"} <= cases
    assert not [s for s in d["skipped"] if "failed" in s["reason"] or "crashed" in s["reason"]]
    notes = " ".join(d["notes"]["olap"])
    assert "all start with ClickHouse's ENC header" in notes and "b'PARE'" in notes


def test_io_quick_plain_cryptdisk_and_gocryptfs_or_its_install_hint(tmp_path):
    import shutil

    out = tmp_path / "io.json"
    r = _bench("io", "--quick", "--duration", "0.2", "--repeats", "2",
               "--workdir", str(tmp_path / "w"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    got = {(m["case"], m["strategy"]): m for m in d["measurements"]}
    for case in ("write", "rewrite", "read", "skip-read"):
        for strategy in ("plain", "cryptdisk"):
            m = got[(case, strategy)]
            assert len(m["values"]) == 2 and m["median"] > 0 and m["cpu_s_per_gb"] > 0
    assert got[("skip-read", "plain")]["unit"] == "seeks/s"
    if shutil.which("gocryptfs") and os.access("/dev/fuse", os.R_OK | os.W_OK):
        assert ("read", "gocryptfs") in got  # CI installs it (.ci/run)
    else:
        (skip,) = [s for s in d["skipped"] if s["strategy"] == "gocryptfs"]
        assert "apt-get install" in skip["install"]
    assert _mounts_under(tmp_path) == []


def test_sigkill_workers_and_daemon_die_and_next_run_reaps_scratch(tmp_path):
    from cryptdisk.bench._cleanup import Cleanup

    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "bench", "io", "--quick",
                             "--duration", "5", "--workdir", str(work)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            kids = parent.children(recursive=True)
            if any("cryptdisk.bench._worker" in " ".join(p.cmdline()) for p in kids):
                break
            assert proc.poll() is None
            time.sleep(0.1)
        else:
            pytest.fail("no benchmark worker started")
        kids = parent.children(recursive=True)
        proc.kill()  # SIGKILL: no finally, no atexit
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _gone, alive = psutil.wait_procs(kids, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]  # PR_SET_PDEATHSIG
    (stale,) = list(work.iterdir())
    deadline = time.monotonic() + 30
    while _mounts_under(stale) and time.monotonic() < deadline:
        time.sleep(0.2)  # gocryptfs unmounts itself on SIGTERM
    fresh = Cleanup(work)
    assert fresh.reaped == [stale] and not stale.exists()
    fresh.run()
    assert list(work.iterdir()) == [] and _mounts_under(tmp_path) == []


def test_case_is_for_oltp_only(tmp_path):
    r = _bench("crypto", "--case", "wal", "--workdir", str(tmp_path))
    assert r.returncode == 1 and "--case picks oltp cases" in r.stderr
    assert "Traceback" not in r.stderr
