"""A read-only folder for tests that run as root (whom permission bits do not stop): the write probe of every
command's ``--out`` check (:func:`fedhype.io.check_writable_folder`) fails under ``root`` as on a read-only mount."""

from __future__ import annotations

import errno
import tempfile


def simulate_read_only(monkeypatch, root) -> None:
    """Make ``tempfile.NamedTemporaryFile`` in any folder under ``root`` fail with EROFS (Read-only file system)."""
    real = tempfile.NamedTemporaryFile

    def read_only(*a, dir=None, **k):  # noqa: A002 - tempfile's own name
        if str(dir).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
