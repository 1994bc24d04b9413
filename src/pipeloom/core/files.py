"""Write a file whole or not at all (no torch).

Every file pipeloom writes goes through :func:`atomic_write`: the bytes go to a temporary file in the
same directory, which replaces the target only once everything is written and flushed. A failed
write (full disk, a file-size limit, an interrupt) leaves the previous file as it was and no
temporary behind, and the error names the file.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import IO, Iterable, Iterator


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


# ------------------------------------------------------------------------------------------ bounded reads
class InputFileError(ValueError):
    """An input file that cannot be read as what it should be (one line naming the file and what is allowed)."""


def _size(n: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{int(n)} bytes"


def _kind_of(mode: int) -> str:
    import stat

    return ("a directory" if stat.S_ISDIR(mode) else "a pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def check_input(path: str | os.PathLike, kind: str) -> int:
    """The size of input file ``path`` of ``kind`` (a key of :data:`pipeloom.core.limits.MAX_FILE_BYTES`),
    after refusing what cannot be one: a missing file, a directory, a device (/dev/zero), a FIFO, a
    socket, or a file over the kind's cap. Nothing is opened, so a FIFO cannot block."""
    import stat

    from .limits import MAX_FILE_BYTES

    cap = MAX_FILE_BYTES[kind]
    try:
        st = os.stat(path)  # follows links: a link to /dev/zero is /dev/zero
    except OSError as e:
        raise InputFileError(f"cannot read {kind} {os.fspath(path)}: {e.strerror or e}") from None
    except ValueError as e:  # a NUL byte in the name
        raise InputFileError(f"cannot read {kind} {os.fspath(path)!r}: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{kind} {os.fspath(path)} is {_kind_of(st.st_mode)}; expected a regular file")
    if st.st_size > cap:
        raise InputFileError(f"{kind} {os.fspath(path)} is {_size(st.st_size)}, over the cap of {_size(cap)} for a "
                             f"{kind} (caps: docs/robustness.md)")
    return st.st_size


