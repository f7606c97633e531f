"""A run's log file: while `accel optimize` works, what other libraries write (llm-compressor's log lines,
transformers' warnings, their progress bars, native libraries' messages) goes to `runs/<name>/log.txt`, and the
terminal shows accel's own stage lines, progress bars and summary.

Both levels are redirected: `sys.stderr` and Python warnings (Python writers, tqdm bars created meanwhile) and
file descriptor 2 (handlers that kept the original stream, loguru's default sink, C++ code). accel's own
progress bars write to `terminal()`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

LOG_NAME = "log.txt"
_terminal: TextIO | None = None


def terminal() -> TextIO:
    """The stream accel's own progress goes to: the terminal's stderr, also while a run log is open."""
    return _terminal or sys.stderr


@contextlib.contextmanager
def third_party_to(path: Path) -> Iterator[Path]:
    """Send everything written to stderr inside the block to `path` (appended), except through `terminal()`."""
    global _terminal
    if _terminal is not None:  # nested: the outer block already redirects
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} accel {' '.join(sys.argv[1:])}\n")
    original = sys.stderr
    original.flush()
    saved_fd = os.dup(2)
    try:
        on_fd2 = original.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a captured stream (tests, notebooks)
        on_fd2 = False
    term = os.fdopen(os.dup(saved_fd), "w", buffering=1) if on_fd2 else original
    os.dup2(log.fileno(), 2)
    sys.stderr, _terminal = log, term
    show = warnings.showwarning
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
        warnings.formatwarning(message, category, filename, lineno, line))
    try:
        yield path
    finally:
        warnings.showwarning = show
        log.flush()
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        sys.stderr, _terminal = original, None
        if term is not original:
            term.close()
        log.close()
