"""Worker bodies of ``cryptdisk bench dask``: one reader on one LocalCluster per call.

:func:`prepare` writes the rows twice (a cryptdisk table, plain Parquet files);
:func:`scan` starts a ``distributed.LocalCluster`` of N single-threaded worker
processes on loopback, runs each shape once untimed (worker imports, the
database opened and its keys loaded on each worker, the page cache), then
timed, and checks every answer against DuckDB's on the plain files.
"""

from __future__ import annotations

import importlib
import math
import os
from typing import Any

from ._measure import Sample, Stopwatch

__all__ = ["prepare", "scan", "shapes"]


def shapes(rows: int) -> dict[str, dict[str, Any]]:
    """Shape -> what it computes: columns, key filter (or None), DuckDB's SQL for the answer."""
    lo, hi = int(rows * 0.45), int(rows * 0.55)
    return {
        "full scan": {"columns": ["k", "s", "f"], "filters": None,
                      "sql": "SELECT sum(f), count(s), count(k) FROM {src}"},
        "filtered sum": {"columns": ["f"], "filters": [["k", ">=", lo], ["k", "<", hi]],
                         "sql": f"SELECT sum(f) FROM {{src}} WHERE k >= {lo} AND k < {hi}"},  # noqa: S608 - ints
    }


