"""What the machine has: memory available to a new allocation, free disk space, and byte counts for messages (no
heavy imports: the CLI's ``--help`` reads this module without torch)."""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``; else free pages; None if unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def free_disk(path) -> int | None:
    """Bytes free to an unprivileged writer on the file system that holds ``path`` (its nearest existing folder,
    so a folder not yet made is measured where it will be made); None if unknown."""
    import shutil
    from pathlib import Path

    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return None


def format_bytes(n: float) -> str:
    """``n`` bytes for a message, in the unit that keeps digits (a probe read "needs 0.00 GiB, 0.00 GiB free")."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} bytes"
