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


class Bar:
    """One rich progress bar with an ETA on the terminal (`accel.runlog.terminal`, also while a run log takes other
    libraries' output): what every long loop of accel shows. The tqdm-shaped calls (update, set_postfix, close,
    a context manager) let a loop take it where it took a tqdm bar. Disabled, it draws nothing. total None: a count
    with no ETA (a loop whose length is found as it runs)."""

    def __init__(self, total: float | None, description: str, enabled: bool = True, unit: str = "",
                 console=None) -> None:
        self.description = description
        self.total = total
        self.done = 0.0
        self._progress = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        from accel.runlog import terminal

        amount = DownloadColumn() if unit == "B" else MofNCompleteColumn()
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), amount, TimeElapsedColumn(),
                                  TextColumn("ETA"), TimeRemainingColumn(),
                                  console=console or Console(file=terminal()), transient=False)
        self._progress.start()
        self._task = self._progress.add_task(description, total=total)

    def update(self, n: float = 1) -> None:
        self.done += n
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_postfix(self, **values) -> None:
        if self._progress is not None:
            extra = " ".join(f"{k}={v}" for k, v in values.items())
            self._progress.update(self._task, description=f"{self.description} {extra}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(total: float | None, description: str, enabled: bool = True, unit: str = "") -> Bar:
    return Bar(total, description, enabled, unit)


class RichReporter:
    """Each task a rich progress bar (`Bar`): description, bar, done / total, elapsed, ETA."""

    def __init__(self, console=None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)

    @contextlib.contextmanager
    def task(self, description: str, total: float, unit: str = "") -> Iterator[Advance]:
        with Bar(total, description, True, unit, self.console) as b:
            yield b.update


@contextlib.contextmanager
def forward_progress(model, description: str, enabled: bool = True, rows: int | None = None,
                     passes: int = 1) -> Iterator[Bar]:
    """A bar over work that runs `model`'s decoder layers (hooks on them; nothing is timed):
    rows None: `passes` walks over the layers (llm-compressor's sequential pipeline runs every calibration row
    through layer i and quantizes it before layer i + 1 starts; each modifier of an independent pipeline walks
    once), advanced each time a different layer starts;
    rows N: N rows each run through the whole model, advanced as the first layer takes each."""
    layers = list(model.model.layers)
    last = [0]
    total = len(layers) * passes if rows is None else rows
    with Bar(total, description, enabled) as b:
        def at(i):
            def fn(_mod, _args):
                if rows is not None:
                    if i == 0:
                        b.update(1)
                elif i != last[0]:
                    last[0] = i
                    b.update(1)
            return fn

        handles = [layer.register_forward_pre_hook(at(i)) for i, layer in enumerate(layers)]
        try:
            yield b
            b.update(max(0, total - b.done))
        finally:
            for h in handles:
                h.remove()
