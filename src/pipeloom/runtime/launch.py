"""Start ranks: spawn local processes on 127.0.0.1 (gloo on CPU), or join a torchrun launch.

:func:`spawn` runs ``fn(*args)`` on ``world_size`` fresh processes and returns rank 0's result.
If any rank fails, the others get a short grace period to report, are then terminated, and
:class:`RankFailure` is raised with the first rank's one-line error (which names the job it
was running or waiting on). A run has no overall time limit unless ``total_timeout_s`` is given:
hangs end through the per-wait timeouts. On Linux the ranks die with the process that spawned
them (even if it is killed), so no rank outlives the launcher.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import os
import pickle
import queue as _queue
import re
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailure(RuntimeError):
    """A spawned rank raised or died; ``rank`` and ``message`` say which and why."""

    def __init__(self, rank: int, message: str, others: list[tuple[int, str]] | None = None, tb: str = "") -> None:
        self.rank, self.message, self.others, self.tb = rank, message, others or [], tb
        head = message if message.startswith(f"rank {rank}") else f"rank {rank}: {message}"
        extra = ""
        if self.others:  # the first other rank often says what it was waiting for when this one failed
            r2, m2 = self.others[0]
            m2 = m2 if m2.startswith(f"rank {r2}") else f"rank {r2}: {m2}"
            more = f" (+{len(self.others) - 1} more)" if len(self.others) > 1 else ""
            extra = f"; then {m2}{more}"
        super().__init__(f"{head}{extra}")


def one_line(e: BaseException) -> str:
    """A rank's error as one line: the first line of the message (a RuntimeError's alone, as the
    runtime's own errors name the rank and job; other types prefixed with their name)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg if isinstance(e, RuntimeError) else f"{type(e).__name__}: {msg}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    """True when started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def default_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available (and not overridden by PIPELOOM_DEVICE=cpu), else CPU."""
    if os.environ.get("PIPELOOM_DEVICE", "") != "cpu" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)  # needed before NCCL P2P (batch_isend_irecv hangs otherwise)
        return torch.device("cuda", local)
    return torch.device("cpu")


