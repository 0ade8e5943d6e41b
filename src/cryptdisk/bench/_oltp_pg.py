"""PostgreSQL with the real ``pgbench``, as the OLTP reference (a throwaway cluster).

The cluster lives in a temporary directory, listens on a unix socket only, and
is stopped and removed afterwards. PostgreSQL refuses to run as root, so when
the benchmark runs as root the cluster runs as the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["PgCluster", "find_pg_bin"]

INSTALL = "apt-get install postgresql"


def find_pg_bin() -> str | None:
    """The newest ``/usr/lib/postgresql/N/bin`` with initdb, pg_ctl and pgbench (or PATH)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: int(re.sub(r"\D", "", p.split("/")[-2]) or 0), reverse=True)
    for d in candidates:
        if all(os.access(os.path.join(d, t), os.X_OK) for t in ("initdb", "pg_ctl", "pgbench")):
            return d
    if all(shutil.which(t) for t in ("initdb", "pg_ctl", "pgbench")):
        return os.path.dirname(shutil.which("initdb") or "")
    return None


class PgCluster:
    """A private PostgreSQL cluster on a unix socket under ``workdir``."""

    def __init__(self, bindir: str, workdir: Path) -> None:
        self.bindir = bindir
        self.root = workdir / "pg"
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str, timeout: float = 600) -> str:
        cmd = [*self.as_user, os.path.join(self.bindir, tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip()[-500:]}")
        return done.stdout + done.stderr

    def start(self, options: str = "") -> None:
        """initdb and start; ``options`` are more ``postgres`` options (e.g. a TCP port)."""
        self.sock.mkdir(parents=True)
        if self.as_user:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sock, "postgres")
            # postgres must be able to pass through every directory above its own (the
            # bench scratch dir is made 0700 by mkdtemp): grant search, not listing.
            for parent in [self.root.parent, *self.root.parent.parents]:
                mode = parent.stat().st_mode
                if mode & 0o001 or parent.stat().st_uid != os.geteuid():
                    continue
                os.chmod(parent, (mode & 0o7777) | 0o001)
        self._run("initdb", "-D", str(self.data), "-U", "bench", "--auth=trust",
                  "--no-instructions")
        opts = f"-k {self.sock} -c listen_addresses='' -c shared_buffers=256MB {options}"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-w", "-l",
                  str(self.root / "server.log"), "start")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def pgbench(self, *args: str, timeout: float = 3600) -> str:
        return self._run("pgbench", "-h", str(self.sock), "-U", "bench", *args, "postgres",
                         timeout=timeout)

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def parse_tps(output: str) -> float:
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
    if not m:
        raise RuntimeError(f"no tps in pgbench output: {output[-300:]}")
    return float(m.group(1))


def read_latencies(prefix: Path) -> list[float]:
    """Per-transaction latencies (microseconds) from pgbench's ``-l`` log files."""
    out: list[float] = []
    for name in glob.glob(f"{prefix}*"):
        with open(name) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    out.append(float(parts[2]))
        os.unlink(name)
    return out