def prepare(db: str, plain: str, rows: int, parts: int) -> list[Sample]:
    """The same rows (k in order, s = md5(k), f = k / 7) as a ``parts``-part encrypted
    table ``t`` (ORDER BY k) and as ``parts`` plain Parquet files (64Ki-row row groups,
    LZ4, as cryptdisk's parts). One sample: plain bytes, the answers in ``extra``."""
    import duckdb

    from ..db import connect

    os.makedirs(plain)
    per = -(-rows // parts)
    with connect(db) as con:
        con.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(parts):
            lo, hi = i * per, min(rows, (i + 1) * per)
            gen = (f"SELECT i AS k, md5(i::VARCHAR) AS s, i / 7 AS f "  # noqa: S608 - ints
                   f"FROM range({lo}, {hi}) r(i)")
            con.sql(f"INSERT INTO t {gen}")
            duckdb.sql(f"COPY ({gen}) TO '{plain}/part-{i:03d}.parquet' "
                       "(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE 65536)")
        stored = con.query("SELECT sum(bytes) FROM system.parts")[0][0]
    src = f"read_parquet('{plain}/*.parquet')"
    duck: Any = duckdb.connect()
    answers = {name: [float(v) for v in duck.execute(s["sql"].format(src=src)).fetchone()]
               for name, s in shapes(rows).items()}
    duck.close()
    size = sum(os.path.getsize(os.path.join(plain, f)) for f in os.listdir(plain))
    return [Sample("prepare", "bytes", float(size), extra={"answers": answers,
                                                           "encrypted_bytes": float(stored)})]


def _frame(reader: str, db: str, plain: str, shape: dict[str, Any]) -> Any:
    filters = [tuple(f) for f in shape["filters"]] if shape["filters"] else None
    if reader == "cryptdisk":
        import cryptdisk.dask

        return cryptdisk.dask.read_table(db, "t", shape["columns"], filters)
    import dask.dataframe as dd
    cols = sorted(set(shape["columns"]) | ({f[0] for f in filters} if filters else set()))
    return dd.read_parquet(plain, columns=cols, filters=filters)


def _partial_sums(part: Any) -> Any:
    """One partition's share of the full scan: ``[sum(f), count(s), count(k)]``."""
    import pandas as pd

    return pd.Series([part.f.sum(), part.s.count(), part.k.count()], index=["f", "s", "k"],
                     dtype="float64")


def _add_partials(partials: Any) -> Any:
    """The partitions' ``[sum(f), count(s), count(k)]`` (a frame, one row per partition)
    added up, in one task."""
    return partials.sum()


def _aggregation(df: Any, name: str) -> Any:
    """The shape's one Dask aggregation of ``df``, fused (``.optimize()``): one task per
    partition (the read and its partial result) and one adding the partials.

    The full scan is one reduction (``_partial_sums`` per partition, ``_add_partials``
    once, ``split_every=False``), not three (``sum(f)``, ``count(s)``, ``count(k)``:
    a read, 3 column selections and 3 partial reductions per partition). ``dask.compute``
    does not fuse a DataFrame's blockwise steps (Dask 2026.8: it lowers the expression
    without the fusion stage), so the read and the reduction's chunk would be two tasks
    per partition; the collection's own ``optimize()`` fuses them."""
    import pandas as pd

    if name == "full scan":
        meta = pd.Series([0.0, 0.0, 0.0], index=["f", "s", "k"], dtype="float64")
        out = df.reduction(chunk=_partial_sums, aggregate=_add_partials, meta=meta,
                           split_every=False)
    else:
        out = df.f.sum()
    return out.optimize()


def _compute(dask: Any, df: Any, name: str) -> list[float]:
    (out,) = dask.compute(_aggregation(df, name))
    if name == "full scan":
        return [float(out[c]) for c in ("f", "s", "k")]
    return [float(out)]


#: Timed computes of each shape per cluster; a run's figure is their median.
TIMED = 3
#: Seconds the cluster is left idle at the end, to measure its background CPU.
IDLE_S = 1.0


def _task_counter() -> Any:
    """A scheduler plugin (in this process: LocalCluster's scheduler runs here) counting
    the tasks a compute sends to workers and the bytes of their pickled specs, while
    ``active`` (off for the timed computes: pickling every spec costs the scheduler)."""
    import cloudpickle
    from distributed.diagnostics.plugin import SchedulerPlugin

    class TaskCounter(SchedulerPlugin):
        name = "cryptdisk-bench-task-counter"

        def __init__(self) -> None:
            self.active = False
            self.tasks = 0
            self.spec_bytes = 0
            self.scheduler: Any = None

        async def start(self, scheduler: Any) -> None:
            self.scheduler = scheduler

        def transition(self, key: Any, start: str, finish: str, *args: Any,
                       **kwargs: Any) -> None:
            if self.active and finish == "processing":
                self.tasks += 1
                self.spec_bytes += len(cloudpickle.dumps(self.scheduler.tasks[key].run_spec))

    return TaskCounter()


def _thread_names() -> dict[int, str]:
    import threading

    return {t.native_id or 0: t.name for t in threading.enumerate()}


def _transfer_bytes(dask_worker: Any) -> int:
    return int(dask_worker.transfer_outgoing_bytes_total)


#: Key prefixes of the readers' read tasks (one per partition), alone
#: (``cryptdisk-read-table-``) or fused with what follows (``cryptdisk-chunk-``,
#: ``read_parquet-fused-chunk-``: a fused task's key starts with its first step's label).
_READ_TASKS = ("cryptdisk-", "read_parquet-")


def _timeline(stream: list[dict[str, Any]], workers: int, t0: float, t1: float
              ) -> dict[str, float]:
    """Where one compute's wall time went, from distributed's task stream (the tasks'
    start and stop times on the workers, the same clock as this process's on one
    machine): ``head_s`` from the start of the timed region (planning, graph, submission,
    the scheduler's first assignment) to the first task's start, ``tail_s`` from the last
    task's end to the result in this process, each worker's seconds in tasks
    (``in_tasks_s`` summed, ``in_tasks_max_s`` the busiest) and idle between its first
    and last task (``gaps_s`` summed: waiting for the scheduler, its own event loop, a
    core), and the fewest and most read tasks one worker ran."""
    spans: dict[str, list[tuple[float, float]]] = {}
    reads: dict[str, int] = {}
    for task in stream:
        for ss in task.get("startstops", ()):
            if ss.get("action") == "compute":
                spans.setdefault(task["worker"], []).append((ss["start"], ss["stop"]))
        key = task.get("key")
        if str(key[0] if isinstance(key, tuple) else key).startswith(_READ_TASKS):
            reads[task["worker"]] = reads.get(task["worker"], 0) + 1
    if not spans:
        return {}
    busy, gaps = [], []
    for v in spans.values():
        v.sort()
        busy.append(sum(b - a for a, b in v))
        gaps.append(sum(max(0.0, v[i + 1][0] - v[i][1]) for i in range(len(v) - 1)))
    first = min(a for v in spans.values() for a, _ in v)
    last = max(b for v in spans.values() for _, b in v)
    # a worker shifts its start/stop times by its estimate of its clock's offset from the
    # scheduler's (distributed's time_delay, from heartbeats), which can be off by a few ms
    # on one machine: a head or tail shorter than that error reads as 0, not negative
    return {"head_s": max(0.0, first - t0), "tail_s": max(0.0, t1 - last),
            "in_tasks_s": sum(busy),
            "in_tasks_max_s": max(busy), "gaps_s": sum(gaps),
            "reads_min": float(min(reads.get(w, 0) for w in spans)) if len(spans) == workers
            else 0.0,
            "reads_max": float(max(reads.get(w, 0) for w in spans))}


class _Components:
    """CPU seconds by component: this process's calling thread (planning, graph, submit,
    wait) and its other threads (LocalCluster's scheduler, nannies and the client's
    comms share its event loop), each worker's task thread and its other threads
    (event loop: Dask's per-task bookkeeping, heartbeats, the statistical profiler)."""

    def __init__(self, client: Any) -> None:
        import psutil

        self.me = psutil.Process()
        self.workers = [psutil.Process(p) for p in client.run(os.getpid).values()]
        self.names: dict[int, str] = {}
        for names in client.run(_thread_names).values():
            self.names.update(names)

    def snapshot(self) -> dict[str, Any]:
        import time

        t = self.me.cpu_times()
        task, other = [], []
        for w in self.workers:
            tt = to = 0.0
            for th in w.threads():
                cpu = th.user_time + th.system_time
                if "Dask-Default-Threads" in self.names.get(th.id, ""):
                    tt += cpu
                else:
                    to += cpu
            task.append(tt)
            other.append(to)
        return {"main": time.thread_time(), "process": t.user + t.system,
                "task": task, "other": other}

    @staticmethod
    def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
        task = [y - x for x, y in zip(a["task"], b["task"], strict=True)]
        main = b["main"] - a["main"]
        return {"client_main_cpu_s": main,
                "client_loop_cpu_s": b["process"] - a["process"] - main,
                "worker_task_cpu_s": sum(task),
                "worker_task_cpu_max_s": max(task),
                "worker_other_cpu_s": sum(b["other"]) - sum(a["other"])}


def scan(reader: str, workers: int, db: str, plain: str, rows: int,
         answers: dict[str, list[float]]) -> list[Sample]:
    """Each shape once untimed, then :data:`TIMED` times, on a fresh cluster of
    ``workers`` processes; the sample is the median of the timed computes.

    Rows/s counts the table's rows for both shapes (the filtered sum reads a tenth).
    CPU is this process's and the worker processes' (nannies run in this process);
    ``extra`` splits it by component (:class:`_Components`, medians per compute) and
    gives ``plan_s`` (wall seconds of ``read_table`` / ``read_parquet``), the task count
    and pickled task bytes (counted on the untimed compute) and the bytes workers sent
    each other; ``idle_*_per_s`` are the components' CPU seconds per second of an
    idle cluster (measured once, after the computes).
    """
    import statistics
    import time
    import warnings

    dask: Any = importlib.import_module("dask")
    distributed: Any = importlib.import_module("distributed")
    warnings.filterwarnings("ignore", message="The inplace keyword")  # dask 2026.8 + pandas 3.1
    out = []
    with distributed.LocalCluster(n_workers=workers, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  worker_dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(workers)
        counter = _task_counter()
        client.register_plugin(counter)
        counter = cluster.scheduler.plugins[counter.name]  # the scheduler's copy
        for name, shape in shapes(rows).items():
            counter.tasks = counter.spec_bytes = 0
            counter.active = True
            df = _frame(reader, db, plain, shape)
            _check(_compute(dask, df, name), answers[name], reader, name)
            counter.active = False
            tasks, spec_bytes = counter.tasks, counter.spec_bytes
            parts = _Components(client)
            runs = []
            client.get_task_stream(start=time.time())  # the scheduler records from now on
            for _ in range(TIMED):
                sent0 = sum(client.run(_transfer_bytes).values())
                c0 = parts.snapshot()
                with Stopwatch() as sw:
                    t0 = time.perf_counter()
                    w0 = time.time()
                    frame = _frame(reader, db, plain, shape)
                    plan_s = time.perf_counter() - t0
                    got = _compute(dask, frame, name)
                    w1 = time.time()
                c1 = parts.snapshot()
                _check(got, answers[name], reader, name)
                figures = _Components.delta(c0, c1)
                figures.update(wall_s=sw.wall, plan_s=plan_s, client_cpu_s=sw.cpu,
                               transfer_bytes=sum(client.run(_transfer_bytes).values())
                               - sent0)
                figures.update(_timeline(client.get_task_stream(start=w0), workers, w0, w1))
                runs.append(figures)
            med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
            sw = Stopwatch()
            sw.wall = med.pop("wall_s")
            sw.cpu = med["client_cpu_s"]
            s = sw.rate(f"{name}, {workers} worker{'s' if workers > 1 else ''}", rows,
                        unit="Mrows/s", work_unit="rows", rows=rows, workers=workers,
                        partitions=df.npartitions, tasks=tasks, task_spec_bytes=spec_bytes)
            med["workers_cpu_s"] = med["worker_task_cpu_s"] + med["worker_other_cpu_s"]
            s.cpu_s = med["client_cpu_s"] + med["workers_cpu_s"]
            s.extra.update(med)
            out.append(s)
        # CPU the cluster spends per second doing nothing (heartbeats, the workers'
        # profilers and memory monitors, the scheduler's periodic work): the part of each
        # component's figure that grows with wall time rather than with tasks or rows
        time.sleep(0.2)
        c0 = parts.snapshot()
        t0 = time.perf_counter()
        time.sleep(IDLE_S)
        idle = _Components.delta(c0, parts.snapshot())
        idle_s = time.perf_counter() - t0
        for s in out:
            s.extra.update({f"idle_{k[:-2]}_per_s": v / idle_s for k, v in idle.items()
                            if k != "worker_task_cpu_max_s"})
    return out


def _check(got: list[float], want: list[float], reader: str, name: str) -> None:
    if len(got) != len(want) or not all(math.isclose(g, w, rel_tol=1e-9)
                                        for g, w in zip(got, want, strict=True)):
        raise AssertionError(f"{reader} {name} returned {got}, DuckDB {want}")
