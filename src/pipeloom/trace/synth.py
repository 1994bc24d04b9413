"""Synthetic worker logs: time a schedule, write it as per-rank job logs, inject trouble (no torch).

Used by the tests and the docs to exercise :mod:`pipeloom.trace.reader` and :mod:`pipeloom.trace.check`
without a cluster: a slow rank (its jobs take ``factor`` times longer), a rank that launches
late, clock skew between machines, jitter, steps outside the profiled window, malformed and
truncated lines, the worker-log text form, several machines and data-parallel replicas.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field

from ..core.ir import Schedule
from ..core.costs import Costs
from ..core.files import atomic_write
from ..sim.replay import dependencies, produces, replay
from ..schedule import io as schedule_io
from .writer import log_name


@dataclass(kw_only=True)
class SynthConfig:
    """What to write. Times: one cost unit lasts ``unit`` seconds."""

    costs: Costs = field(default_factory=Costs)
    """planned per chunk-pass costs (BW = B + W); comm is in cost units too"""
    unit: float = 0.004
    """seconds per cost unit"""
    profile_steps: tuple[int, int] = (3, 5)
    """profiled steps [start, stop); jobs of ``extra_steps`` steps before it are written too (to be dropped)"""
    extra_steps: int = 1
    slow: dict[int, float] = field(default_factory=dict)
    """global rank -> duration factor of all its jobs (1.8 = 80% slower)"""
    late_start: dict[int, float] = field(default_factory=dict)
    """global rank -> seconds of extra idle before its first job of every step"""
    jitter: float = 0.02
    """relative standard deviation of every job duration"""
    seed: int = 0
    dp: int = 1
    machines: int = 1
    """ranks split evenly over machines; >1 writes machine<k>/workerlog.<local rank>"""
    skew: dict[int, float] = field(default_factory=dict)
    """machine -> seconds its clock runs ahead of machine 0"""
    sync: bool = True
    """write sync events (without them readers align with P2P pairs)"""
    malformed: int = 0
    """garbage lines per file, plus a truncated last line when > 0"""
    text_form: bool = False
    """write the worker-log 'Profiler Info: Job ...' text lines (no meta, no sync) instead of JSON"""
    run_id: str = "synth"
    """the meta lines' run id (the same on every rank of one run)"""
    t_start: float = 1_763_884_800.0
    step_gap: float = 0.01
    """seconds between steps (optimizer, barrier)"""
    handoff: float | None = None
    """seconds a job takes to hand its outputs to the transport after it ends: when set, every job gets a
    ``done`` time (as pipeloom's CPU logs have), and a hand-off to another rank also waits until that rank
    has posted the receive (when it started the job before the consumer: a rendezvous transfer), so the
    ranks that send to a slow rank wait for it"""
    layers_per_chunk: list[int] | None = None
    """decoder layers of every global chunk, written as the meta line's ``model`` entry (None: no entry)"""
    slow_link: dict[tuple[int, int], float] = field(default_factory=dict)
    """(sending rank, receiving rank) -> extra seconds every hand-off between them takes (a slow link; needs
    ``handoff``)"""


