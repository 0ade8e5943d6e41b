"""Run one timed body in a fresh interpreter, so its peak RSS is its own.

The harness starts ``python -m cryptdisk.bench._worker`` and writes a JSON
spec on its stdin (never in argv, so keys stay out of process listings)::

    {"target": "cryptdisk.bench.crypto:seq_body", "args": {...}, "result": "/tmp/.../r.json"}

The worker imports the target, calls it with ``args``, and writes the list of
:class:`~cryptdisk.bench._measure.Sample` it returns plus its own peak RSS to
``result``; if the body raises, it writes the error and its traceback there instead
(:class:`BenchRunError` carries them to the harness). Bodies time themselves with
:class:`~cryptdisk.bench._measure.Stopwatch`, so interpreter start-up and imports are
not in the figures.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import CryptdiskError
from ._cleanup import KILL_WAIT, Cleanup, die_with_parent
from ._measure import Sample, peak_rss_mb

__all__ = ["BenchRunError", "WorkerResult", "run_worker"]


class BenchRunError(CryptdiskError):
    """A benchmark body failed in its worker process; ``traceback`` says where."""

    def __init__(self, message: str, *, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


@dataclass
class WorkerResult:
    samples: list[Sample]
    peak_rss_mb: float


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the directory holding 'cryptdisk'
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run_worker(cleanup: Cleanup, target: str, args: dict[str, Any], *,
               timeout: float = 3600, python: str | None = None) -> WorkerResult:
    """Run ``target(**args)`` in a fresh Python process (``python``, default this one)."""
    result = cleanup.workdir / f".result-{os.getpid()}-{id(args)}.json"
    spec = json.dumps({"target": target, "args": args, "result": str(result)}).encode()
    proc = cleanup.popen([python or sys.executable, "-m", "cryptdisk.bench._worker"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=_child_env())
    try:
        _, err = proc.communicate(spec, timeout=timeout)
    except BaseException as exc:  # timeout, Ctrl-C: the worker must not outlive this call
        proc.kill()
        try:  # bounded: a worker killed in a request to a FUSE daemon that does not answer
            proc.wait(timeout=KILL_WAIT)  # cannot exit until the daemon is stopped
        except subprocess.TimeoutExpired:
            if isinstance(exc, subprocess.TimeoutExpired):
                raise BenchRunError(f"{target} did not finish within {timeout:.0f} s and "
                                    "did not exit when killed") from None
            raise exc from None  # still registered: Cleanup.run reaps it after the daemon
        _close_pipes(proc)
        cleanup.forget(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BenchRunError(f"{target} did not finish within {timeout:.0f} s") from None
        raise
    cleanup.forget(proc)
    data = json.loads(result.read_text()) if result.exists() else None
    if data is not None:
        result.unlink()
    if data is not None and "error" in data:
        raise BenchRunError(f"{target} failed: {data['error']}", traceback=data["traceback"])
    if proc.returncode != 0 or data is None:
        lines = err.decode(errors="replace").strip().splitlines()
        raise BenchRunError(f"{target} failed (exit {proc.returncode}): "
                            + (lines[-1] if lines else "no output"),
                            traceback="\n".join(lines[-40:]))
    return WorkerResult([Sample(**s) for s in data["samples"]], data["peak_rss_mb"])


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _main() -> int:
    die_with_parent()
    spec = json.loads(sys.stdin.buffer.read())
    module, _, name = spec["target"].partition(":")
    try:
        body = getattr(importlib.import_module(module), name)
        samples: list[Sample] = body(**spec["args"])
    except Exception as exc:  # the harness reports it as a failure, with where it happened
        _write(spec["result"], {"error": "".join(traceback.format_exception_only(exc)).strip(),
                                "traceback": traceback.format_exc()})
        return 1
    _write(spec["result"], {"samples": [asdict(s) for s in samples],
                            "peak_rss_mb": peak_rss_mb()})
    return 0


def _write(path: str, out: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    try:
        sys.exit(_main())
    except KeyboardInterrupt:
        sys.exit(130)
