"""Per-rank job log in the shared JSON Lines format: the writer (the reader is :mod:`pipeloom.trace.reader`).

File ``LOGDIR/workerlog.<global rank>``; first line ``meta`` (with a ``run_id`` shared by the
ranks of one run, so that readers can refuse logs of two runs mixed); inside the profiler window
(steps in ``[start, stop)``) every rank writes ``profile_start``, a ``sync`` line right after a
barrier at the start of each profiled step (to align clocks), one ``job`` line per executed job
(``start``/``end`` wall-clock seconds bracketing the compute only, not the waits), ``step_end``,
and ``profile_stop`` when the window closes.

On CPU devices a job line also carries ``ready`` <= ``start`` and ``done`` >= ``end``: the job's
whole share of its rank's time. ``ready`` is the moment its input is in hand (right after the
blocking wait for a peer's message, or right after the previous job's ``done`` when nothing is
awaited); ``done`` is the moment its outputs are handed to the transport and the receives they
unblock are posted. So consecutive jobs of a rank tile its timeline, and the gaps between one
job's ``done`` and the next one's ``ready`` are exactly the time spent waiting for a peer.
(Not written on GPUs, where ``start``/``end`` come from CUDA events on the device's clock.)

The meta line's optional ``model`` entry, ``{"layers": L, "layers_per_chunk": [...]}``, says how many
decoder layers the run's model has and how many each global chunk held, so that the check's rebalancing
advice starts from the run's own partition.
"""
from __future__ import annotations

import json
import os
import socket
import time

#: a rank's log file in a log directory (``machine<k>/`` subfolders hold logs copied from several machines)
LOG_NAME = "workerlog.{rank}"
#: the name a log has while its rank writes it; renamed to :data:`LOG_NAME` when the rank closes it, so a
#: rank that was killed leaves ``workerlog.<rank>.partial`` (read, with a warning) instead of a cut-off log
PARTIAL_SUFFIX = ".partial"


def log_name(rank: int) -> str:
    """The file name of ``rank``'s log."""
    return LOG_NAME.format(rank=rank)


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``"3:5"`` -> (3, 5) (steps 3 and 4 profiled); ``"3"`` -> (3, 4); None/"" -> None."""
    if text is None or str(text).strip() in ("", "none"):
        return None
    s = str(text).strip()
    try:
        if ":" in s:
            a, b = s.split(":", 1)
            start, stop = int(a), int(b)
        else:
            start = int(s)
            stop = start + 1
    except ValueError:
        raise ValueError(f"--profile-steps {text!r}: expected START:STOP (steps START..STOP-1 profiled), e.g. 3:5") from None
    if start < 0 or stop <= start:
        raise ValueError(f"--profile-steps {text!r}: need 0 <= START < STOP")
    return start, stop


class JobLog:
    """Writes ``workerlog.<rank>`` (as ``workerlog.<rank>.partial`` until :meth:`close`); a no-op when
    ``log_dir`` is None. A failed write raises an :class:`OSError` naming the file."""

    def __init__(self, log_dir: str | None, *, rank: int, local_rank: int, world_size: int, pp: int, dp: int,
                 pp_rank: int, dp_rank: int, schedule: dict, costs: dict | None,
                 profile_steps: tuple[int, int] | None, machine: int = 0, run_id: str | None = None,
                 model: dict | None = None) -> None:
        self.window = profile_steps
        self.f = None
        self._open_window = False
        if log_dir is None:
            return
        self.path = os.path.join(log_dir, log_name(rank))
        try:
            os.makedirs(log_dir, exist_ok=True)
            self.f = open(self.path + PARTIAL_SUFFIX, "w")
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.path) from None
        self._write({"event": "meta", "rank": rank, "local_rank": local_rank, "world_size": world_size,
                     "pp": pp, "dp": dp, "pp_rank": pp_rank, "dp_rank": dp_rank, "machine": machine,
                     "host": socket.gethostname(), "schedule": schedule, "costs": costs,
                     "profile_steps": list(profile_steps) if profile_steps else None}
                    | ({"run_id": run_id} if run_id else {}) | ({"model": model} if model else {}))

    @property
    def enabled(self) -> bool:
        return self.f is not None

    def profiled(self, step: int) -> bool:
        return self.f is not None and self.window is not None and self.window[0] <= step < self.window[1]

    def begin_step(self, step: int) -> None:
        """Call right after the barrier that starts a profiled step."""
        if not self.profiled(step):
            return
        if not self._open_window:
            self._write({"event": "profile_start", "step": step, "t": time.time()})
            self._open_window = True
        self._write({"event": "sync", "step": step, "t": time.time()})

    def job(self, step: int, kind: str, mb: int, chunk: int, device: int, start: float, end: float, *,
            ready: float | None = None, done: float | None = None, tp_comm: float | None = None) -> None:
        ev = {"event": "job", "step": step, "kind": kind, "mb": mb, "chunk": chunk, "device": device,
              "start": start, "end": end}
        if ready is not None and done is not None:
            ev["ready"], ev["done"] = ready, done
        if tp_comm is not None:  # seconds the job waited for tensor-parallel collectives
            ev["tp_comm"] = tp_comm
        self._write(ev)

    def end_step(self, step: int, loss: float) -> None:
        if not self.profiled(step):
            return
        self._write({"event": "step_end", "step": step, "loss": loss, "t": time.time()})
        if step + 1 >= self.window[1]:
            self._close_window(self.window[1])

    def _close_window(self, step: int) -> None:
        if self._open_window:
            self._write({"event": "profile_stop", "step": step, "t": time.time()})
            self._open_window = False
        self.f.flush()

    def close(self, last_step: int | None = None) -> None:
        if self.f is None:
            return
        try:
            if self._open_window:
                self._close_window(last_step + 1 if last_step is not None else self.window[1])
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.path + PARTIAL_SUFFIX, self.path)
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.path) from None
        finally:
            self.f = None

    def _write(self, obj: dict) -> None:
        try:
            self.f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.path) from None