def init_process_group(timeout_s: float = 300.0, backend: str | None = None) -> None:
    """Initialise from the environment (torchrun or :func:`spawn`): NCCL with CUDA, else gloo."""
    if dist.is_initialized():
        return
    device = default_device()
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kw = {}
    if device.type == "cuda":
        kw["device_id"] = device
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=timeout_s), **kw)


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this process when the spawning one exits, even by SIGKILL
    (daemon processes are only terminated when the parent exits normally)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _child(rank: int, world: int, port: int, q, fn: Callable | None, args: tuple | str, timeout_s: float,
           parent: int | None = None) -> None:
    if parent is not None:
        _die_with_parent(parent)
    if fn is None:  # ``args`` names the file that holds (fn, args): see _stash_args
        try:
            with open(args, "rb") as fh:
                fn, args = pickle.load(fh)
        except BaseException as e:
            q.put((rank, "error", f"cannot read the rank's arguments: {one_line(e)}", traceback.format_exc()))
            return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    if torch.cuda.device_count() < world:  # not one GPU per rank here: run every rank on CPU/gloo
        os.environ["PIPELOOM_DEVICE"] = "cpu"
    try:
        init_process_group(max(timeout_s, 300.0))  # rendezvous and setup are not the P2P timeout
        out = fn(*args)
        q.put((rank, "ok", out, ""))
    except BaseException as e:  # report, never hang the parent
        q.put((rank, "error", one_line(e), traceback.format_exc()))
    finally:
        # a failed rank must not wait in destroy for peers that are stuck
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def spawn(fn: Callable, world_size: int, args: tuple = (), *, timeout_s: float = 300.0,
          grace_s: float = 3.0, total_timeout_s: float | None = None) -> Any:
    """Run ``fn(*args)`` on ``world_size`` local processes; return rank 0's return value."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    stash = _stash_args(fn, args)
    target_args = (None, stash) if stash else (fn, args)
    procs = [ctx.Process(target=_child, args=(r, world_size, port, q, *target_args, timeout_s, os.getpid()),
                         daemon=True) for r in range(world_size)]
    try:
        return _run_ranks(procs, q, world_size, grace_s, total_timeout_s)
    finally:
        if stash:
            try:
                os.unlink(stash)
            except OSError:
                pass


def _stash_args(fn: Callable, args: tuple) -> str | None:
    """Write ``(fn, args)`` to a private temp file and return its path (None if they cannot be pickled
    plainly; they then travel in the process object as before).

    With the "spawn" start method the parent writes the pickled process object into the child's pipe
    while it still holds the pipe's read end itself: if the child's interpreter exits at once and the
    object is larger than the pipe buffer (64 KiB; a RunConfig with a schedule of thousands of
    microbatches), ``Process.start`` blocks forever. Kept small, the write always completes and a dead
    child is seen by its exit code."""
    try:
        data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None
    fd, path = tempfile.mkstemp(prefix="pipeloom-rank-args-", suffix=".pkl")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


def _start(procs: list) -> None:
    """Start every rank; a rank whose interpreter cannot run or exits before reading its start-up data (the
    parent's write into its pipe then fails: EPIPE) is a :class:`RankFailure` saying so, never a bare
    "Broken pipe". The ranks already started are stopped."""
    for r, p in enumerate(procs):
        try:
            p.start()
        except OSError as e:
            import multiprocessing.spawn as _spawn

            for q in procs[:r + 1]:
                if getattr(q, "_popen", None) is not None:
                    if q.is_alive():
                        q.kill()
                    q.join(timeout=5)
            code = p.exitcode if getattr(p, "_popen", None) is not None else None
            how = f" ({_exit_text(code)})" if code is not None else ""
            raise RankFailure(r, f"rank {r}'s process could not start: the interpreter {_spawn.get_executable()} "
                                 f"ended before reading its start-up data{how} ({e.strerror or one_line(e)}); "
                                 f"check that it runs and can import pipeloom and torch") from None


def _run_ranks(procs: list, q, world_size: int, grace_s: float, total_timeout_s: float | None) -> Any:
    _start(procs)
    results: dict[int, Any] = {}
    errors: list[tuple[int, str, str]] = []
    # no overall limit by default: a healthy run may take any time; a dead rank is seen by its exit
    # code, a hung one by its peers' timeouts (``timeout_s`` bounds each wait, not the run)
    deadline = time.monotonic() + total_timeout_s if total_timeout_s else float("inf")
    first_error_at = None
    quiet: set[int] = set()  # ranks seen exited with code 0 before their report was read
    try:
        while len(results) + len(errors) < world_size:
            now = time.monotonic()
            if first_error_at is not None and now - first_error_at > grace_s:
                break
            if now > deadline:
                reported = set(results) | {e[0] for e in errors}
                silent = [r for r in range(world_size) if r not in reported]
                errors.append((silent[0], f"no result after {total_timeout_s:g}s (ranks without one: "
                                          f"{', '.join(map(str, silent))})", ""))
                break
            try:
                rank, status, payload, tb = q.get(timeout=0.2)
            except _queue.Empty:
                reported = set(results) | {e[0] for e in errors}
                for r, p in enumerate(procs):
                    if r in reported or p.exitcode is None:
                        continue
                    if p.exitcode == 0 and r not in quiet:  # its report may still be in the pipe: one more poll
                        quiet.add(r)
                        continue
                    errors.append((r, f"process {_exit_text(p.exitcode)} without reporting", ""))
                    first_error_at = first_error_at or time.monotonic()
                continue
            if status == "ok":
                results[rank] = payload
            else:
                errors.append((rank, payload, tb))
                first_error_at = first_error_at or time.monotonic()
    finally:
        for p in procs:
            if p.is_alive() and (errors or p.exitcode is None):
                p.join(timeout=0.5 if errors else 5)
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        errors = root_cause_first(errors)
        r, msg, tb = errors[0]
        raise RankFailure(r, msg, [(e[0], e[1]) for e in errors[1:]], tb)
    return results.get(0)


def _exit_text(code: int) -> str:
    """``exited with code 3``, or ``was killed by SIGKILL`` (multiprocessing gives -signal)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def root_cause_first(errors: list[tuple]) -> list[tuple]:
    """Sort ``(rank, message, ...)`` errors so the likeliest root cause comes first: a rank's own
    error before the peers that merely lost it; among those, a rank that waited for a peer which did
    not itself report waiting (the hung or dead one), then one that waited for another waiter (in a
    chain 1 -> 2 -> 3 with rank 3 hung, rank 2's timeout, not rank 1's, names the culprit), then
    a collective's timeout, which names no peer (whatever the order the reports arrived in)."""
    waiting = {e[0] for e in errors if _blame_order(e[1])}

    def key(e):
        peer = re.search(r"(?:from|to) rank (\d+)", e[1])
        return _blame_order(e[1]), (2 if peer is None else int(peer.group(1)) in waiting)
    return sorted(errors, key=key)


def _blame_order(msg: str) -> int:
    # a rank's own error (0) before the peers that merely lost it (1)
    low = msg.lower()
    if "timed out" in low or "waited for" in low or "connection" in low or "closed" in low:
        return 1
    return 0
