"""A rich progress bar on stderr, shaped as the experiments' ``Progress`` callback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._model import Progress

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar() -> Iterator[Progress]:
    """Yield ``progress(description, completed, total)``; one bar per description."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

    console = Console(stderr=True)
    bars = Bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=not console.is_terminal)
    tasks: dict[str, TaskID] = {}

    def update(description: str, completed: float, total: float) -> None:
        task = tasks.get(description)
        if task is None:
            task = tasks[description] = bars.add_task(description, total=total)
        bars.update(task, completed=completed, total=total)

    with bars:
        yield update
