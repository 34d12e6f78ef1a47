"""A block that fails the test, rather than hang the session, when it runs too long."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def within(seconds: float, doing: str = "still running") -> Iterator[None]:
    """Raise ``AssertionError("<doing> after <seconds> s")`` when the block runs past
    ``seconds``: a real-time timer interrupts Python code and a blocking read alike."""

    def late(signum: int, frame: Any) -> None:
        raise AssertionError(f"{doing} after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