def generate(schedule: Schedule, cfg: SynthConfig | None = None) -> dict[int, list[dict]]:
    """Per global rank the list of events (dicts in the log format; times on the true clock)."""
    cfg = cfg or SynthConfig()
    rng = random.Random(cfg.seed)
    pp, nc = schedule.pp, schedule.num_chunks
    dF, dB, dW = cfg.costs.per_chunk(nc)
    base = {"F": dF, "B": dB, "W": dW}
    a, b = cfg.profile_steps
    steps = list(range(max(0, a - cfg.extra_steps), b))
    events: dict[int, list[dict]] = {r: [] for r in range(pp * cfg.dp)}
    t = cfg.t_start
    for step in steps:
        step_begin = t
        for dpr in range(cfg.dp):
            durs, delays = [], []
            for d, seq in enumerate(schedule.devices):
                rank = dpr * pp + d
                f = cfg.slow.get(rank, 1.0)
                row = []
                for job in seq:
                    k, c = job.kind.value, job.chunk
                    cost = base["B"][c] + base["W"][c] if k == "BW" else base[k][c]
                    row.append(max(1e-6, cost * cfg.unit * f * (1.0 + cfg.jitter * rng.gauss(0.0, 1.0))))
                durs.append(row)
                delays.append([cfg.late_start.get(rank, 0.0)] + [0.0] * (len(seq) - 1))
            rp = replay(schedule, durs, comm=cfg.costs.comm * cfg.unit, delays=delays)
            done = None
            if cfg.handoff is not None:  # the rank holds each job until its hand-off is done: re-time to a fixpoint
                hold = [[cfg.handoff] * len(row) for row in durs]
                for _ in range(HANDOFF_ROUNDS):
                    rp = replay(schedule, [[x + h for x, h in zip(rd, rh)] for rd, rh in zip(durs, hold)],
                                comm=cfg.costs.comm * cfg.unit, delays=delays)
                    done = _handoffs(schedule, rp, durs, cfg, dpr)
                    new = [[t - (s + x) for t, s, x in zip(rt, rs, rd)] for rt, rs, rd in zip(done, rp.start, durs)]
                    if max(abs(a - b) for ra, rb in zip(new, hold) for a, b in zip(ra, rb)) < 1e-9:
                        break
                    hold = new
                else:  # the holds keep growing: ranks wait for each other's receives in a cycle
                    raise ValueError(f"handoff: the rendezvous hand-offs of {schedule.name} (pp={pp}, "
                                     f"vpp={schedule.vpp}) never settle: its ranks would wait for each other's "
                                     f"receives in a cycle; use handoff=None for this schedule")
                rp.end = [[s + x for s, x in zip(rs, rd)] for rs, rd in zip(rp.start, durs)]
            for d, seq in enumerate(schedule.devices):
                rank = dpr * pp + d
                ev = events[rank]
                if step == a:
                    ev.append({"event": "profile_start", "step": step, "t": step_begin - 2e-4})
                if a <= step:
                    ev.append({"event": "sync", "step": step, "t": step_begin - 1e-4 + rng.uniform(0, 2e-5)})
                for i, job in enumerate(seq):
                    ev.append({"event": "job", "step": step, "kind": job.kind.value, "mb": job.mb,
                               "chunk": job.chunk, "device": d, "start": step_begin + rp.start[d][i],
                               "end": step_begin + rp.end[d][i]}
                              | ({"ready": step_begin + rp.start[d][i], "done": step_begin + done[d][i]}
                                 if done is not None else {}))
                ev.append({"event": "step_end", "step": step, "loss": 2.0, "t": step_begin + rp.makespan})
            t = max(t, step_begin + rp.makespan)
        t += cfg.step_gap
    for rank in events:
        events[rank].append({"event": "profile_stop", "step": b, "t": t})
    return events


HANDOFF_ROUNDS = 50


def _handoffs(schedule: Schedule, rp, durs: list[list[float]], cfg: SynthConfig, dpr: int) -> list[list[float]]:
    """Per job its ``done`` time (see :attr:`SynthConfig.handoff`): end (``rp`` start + ``durs``) + hand-off, not
    before every rank that consumes its output has posted the receive (when the consumer's previous job
    started), plus a slow link's extra time."""
    pp, nc = schedule.pp, schedule.num_chunks
    consumers: dict[tuple, list[tuple[int, int]]] = {}
    for d, seq in enumerate(schedule.devices):
        for i, job in enumerate(seq):
            for ev in dependencies(job, nc):
                consumers.setdefault(ev, []).append((d, i))
    out = []
    for d, seq in enumerate(schedule.devices):
        row = []
        for i, job in enumerate(seq):
            t = rp.start[d][i] + durs[d][i] + cfg.handoff
            for ev in produces(job):
                for cd, ci in consumers.get(ev, []):
                    if cd == d:
                        continue
                    posted = rp.start[cd][ci - 1] if ci > 0 else 0.0
                    t = max(t, posted + cfg.handoff)
                    t += cfg.slow_link.get((dpr * pp + d, dpr * pp + cd), 0.0)
            row.append(t)
        out.append(row)
    return out


