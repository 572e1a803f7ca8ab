"""Progress that reads line by line: plain lines wherever the output goes, a tqdm bar only on a terminal.

A log file gets one line per step (or per batch, or every few percent of a long loop), never
tqdm's carriage-return stream; a terminal gets the same lines above a bar.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def bar(**kwargs) -> tqdm:
    """A tqdm bar, disabled unless stderr is a terminal (and unless `disable` says so already)."""
    kwargs["disable"] = kwargs.get("disable", False) or not sys.stderr.isatty()
    return tqdm(**kwargs)


def line(text: str) -> None:
    """One line on stdout, above the bar if there is one, flushed at once (a log file is block-buffered)."""
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def every(total: int, lines: int = 20) -> int:
    """The interval, in iterations, that prints about `lines` lines over `total` iterations."""
    return max(1, total // lines)