def read_input(path: str | os.PathLike, kind: str, *, binary: bool = False, gzip_ok: bool = False) -> str | bytes:
    """Input file ``path`` of ``kind`` whole, never more than the kind's cap (``MAX_FILE_BYTES``): as UTF-8
    text (a leading BOM dropped), or bytes with ``binary``. With ``gzip_ok`` a name ending in ``.gz`` is
    decompressed, also up to the cap. Non-regular files (/dev/zero, FIFOs, directories) are refused
    unopened; a file that grows while read is cut at the cap and refused. Every error is an
    :class:`InputFileError` naming the file and what is allowed."""
    import stat

    from .limits import MAX_FILE_BYTES

    cap = MAX_FILE_BYTES[kind]
    check_input(path, kind)
    name = os.fspath(path)
    try:  # O_NONBLOCK: a path swapped for a FIFO after the check does not block the open
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputFileError(f"cannot read {kind} {name}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(f"{kind} {name} is {_kind_of(st.st_mode)}; expected a regular file")
        with os.fdopen(fd, "rb") as raw:
            fd = -1
            fh = raw
            if gzip_ok and name.lower().endswith(".gz"):
                import gzip

                fh = gzip.GzipFile(fileobj=raw, mode="rb")
            data = fh.read(cap + 1)
    except OSError as e:  # gzip.BadGzipFile is an OSError
        raise InputFileError(f"cannot read {kind} {name}: {e.strerror or e}") from None
    except EOFError:
        raise InputFileError(f"cannot read {kind} {name}: the compressed data ends early (a truncated .gz)") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > cap:
        raise InputFileError(f"{kind} {name} holds more than the cap of {_size(cap)} for a {kind}"
                             f"{' (decompressed)' if gzip_ok and name.lower().endswith('.gz') else ''} "
                             f"(caps: docs/robustness.md)")
    if binary:
        return data
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InputFileError(f"cannot read {name}: not a text file (not UTF-8: byte 0x{data[e.start]:02x} at offset "
                             f"{e.start}; a {kind} is UTF-8 text)") from None


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse_json(text: str, where: str, *, duplicates: bool = False):
    """``text`` as JSON, every error one line that starts with ``where`` (the file): invalid JSON, nesting too
    deep, an integer over Python's digit limit, and (unless ``duplicates``) a key given twice in one object."""
    import json

    try:
        return json.loads(text, object_pairs_hook=None if duplicates else _unique_keys)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except _DuplicateKey as e:
        raise InputFileError(f"{where}: key {e.args[0]!r} is given twice in one object; give it once") from None
    except RecursionError:
        raise InputFileError(f"{where}: nested too deeply to be read (JSON arrays or objects inside each other "
                             f"hundreds of levels deep)") from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise InputFileError(f"{where}: a number with too many digits ({str(e).splitlines()[0][:80]}); numbers "
                             f"must fit a 64-bit float") from None


def load_json(path: str | os.PathLike, kind: str, *, duplicates: bool = False, gzip_ok: bool = False):
    """:func:`read_input` then :func:`parse_json`, every error naming the file."""
    return parse_json(read_input(path, kind, gzip_ok=gzip_ok), f"{kind} {os.fspath(path)}", duplicates=duplicates)


# ------------------------------------------------------------------------------------------ outputs
def _identity(path: str):
    """(device, inode) of an existing regular file or directory, else its resolved path."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except (OSError, ValueError):
        return ("path", real)
    return ("inode", st.st_dev, st.st_ino)


def _is_special(path: str) -> bool:
    """An existing path that is neither a regular file nor a directory (/dev/null, a FIFO): written in place,
    nothing in it to lose."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_outputs(inputs: Iterable[tuple[str, str | None]], outputs: Iterable[tuple[str, str | None]],
                  out_dirs: Iterable[tuple[str, str | None]] = ()) -> None:
    """Refuse, before any work, outputs that would destroy an input or each other, or that cannot be written.

    ``inputs``/``outputs``/``out_dirs`` are (option, path) pairs (``("--plan", "p.json")``). An output file
    that is an input (the same path once links are resolved, or the same inode: a hard link) or another
    output is refused, as is an output (file or directory) that cannot be created: its path is a directory
    (for a file), a file (for a directory), or the nearest existing folder above it is not a writable folder.
    Outputs that exist and are devices or pipes (/dev/null) are written in place and pass."""
    seen: dict = {}
    for opt, p in inputs:
        if p is not None and os.path.exists(p) and not _is_special(p):
            seen.setdefault(_identity(p), ("input", f"the input {opt} {p}"))
    for opt, p in outputs:
        if p is None or _is_special(p):
            continue
        key = _identity(p)
        if key in seen:
            what, earlier = seen[key]
            raise InputFileError(f"{opt} {p} is {earlier}: " + (
                "writing it would replace that input; give another path" if what == "input" else
                "two outputs cannot be one file; give each its own path"))
        seen[key] = ("output", f"the output {opt} {p}")
        _check_writable(opt, p, directory=False)
    for opt, p in out_dirs:
        if p is not None:
            _check_writable(opt, p, directory=True)


def _check_writable(opt: str, path: str, *, directory: bool) -> None:
    if os.path.isdir(path):
        if not directory:
            raise InputFileError(f"{opt} {path!r} is a directory; give a file name")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputFileError(f"{opt} {path}: the directory is not writable")
        return
    if os.path.exists(path):
        if directory:
            raise InputFileError(f"{opt} {path}: is a file; give a directory (created when missing)")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.access(parent, os.W_OK | os.X_OK):  # atomic_write puts a temporary file beside it
            raise InputFileError(f"{opt} {path} cannot be replaced: the directory {parent} is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # atomic_write creates missing folders: the nearest existing one counts
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        raise InputFileError(f"{opt} {path!r}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputFileError(f"{opt} {path} cannot be created: the directory {parent} is not writable")
