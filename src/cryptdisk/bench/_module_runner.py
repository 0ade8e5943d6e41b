"""Run an experiment module written elsewhere in its own process.

Modules such as ``oltp``, ``fs_scan`` and ``olap_db`` run their bodies in the
process that calls ``run()`` and read ``ru_maxrss`` there. In the harness
process that figure would include everything the harness did before; in a
fresh process (started while the harness is still small) it is the module's
own. The child sends its records, notes and progress back as JSON lines on
stdout, each prefixed with :data:`MARK`; other output is ignored.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._cleanup import Cleanup, die_with_parent
from ._model import BenchOptions, Measurement, Progress, Recorder, Skipped

__all__ = ["MARK", "TRAMPOLINE", "run_module"]

MARK = "\x1ecryptdisk-bench "

#: A tiny parent for the module's process. Linux carries the high-water RSS of the
#: address space an ``exec`` replaces into the new program's ``ru_maxrss``; a child
#: started straight from the harness would report the harness's peak. Started from
#: this small interpreter (no site, no cryptdisk), it reports its own. Signals are
#: forwarded and the trampoline dies with the harness.
TRAMPOLINE = """
import ctypes, signal, subprocess, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
except Exception:
    pass
p = subprocess.Popen(sys.argv[1:])
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: p.send_signal(n))
sys.exit(p.wait())
"""


def _decode(kind: str, data: dict[str, Any]) -> Measurement | Skipped:
    cls = Measurement if kind == "measurement" else Skipped
    names = set(cls.__dataclass_fields__)
    return cls(**{k: v for k, v in data.items() if k in names})


def run_module(module: str, options: BenchOptions, record: Recorder, progress: Progress,
               cleanup: Cleanup) -> list[str]:
    """Run ``module.run`` in a child process; returns the module's NOTES."""
    from ._worker import BenchRunError, _child_env

    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()
            if k != "cleanup"}
    proc = cleanup.popen([sys.executable, "-S", "-c", TRAMPOLINE,
                          sys.executable, "-m", "cryptdisk.bench._module_runner"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=_child_env())
    notes: list[str] = []
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(json.dumps({"module": module, "options": opts}).encode())
        proc.stdin.close()
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if not line.startswith(MARK):
                continue
            kind, data = json.loads(line[len(MARK):])
            if kind == "progress":
                progress(*data)
            elif kind == "notes":
                notes.extend(data)
            else:
                record(_decode(kind, data))
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        cleanup.forget(proc)
    if code != 0:
        tail = " | ".join(err.strip().splitlines()[-6:])
        raise BenchRunError(f"{module} exited with {code}: {tail}")
    return notes


def _emit(kind: str, data: Any) -> None:
    sys.stdout.write(MARK + json.dumps([kind, data]) + "\n")
    sys.stdout.flush()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _main() -> int:
    import importlib

    die_with_parent()
    signal.signal(signal.SIGTERM, _interrupt)  # so the module's finally blocks run
    spec = json.loads(sys.stdin.read())
    opts = spec["options"]
    opts["workdir"] = Path(opts["workdir"])
    known = set(BenchOptions.__dataclass_fields__)
    options = BenchOptions(**{k: v for k, v in opts.items() if k in known})
    mod = importlib.import_module(spec["module"])

    def record(item: Measurement | Skipped) -> None:
        data = item.to_dict() if isinstance(item, Measurement) else asdict(item)
        _emit("measurement" if isinstance(item, Measurement) else "skipped", data)

    mod.run(options, record, lambda d, c, t: _emit("progress", [d, c, t]))
    _emit("notes", list(getattr(mod, "NOTES", []) or []))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except KeyboardInterrupt:
        sys.exit(130)
