"""PNG plots of one experiment (matplotlib, Agg backend).

Per unit, one panel per case with its own scale (an insert in seconds and a scan in
milliseconds stay readable): medians with min-max whiskers. Then CPU seconds per GB,
and the relative cost of every strategy against its unencrypted baseline (>1 = slower),
from paired interleaved runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from ._model import Measurement

__all__ = ["plot_experiment"]

Stat = tuple[float, float, float]  # median, min, max


def _panels(title: str, xlabel: str, cases: dict[str, list[tuple[str, Stat]]],
            path: Path, line_at: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [0.5 + 0.28 * len(rows) for rows in cases.values()]
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 0.9 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    every = list(dict.fromkeys(s for rows in cases.values() for s, _ in rows))
    for ax, (case, rows) in zip(axes[:, 0], cases.items(), strict=True):
        names = [s for s, _ in rows]
        med = [v[0] for _, v in rows]
        err = [[v[0] - v[1] for _, v in rows], [v[2] - v[0] for _, v in rows]]
        ax.barh(range(len(rows)), med, xerr=err, capsize=2,
                color=[colours[every.index(n) % len(colours)] for n in names])
        ax.set_yticks(range(len(rows)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(case, fontsize=8, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        if line_at is not None:
            ax.axvline(line_at, color="black", linewidth=0.8)
    axes[-1, 0].set_xlabel(xlabel, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _collect(ms: list[Measurement],
             stat: Callable[[Measurement], Stat | None]) -> dict[str, list[tuple[str, Stat]]]:
    cases: dict[str, list[tuple[str, Stat]]] = {}
    for m in ms:
        s = stat(m)
        if s is not None:
            cases.setdefault(m.case, []).append((m.strategy, s))
    return cases


def _cpu(m: Measurement) -> Stat | None:
    if m.cpu_per_gb is None or not m.work:
        return None
    per = [c / (float(m.work) / 1e9) for c in m.cpu_s]
    return statistics.median(per), min(per), max(per)


def _relative_cost(ms: list[Measurement]) -> Callable[[Measurement], Stat | None]:
    from ._report import baseline_for
    from ._stats import paired_ratio

    def stat(m: Measurement) -> Stat | None:
        base = baseline_for(m, ms)
        if base is None:
            return None
        if m.better == "higher":  # throughput: cost is the inverse ratio
            r = paired_ratio(base.values, m.values)
        else:
            r = paired_ratio(m.values, base.values)
        return r.median, r.low, r.high
    return stat


def plot_experiment(experiment: str, ms: list[Measurement], outdir: Path) -> list[Path]:
    """Write this experiment's PNGs into ``outdir``; returns their paths."""
    files = []
    runs = max((len(m.values) for m in ms), default=0)
    for unit in dict.fromkeys(m.unit for m in ms):
        sel = [m for m in ms if m.unit == unit]
        better = "higher" if sel[0].better == "higher" else "lower"
        files.append(_panels(
            f"{experiment}: {unit}",
            f"{unit} (median of up to {runs} runs, whiskers min-max; {better} is better)",
            _collect(sel, lambda m: (m.median, *m.spread)),
            outdir / f"{experiment}-{_slug(unit)}.png"))
    cpu = _collect(ms, _cpu)
    if cpu:
        files.append(_panels(
            f"{experiment}: process CPU per GB",
            "CPU seconds per GB (user+sys of the run, its children and daemons; lower is better)",
            cpu, outdir / f"{experiment}-cpu-per-gb.png"))
    cost = _collect(ms, _relative_cost(ms))
    if cost:
        files.append(_panels(
            f"{experiment}: cost relative to the unencrypted baseline",
            "time or 1/throughput vs the baseline of the case: >1 = slower "
            "(paired median, min-max)",
            cost, outdir / f"{experiment}-relative-cost.png", line_at=1.0))
    return files


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"
