"""A log wrapper that never lets a long stage go silent: periodic "still working" lines."""

from __future__ import annotations

import threading
import time
from typing import Callable

Log = Callable[[str], None]


class Heartbeat:
    """Wrap ``log``: while active, print ``"<stage>: still working (N s)"`` whenever nothing was logged
    for ``quiet`` seconds, so a pipe or log file never waits more than about ``quiet`` + 1 s for a line.

    Use as a context manager around a job; call :meth:`stage` when a stage starts, the instance
    itself to log, and :meth:`touch` when something else printed (e.g. a per-round callback). The
    lines come from a daemon thread; ``log`` must be safe to call from it (a print to stderr is).

    Args:
        log: the underlying one-line logger. quiet: seconds of silence before a heartbeat line.
    """

    def __init__(self, log: Log, quiet: float = 4.0):
        self._log, self.quiet = log, float(quiet)
        self._lock = threading.Lock()
        self._stage, self._stage_t = "", time.monotonic()
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, text: str) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._log(text)

    def touch(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def stage(self, name: str, line: str | None = None) -> None:
        """Start stage ``name`` (named by the heartbeat lines); log ``line`` if given."""
        with self._lock:
            self._stage, self._stage_t = name, time.monotonic()
        if line is not None:
            self(line)

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                now = time.monotonic()
                if self._stage and now - self._last >= self.quiet:
                    self._last = now
                    self._log(f"{self._stage}: still working ({now - self._stage_t:.0f} s)")

    def __enter__(self) -> "Heartbeat":
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="fedhype-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
