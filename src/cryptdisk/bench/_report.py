"""The Markdown report (and the terminal summary) of a benchmark run.

Each experiment section has: what was run, the published figures beside
ours, a table per case (unit, runs, median, min-max, ratio to the baseline from
paired interleaved runs, CPU s/GB and its ratio, peak RSS), notes, skipped
strategies with the command that installs them, failed ones with their traceback,
and the plots.
"""

from __future__ import annotations

from pathlib import Path

from ._model import Measurement
from ._plots import plot_experiment
from ._published import PUBLISHED, SOURCES
from ._stats import ratio_of
from ._suite import Results

__all__ = ["baseline_for", "summary_lines", "write_report"]

_TITLES = {
    "crypto": "crypto: the format against raw AES-GCM",
    "io": "io: vioperf-style file I/O (Vertica vs LUKS)",
    "olap": "olap: insert and scan (ClickHouse encrypted vs plain table)",
    "oltp": "oltp: pgbench-like transactions (PostgreSQL TDE vs stock)",
    "fs_scan": "olap, cryptdisk:// filesystem: DuckDB scans through fsspec",
    "olap-db": "olap, cryptdisk's embedded database: encrypted vs plain tables",
    "backup": "backup: cryptdisk backup beside restic (first, second after +1%, restore)",
    "olap-engine": "olap, the embedded database's query shapes against DuckDB's file and chdb",
    "oltp-cpu": "oltp-cpu: CPU per SQLite transaction in one process (plain vs cryptdisk)",
    "names": "names: listing and opening small files, encrypted vs plain names",
}
#: Strategies that are the unencrypted reference of their case.
_BASELINES = ("plain", "raw AES-GCM", "direct local file")
_ORDER = ["crypto", "io", "olap", "oltp"]


def baseline_for(m: Measurement, peers: list[Measurement]) -> Measurement | None:
    """The unencrypted counterpart of ``m`` in the same case, or None if ``m`` is one.

    ``extra["baseline"]`` wins; else ``<family> plain`` (``chdb AES_128_CTR`` ->
    ``chdb plain``), then ``plain``, ``raw AES-GCM``, ``direct local file``.
    """
    names = {p.strategy: p for p in peers if p.case == m.case and p.unit == m.unit}
    wanted = [m.extra.get("baseline")] if m.extra.get("baseline") else []
    family = m.strategy.split(" ", 1)[0]
    wanted += [f"{family} plain", *_BASELINES]
    for name in wanted:
        if name and name in names:
            return None if name == m.strategy else names[name]
    return None


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _row(m: Measurement, peers: list[Measurement]) -> str:
    base = baseline_for(m, peers)
    ratio = ratio_of(m, base) if base else None
    cpu_ratio = ratio_of(m, base, cpu=True) if base else None
    lo, hi = m.spread
    if ratio:
        r = f"{ratio.median:.2f} ({ratio.low:.2f}-{ratio.high:.2f})"
        if ratio.interval:
            r += f" [90% {ratio.interval[0]:.3f}-{ratio.interval[1]:.3f}]"
    else:
        r = "baseline" if any(baseline_for(p, peers) is m for p in peers) else "-"
    cr = f"{cpu_ratio.median:.2f}" if cpu_ratio else "-"
    return (f"| {m.case} | {m.strategy} | {m.unit} | {len(m.values)} | {_fmt(m.median)} | "
            f"{_fmt(lo)}-{_fmt(hi)} | {r} | {_fmt(m.cpu_per_gb)} | {cr} | "
            f"{_fmt(m.peak_rss_mb)} |")


_HEAD = ("| case | strategy | unit | runs | median | min-max | ratio to baseline (paired) "
         "| CPU s/GB | CPU ratio | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|")


def _by_case(ms: list[Measurement]) -> list[Measurement]:
    """Rows grouped by case (in order of first appearance), strategies in run order."""
    order = {c: i for i, c in enumerate(dict.fromkeys(m.case for m in ms))}
    return sorted(ms, key=lambda m: order[m.case])