def write_logs(out_dir: str, schedule: Schedule, cfg: SynthConfig | None = None) -> list[str]:
    """Write synthetic worker logs for ``schedule`` into ``out_dir``; return the file paths."""
    cfg = cfg or SynthConfig()
    rng = random.Random(cfg.seed + 1)
    events = generate(schedule, cfg)
    world = schedule.pp * cfg.dp
    per_machine = -(-world // cfg.machines)
    paths = []
    for rank, evs in events.items():
        machine, local = divmod(rank, per_machine)
        skew = cfg.skew.get(machine, 0.0)
        if cfg.machines > 1:
            d = os.path.join(out_dir, f"machine{machine}")
            name = log_name(local)
        else:
            d, name = out_dir, log_name(rank)
        os.makedirs(d, exist_ok=True)
        lines = []
        pp_rank, dp_rank = rank % schedule.pp, rank // schedule.pp
        if cfg.text_form:
            lines.append(f"[INFO] worker {rank} starting, pp_rank={pp_rank}")
            jid = 0
            local_of = {c: i for i, c in enumerate(schedule.chunks_of(pp_rank))}
            for e in evs:
                if e["event"] != "job":
                    continue
                typ = {"F": "forward", "BW": "backward"}.get(e["kind"], e["kind"])
                ch = f", chunk = {local_of[e['chunk']]}" if schedule.vpp > 1 else ""
                lines.append(f"Profiler Info: Job ({jid}), type = {typ}, micro_batch_id = {e['mb']}, "
                             f"job_start_time = {e['start'] + skew:.6f}, job_end_time = {e['end'] + skew:.6f}{ch}")
                jid += 1
                if e["kind"] != "F" and e["mb"] == schedule.microbatches - 1 and rng.random() < 0.5:
                    lines.append("[INFO] loss 2.0000, lr 1e-4")
        else:
            meta = {"event": "meta", "rank": rank, "local_rank": local, "world_size": world, "pp": schedule.pp,
                    "dp": cfg.dp, "pp_rank": pp_rank, "dp_rank": dp_rank, "machine": machine,
                    "host": f"node{machine}", "schedule": schedule_io.to_dict(schedule), "costs": cfg.costs.to_dict(),
                    "profile_steps": list(cfg.profile_steps), "run_id": cfg.run_id}
            if cfg.layers_per_chunk is not None:
                meta["model"] = {"layers": sum(cfg.layers_per_chunk), "layers_per_chunk": list(cfg.layers_per_chunk)}
            lines.append(json.dumps(meta))
            for e in evs:
                if e["event"] == "sync" and not cfg.sync:
                    continue
                e = dict(e)
                for k in ("t", "start", "end", "ready", "done"):
                    if k in e:
                        e[k] = e[k] + skew
                lines.append(json.dumps(e))
        for _ in range(cfg.malformed):
            pos = rng.randrange(1, len(lines))
            lines.insert(pos, rng.choice(['{"event": "job", "step": 3, "kind": "F", "mb": ', "{not json at all",
                                          '{"event": "job", "step": 3, "kind": "X", "mb": 0, "chunk": 0, '
                                          '"start": 1.0, "end": 2.0}',
                                          "Profiler Info: Job (7), type = F, micro_batch_id = ?"]))
        text = "\n".join(lines) + "\n"
        if cfg.malformed:
            text += '{"event": "job", "step": 4, "kind": "B", "mb": 1, "chu'  # truncated last line
        path = os.path.join(d, name)
        with atomic_write(path) as fh:
            fh.write(text)
        paths.append(path)
    return paths
