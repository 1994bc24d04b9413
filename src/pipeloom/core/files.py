"""Write a file whole or not at all (no torch).

Every file pipeloom writes goes through :func:`atomic_write`: the bytes go to a temporary file in the
same directory, which replaces the target only once everything is written and flushed. A failed
write (full disk, a file-size limit, an interrupt) leaves the previous file as it was and no
temporary behind, and the error names the file.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import IO, Iterator


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing (``mode`` "w" or "wb"); on a clean exit it
    replaces ``path``. Missing parent directories are created. An :class:`OSError` names ``path``.
    A ``path`` that exists and is not a regular file (a device such as /dev/null, a pipe) is written in place."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/null, /dev/stdout, a FIFO: write in place
        try:
            with open(path, mode, **({} if "b" in mode else {"encoding": encoding})) as fh:
                yield fh
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), path) from None
        return
    import tempfile  # stdlib, but slow to import: only when a file is written

    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": encoding})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # the permissions a plain open() would have given
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, (BlockingIOError, InterruptedError)):
            raise OSError(e.errno, e.strerror or str(e), path) from None
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    with atomic_write(path, "w") as fh:
        fh.write(text)