def _section(name: str, results: Results, outdir: Path) -> list[str]:
    ms = _by_case([m for m in results.measurements if m.experiment == name])
    lines = [f"## {_TITLES.get(name, name)}", ""]
    published = PUBLISHED.get(name, [])
    if published:
        lines += ["**Published figures** (not measured here):", "",
                  "| what | plain | encrypted | change | source |", "|---|---|---|---|---|"]
        lines += [f"| {p.what} | {p.plain} | {p.encrypted} | {p.change} | {p.source} |"
                  for p in published]
        lines += ["", "Sources: " + "; ".join(f"*{k}*: {v}" for k, v in SOURCES.items()
                                             if any(p.source == k for p in published)), ""]
    if ms:
        lines += ["**Measured here**:", "", _HEAD]
        lines += [_row(m, ms) for m in ms]
        lines += ["", "Ratio: median (min-max) of the per-round ratios strategy/baseline from "
                  "interleaved runs, in the row's unit (for s lower is better, else higher). "
                  "CPU ratio: CPU seconds per unit of work, strategy/baseline. The "
                  "relative-cost plot turns both directions into one: >1 means slower than "
                  "the unencrypted baseline.", ""]
    notes = results.notes.get(name, [])
    if notes:
        lines += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    skipped = [s for s in results.skipped if s.experiment == name]
    if skipped:
        lines += ["Skipped:", ""]
        for s in skipped:
            how = f" Install: `{s.install}`" if s.install else ""
            lines.append(f"- **{s.strategy}**: {s.reason}.{how}")
        lines.append("")
    failures = [f for f in results.failures if f.experiment == name]
    if failures:
        lines += ["Failed (a crash, not a missing peer; the run is incomplete):", ""]
        for f in failures:
            lines.append(f"- **{f.strategy}**: {f.error}")
            if f.traceback:
                lines += ["", "  ```", *("  " + t for t in f.traceback.rstrip().splitlines()),
                          "  ```"]
        lines.append("")
    if ms:
        for path in plot_experiment(name, ms, outdir):
            lines += [f"![{path.stem}]({path.name})", ""]
    return lines


def _environment(results: Results) -> list[str]:
    env = results.environment
    pk = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v)
    return [
        f"- Command: `{results.command}` (started {results.started}, {results.elapsed_s} s)",
        f"- CPU: {env.get('cpu_model')} ({env.get('cores')} cores; "
        f"{' '.join(env.get('cpu_flags', []))}), memory {env.get('memory_gb')} GB",
        f"- Kernel: {env.get('kernel')}; Python {env.get('python')}; {env.get('openssl')}",
        f"- Sealed files' AES-GCM: {env.get('sealed_aead', 'not recorded')}",
        f"- Load average at start: {env.get('load_average')}",
        f"- Packages: {pk}",
        f"- Options: {results.options}",
    ]


def write_report(results: Results, outdir: Path, note: str | None = None,
                 runs: Path | None = None) -> Path:
    """Write ``README.md`` and the PNG plots into ``outdir``; returns the Markdown path.

    ``runs``: the JSON file holding every run, named in the report when given.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    lines = ["# cryptdisk benchmark report", ""]
    if note:
        lines += [f"> {note}", ""]
    lines += [*_environment(results), ""]
    lines += ["Every figure is the median of the listed number of runs, with min-max. "
              "Strategies ran interleaved (A B A B ...), each run in a fresh worker process; "
              "CPU is process user+sys time (with children and daemons), never system-wide "
              "CPU%; peak RSS is the worker's own high-water mark (VmHWM).", ""]
    if runs is not None:
        where = runs.name if runs.resolve().parent == outdir.resolve() else str(runs)
        lines += [f"Every run's figures, unrounded: `{where}` (`cryptdisk bench --json`).", ""]
    present = _experiments(results)
    for name in present:
        lines += _section(name, results, outdir)
    path = outdir / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _experiments(results: Results) -> list[str]:
    """Experiments with results, the four main ones first, then contributed ones."""
    seen = ({m.experiment for m in results.measurements} | {s.experiment for s in results.skipped}
            | {f.experiment for f in results.failures})
    return [n for n in _ORDER if n in seen] + sorted(seen - set(_ORDER))


def summary_lines(results: Results) -> list[str]:
    """A compact terminal table: case, strategy, median (min-max), ratio."""
    out = []
    for name in _experiments(results):
        ms = [m for m in results.measurements if m.experiment == name]
        if ms:
            out.append(f"== {name}")
        for m in ms:
            base = baseline_for(m, ms)
            ratio = ratio_of(m, base) if base else None
            rr = f"  x{ratio.median:.2f}" if ratio else ""
            if ratio and ratio.interval:
                rr += f" [90% {ratio.interval[0]:.3f}-{ratio.interval[1]:.3f}]"
            rss = f"  rss {m.peak_rss_mb:.0f} MB" if m.peak_rss_mb else ""
            cpu = f"  cpu {m.cpu_per_gb:.2f} s/GB" if m.cpu_per_gb is not None else ""
            lo, hi = m.spread
            out.append(f"{m.case:32.32} {m.strategy:32.32} {_fmt(m.median):>9} {m.unit} "
                       f"({_fmt(lo)}-{_fmt(hi)}, n={len(m.values)}){rr}{cpu}{rss}")
    for s in results.skipped:
        hint = f" [{s.install}]" if s.install else ""
        out.append(f"skipped {s.experiment}/{s.strategy}: {s.reason}{hint}")
    for f in results.failures:
        out.append(f"FAILED {f.experiment}/{f.strategy}: {f.error}")
    return out
