"""Progress of long work (a conversion, a stage's layers): a `Reporter` passed to the function doing the work, which
opens a task per loop and advances it; the CLI hands in a rich bar with an ETA, tests and libraries the silent one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

Advance = Callable[[float], None]


class Reporter(Protocol):
    def task(self, description: str, total: float, unit: str = "") -> contextlib.AbstractContextManager[Advance]:
        """A task of `total` units (bytes when unit is "B"); the context yields advance(n)."""
        ...


class Silent:
    @contextlib.contextmanager
    def task(self, description: str, total: float, unit: str = "") -> Iterator[Advance]:
        yield lambda n: None


SILENT = Silent()


class RichReporter:
    """Each task a rich progress bar on stderr: description, bar, done / total, elapsed, ETA."""

    def __init__(self, console=None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)

    @contextlib.contextmanager
    def task(self, description: str, total: float, unit: str = "") -> Iterator[Advance]:
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        amount = DownloadColumn() if unit == "B" else MofNCompleteColumn()
        with Progress(TextColumn("{task.description}"), BarColumn(), amount, TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=False) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda n: bar.advance(tid, n)
