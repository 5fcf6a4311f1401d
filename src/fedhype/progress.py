"""Plain progress lines on stderr, for logs and pipes where a rich bar is invisible (every stage may use them)."""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console

_err = Console(stderr=True)  # resolves sys.stderr at each print (so a swapped stderr is honoured)


class LineProgress:
    """Plain periodic progress lines on stderr, for logs and pipes where a rich bar is invisible.

    ``update(n)`` adds ``n`` done items and prints ``"<label>: done/total (pct) rate unit/s, t s"``
    at most every ``every_s`` seconds, and always when the total is reached.
    """

    def __init__(self, label: str, total: int, unit: str = "items", every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit, self.every_s, self.clock = label, int(total), unit, float(every_s), clock
        self.done = 0
        self.start = self.last = clock()

    def update(self, n: int) -> None:
        self.done += int(n)
        now = self.clock()
        if self.done >= self.total or now - self.last >= self.every_s:
            self.last = now
            secs = max(now - self.start, 1e-9)
            pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            _err.print(f"{self.label}: {self.done}/{self.total}{pct}  {self.done / secs:.1f} {self.unit}/s  "
                       f"{secs:.0f} s", highlight=False, markup=False, soft_wrap=True)
