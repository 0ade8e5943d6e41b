"""PNG plots of one experiment: medians with min-max whiskers, and CPU seconds per GB."""

from __future__ import annotations

import statistics
from pathlib import Path

from ._model import Measurement

__all__ = ["plot_experiment"]


def _grouped(ax, cases: list[str], strategies: list[str],  # type: ignore[no-untyped-def]
             get: dict[tuple[str, str], tuple[float, float, float]]) -> None:
    height = 0.8 / max(1, len(strategies))
    for j, strategy in enumerate(strategies):
        ys, xs, lo, hi = [], [], [], []
        for i, case in enumerate(cases):
            if (case, strategy) not in get:
                continue
            med, low, high = get[(case, strategy)]
            ys.append(i + j * height)
            xs.append(med)
            lo.append(med - low)
            hi.append(high - med)
        ax.barh(ys, xs, height=height, xerr=[lo, hi], capsize=2, label=strategy)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(cases))], cases, fontsize=8)
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="best")
    ax.grid(axis="x", alpha=0.3)


def _figure(rows: int):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * rows))
    return plt, fig, ax


def _save(plt, fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_experiment(experiment: str, ms: list[Measurement], outdir: Path) -> list[Path]:
    """One plot per unit (medians, min-max) and one of CPU s/GB; returns the files."""
    files: list[Path] = []
    units = sorted({m.unit for m in ms})
    for unit in units:
        sel = [m for m in ms if m.unit == unit]
        cases = list(dict.fromkeys(m.case for m in sel))
        strategies = list(dict.fromkeys(m.strategy for m in sel))
        get = {(m.case, m.strategy): (m.median, *m.spread) for m in sel}
        plt, fig, ax = _figure(len(cases) * max(1, len(strategies)) // 2 + len(cases))
        _grouped(ax, cases, strategies, get)
        better = "higher" if sel[0].better == "higher" else "lower"
        ax.set_xlabel(f"{unit} (median of {max(len(m.values) for m in sel)} runs, "
                      f"whiskers min-max; {better} is better)")
        ax.set_title(f"{experiment}: {unit}")
        path = outdir / f"{experiment}-{_slug(unit)}.png"
        _save(plt, fig, path)
        files.append(path)
    cpu = [m for m in ms if m.cpu_per_gb is not None]
    if cpu:
        cases = list(dict.fromkeys(m.case for m in cpu))
        strategies = list(dict.fromkeys(m.strategy for m in cpu))
        get = {}
        for m in cpu:
            per = [c / (m.work / 1e9) for c in m.cpu_s]  # type: ignore[operator]
            get[(m.case, m.strategy)] = (statistics.median(per), min(per), max(per))
        plt, fig, ax = _figure(len(cases) * max(1, len(strategies)) // 2 + len(cases))
        _grouped(ax, cases, strategies, get)
        ax.set_xlabel("process CPU seconds per GB (user+sys, incl. children and daemons; "
                      "lower is better)")
        ax.set_title(f"{experiment}: CPU s/GB")
        path = outdir / f"{experiment}-cpu-per-gb.png"
        _save(plt, fig, path)
        files.append(path)
    return files


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"
