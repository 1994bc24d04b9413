"""Op-level traces of Megatron-style trainers (dp x tp x pp): read a per-op table into numpy columns (no torch).

The table has one row per recorded operation, the schema of Lin et al., "Understanding Stragglers in
Large Model Training Using What-if Analysis" (OSDI 2025):

    dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id

``stage`` is the pipeline rank, ``mc`` the model chunk within the stage (VPP), ``gmc`` the global chunk
(``mc * pp + stage`` for interleaved placement), ``mb_id`` the microbatch (valid for the compute ops),
``seq_id`` numbers the ops of one type of one worker in one step in start order. Optypes known to the
dependency model (:mod:`.whatif`): forward-compute, backward-compute, backward-weight-compute (the W half of
a split backward), forward-send, forward-recv, backward-send, backward-recv, grads-reduce-scatter,
params-all-gather, separate-grads-all-reduce, embedding-grads-all-reduce, layernorm-grads-all-reduce,
optimizer, optimizer-clip-main-grad, gc; any other optype is kept as an opaque op of its worker.
Often only one rank of each (dp, stage) worker is recorded.

Files: Parquet (``.parquet``/``.pq``) or CSV (``.csv``, ``.csv.gz``), read with pyarrow (imported only
here, when such a file is read). Sizes (``dp_size, pp_size, tp_size, vpp_size, world_size``) come from a
meta file (YAML or JSON, ``--meta``; ``META.yaml`` beside the trace is not guessed) or are inferred from
the table. Rows with a missing or non-numeric required field, a negative or non-finite duration or
time, or a rank outside the sizes are malformed: counted, a few shown, dropped; never fatal.

Sizes come from what the table holds, checked against the meta, with caps (:data:`SIZE_CAPS`): a meta size
beyond its cap is refused; a dp_rank or stage far beyond the other rows' (more than twice the number of
distinct values below it, plus 16) is a malformed row, not a reason to model millions of empty workers; the
analysis covers the dp ranks and stages the rows hold. Ranks may carry a sequence/context dimension
(``cp_size``, also read as ``dsp_size``): ``world_size = dp * pp * tp * cp``.

A trace that cannot be a real run is refused with one line naming what is wrong (:func:`check_plausible`):
no op type the dependency model knows, no forward or backward compute, a duration or step longer than a day,
most durations zero or nearly all ops starting at the instant of the previous one, no step that takes any time.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ...core.files import check_input, read_input

REQUIRED = ("dp_rank", "stage", "step", "optype", "start_ts", "duration")
OPTIONAL = ("rank", "seq_id", "mc", "gmc", "mb_id")
COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id")
SIZE_KEYS = ("dp_size", "pp_size", "tp_size", "vpp_size", "cp_size", "world_size")
SIZE_ALIASES = {"dsp_size": "cp_size"}
"""other names of a size in meta files (the published traces' ``dsp_size``: a two-way sequence split)"""
SIZE_CAPS = {"dp_size": 1 << 20, "pp_size": 4096, "tp_size": 4096, "vpp_size": 1024, "cp_size": 4096,
             "world_size": 1 << 24}
"""the largest size a meta file may give (and a trace's table may imply)"""
SPARSE_SLACK = 16
"""a rank value is 'far beyond' the others when it exceeds twice the count of distinct values below it + this"""
MAX_DAY = {"s": 86_400.0, "ms": 86_400e3, "us": 86_400e6, "ns": 86_400e9}
"""a day in each time unit: no op or step of a real run lasts longer"""
MAX_ZERO_SHARE = 0.5
"""more of the ops than this lasting exactly 0 is a clock that does not advance"""
MAX_SAME_SHARE = 0.9
"""more of the ops than this starting at the very instant of the op before them on their worker, likewise
(a batch of asynchronous sends and recvs launched together shares an instant, so half of them can)"""
TRACE_EXTS = (".parquet", ".pq", ".csv", ".csv.gz")
MAX_EXAMPLES = 5
WEIGHT_GRAD_OP = "backward-weight-compute"
"""the weight-gradient half of a split backward (zero-bubble W): compute of its worker, no pipeline edge (nothing
on another stage waits for it)"""
COMPUTE_OPS = ("forward-compute", "backward-compute", WEIGHT_GRAD_OP)
SEND_OF_RECV = {"forward-recv": "forward-send", "backward-recv": "backward-send"}
P2P_OPS = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COLLECTIVES = ("grads-reduce-scatter", "params-all-gather", "separate-grads-all-reduce")
PP_EDGE_COLLECTIVES = ("embedding-grads-all-reduce",)
GLOBAL_COLLECTIVES = ("optimizer-clip-main-grad",)
KNOWN_OPS = COMPUTE_OPS + tuple(SEND_OF_RECV) + tuple(SEND_OF_RECV.values()) + DP_COLLECTIVES + \
    PP_EDGE_COLLECTIVES + GLOBAL_COLLECTIVES + ("layernorm-grads-all-reduce", "optimizer", "gc")
"""the op types the dependency model (:mod:`.opmodel`) knows; any other is an opaque op of its worker"""


class OpTraceError(ValueError):
    """The file cannot be read as an op trace at all (message names the file)."""


@dataclass
class OpTrace:
    """The rows of an op trace as numpy columns (one entry per kept row), plus what reading found."""

    path: str
    dp: np.ndarray
    stage: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    op: np.ndarray
    """optype code: index into :attr:`optypes`"""
    optypes: list[str]
    start: np.ndarray
    dur: np.ndarray
    seq: np.ndarray
    mc: np.ndarray
    gmc: np.ndarray
    mb: np.ndarray
    """-1 where the column is absent or the value missing"""
    sizes: dict
    inferred: list[str] = field(default_factory=list)
    """size keys not given by the meta file"""
    malformed: int = 0
    examples: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    time_unit: str = "ms"
    rows: int = 0
    """rows in the file (kept + malformed)"""
    pair: np.ndarray | None = None
    """overlapped-pair id per row (-1: none; rows of one worker and step with one id ran together), or None;
    not a column of the file format: set for run logs (:mod:`pipeloom.trace.runops`)"""
    variant: np.ndarray | None = None
    """per row a sub-kind of its optype with its own typical duration (run logs: B and BW jobs are both
    backward-compute), or None"""

    def __len__(self) -> int:
        return int(self.dur.shape[0])

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in np.unique(self.step)]

    def summary(self) -> dict:
        return {"path": self.path, "rows": self.rows, "ops": len(self), "malformed_rows": self.malformed,
                "malformed_examples": self.examples, "sizes": self.sizes, "inferred_sizes": self.inferred,
                "steps": len(self.steps), "optypes": self.optypes, "time_unit": self.time_unit,
                "warnings": self.warnings}


def is_op_trace(path: str) -> bool:
    """Whether ``path`` names an op-trace file by its extension (the check command's dispatch)."""
    low = path.lower()
    return os.path.isfile(path) and any(low.endswith(e) for e in TRACE_EXTS)


def load_meta(path: str) -> dict:
    """The sizes (and optional ``time_unit``) from a YAML or JSON meta file."""
    try:
        text = read_input(path, "op-trace meta file")  # bounded, regular files only (core/files.py)
    except OSError as e:
        raise OpTraceError(f"cannot read meta file {path}: {e.strerror}") from None
    try:
        if path.lower().endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError, json.JSONDecodeError
        raise OpTraceError(f"meta file {path} is not valid {'JSON' if path.lower().endswith('.json') else 'YAML'}: "
                           f"{str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise OpTraceError(f"meta file {path} must hold a mapping with {', '.join(SIZE_KEYS)}")
    out = {}
    for alias, k in SIZE_ALIASES.items():
        if alias in data and k not in data:
            data = dict(data, **{k: data[alias]})
    for k in SIZE_KEYS:
        if k in data and data[k] is not None:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise OpTraceError(f"meta file {path}: {k} must be a positive integer, got {v!r}")
            if v > SIZE_CAPS[k]:
                raise OpTraceError(f"meta file {path}: {k} {v} is beyond what pipeloom analyses (at most "
                                   f"{SIZE_CAPS[k]})")
            out[k] = v
    if "time_unit" in data:
        if data["time_unit"] not in ("s", "ms", "us", "ns"):
            raise OpTraceError(f"meta file {path}: time_unit must be one of s, ms, us, ns, got {data['time_unit']!r}")
        out["time_unit"] = data["time_unit"]
    return out


# ------------------------------------------------------------------------------------------ reading
_NUM_RE = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def _read_table(path: str):
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a declared extra
        raise OpTraceError(f"reading {path} needs pyarrow (pip install 'pipeloom[arrow]')") from None
    low = path.lower()
    check_input(path, "op trace")  # a regular file under the cap (core/files.py)
    try:
        if low.endswith((".parquet", ".pq")):
            schema = pq.read_schema(path)
            cols = [c for c in COLUMNS if c in schema.names]
            return pq.read_table(path, columns=cols), []
        # CSV: every column as text first, so one bad value makes one malformed row, not a failed read
        import csv
        import gzip

        opener = gzip.open if low.endswith(".gz") else open
        with opener(path, "rt", newline="", encoding="utf-8-sig") as fh:  # a BOM is no part of the first name
            names = next(csv.reader(fh), [])
        types = {n: pa.string() for n in names}
        skipped: list[int] = []

        def skip(row) -> str:
            skipped.append(row.number if row.number is not None else -1)
            return "skip"

        t = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            column_types=types, include_columns=[c for c in COLUMNS if c in names], strings_can_be_null=True),
            parse_options=pcsv.ParseOptions(invalid_row_handler=skip))
        out = {}
        for c in t.column_names:
            col = t.column(c)
            if c == "optype":
                out[c] = col
                continue
            ok = pc.fill_null(pc.match_substring_regex(col, _NUM_RE), False)
            out[c] = pc.cast(pc.utf8_trim_whitespace(pc.if_else(ok, col, pa.scalar(None, pa.string()))), pa.float64())
        return pa.table(out), skipped
    except OpTraceError:
        raise
    except Exception as e:
        kind = "Parquet" if low.endswith((".parquet", ".pq")) else "CSV"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OpTraceError(f"{path} is not a readable {kind} op trace: {msg}") from None


def infer_time_unit(tr: "OpTrace") -> str | None:
    """The time unit of a trace whose meta names none, from its typical forward: one microbatch's forward of a
    pipeline chunk lasts between about a millisecond and ten seconds on any accelerator, so a median
    forward-compute duration below 1 reads as seconds, below 10^4 as ms, below 10^7 as us, else ns (the
    published straggler-analysis traces are in seconds and their metas say nothing). None: no forward op with a
    positive duration to go by."""
    if "forward-compute" not in tr.optypes:
        return None
    fwd = tr.dur[(tr.op == tr.optypes.index("forward-compute")) & (tr.dur > 0) & np.isfinite(tr.dur)]
    if not len(fwd):
        return None
    d = float(np.median(fwd))
    return "s" if d < 1 else "ms" if d < 1e4 else "us" if d < 1e7 else "ns"


def find_meta(path: str) -> str | None:
    """The meta file published beside an op trace, when there is exactly one by the usual names:
    ``meta-X.yaml`` (``.yml``, ``.json``) beside ``trace-X.parquet`` (the straggler-analysis artifact's naming), or
    ``STEM.meta.yaml`` (``.yml``, ``.json``) beside ``STEM.parquet``/``STEM.csv``; None otherwise."""
    folder, name = os.path.split(path)
    stem = name.rsplit(".", 1)[0]
    stems = [f"{stem}.meta"] + ([f"meta-{stem[len('trace-'):]}"] if stem.startswith("trace-") else [])
    found = [os.path.join(folder, s + ext) for s in stems for ext in (".yaml", ".yml", ".json")
             if os.path.isfile(os.path.join(folder, s + ext))]
    return found[0] if len(found) == 1 else None


def read_optrace(path: str, meta: str | dict | None = None) -> OpTrace:
    """Read an op trace (Parquet or CSV) and its sizes; malformed rows are counted and dropped."""
    import pyarrow as pa

    table, skipped = _read_table(path)
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise OpTraceError(f"{path} lacks the op-trace column(s) {', '.join(missing)}; an op trace has "
                           f"{', '.join(COLUMNS)} (rank, seq_id, mc, gmc, mb_id optional)")
    given = load_meta(meta) if isinstance(meta, str) else dict(meta or {})
    n = table.num_rows

    def num(name: str) -> np.ndarray:
        if name not in table.column_names:
            return np.full(n, np.nan)
        col = table.column(name)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
            import pyarrow.compute as pc

            try:
                col = pc.cast(col, pa.float64())
            except Exception:
                raise OpTraceError(f"{path}: column {name} is {col.type}, not numbers") from None
        return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    cols = {c: num(c) for c in COLUMNS if c != "optype"}
    optcol = table.column("optype")
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(optcol.type):
        optcol = pc.cast(optcol, pa.string())
        optcol = pc.dictionary_encode(optcol)
    optcol = optcol.combine_chunks() if hasattr(optcol, "combine_chunks") else optcol
    names = [str(x) for x in optcol.dictionary.to_pylist()]
    codes = optcol.indices.to_numpy(zero_copy_only=False)
    codes = np.where(np.asarray(optcol.is_null().to_numpy(zero_copy_only=False)), -1,
                     np.nan_to_num(codes.astype(np.float64), nan=-1)).astype(np.int64)

    bad = np.zeros(n, dtype=bool)
    reasons: list[tuple[np.ndarray, str]] = []

    def flag(mask: np.ndarray, why: str) -> None:
        mask = mask & ~bad
        if mask.any():
            reasons.append((mask, why))
            bad[:] |= mask

    for c in ("dp_rank", "stage", "step", "start_ts", "duration"):
        flag(~np.isfinite(cols[c]), f"{c} missing or not a number")
    flag(codes < 0, "optype missing")
    flag(cols["duration"] < 0, "negative duration")
    for c in ("dp_rank", "stage", "step"):
        v = cols[c]
        flag(np.isfinite(v) & ((v < 0) | (v != np.floor(v))), f"{c} not a non-negative integer")
    for c in ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "gmc", "mb_id"):  # int64 keys: no overflow
        flag(np.abs(np.nan_to_num(cols[c])) > (1 << 31) - 1, f"{c} above {(1 << 31) - 1} (not an index)")
    # sizes: from what the table holds (only well-formed rows count), checked against the meta, with caps
    ok = ~bad
    sizes, inferred, warnings = {}, [], []
    for c, key in (("dp_rank", "dp_size"), ("stage", "pp_size")):
        ext, beyond = _extent(cols[c][ok])
        cap = min(given.get(key, SIZE_CAPS[key]), SIZE_CAPS[key])
        if beyond is not None or ext > cap:
            lim = min(ext, cap)
            flag(cols[c] >= lim, f"{c} far beyond the other rows' (0..{lim - 1})" if key not in given or lim < cap
                 else f"{c} >= {key} {cap}")
        ok = ~bad
    dp_rows = int(cols["dp_rank"][ok].max()) + 1 if ok.any() else 1
    pp_rows = int(cols["stage"][ok].max()) + 1 if ok.any() else 1
    dp_size, pp_size = given.get("dp_size", dp_rows), given.get("pp_size", pp_rows)
    for k, v, have in (("dp_size", dp_size, dp_rows), ("pp_size", pp_size, pp_rows)):
        sizes[k] = v
        if k not in given:
            inferred.append(k)
        elif have < v:
            warnings.append(f"the trace holds {k.split('_')[0]} ranks 0..{have - 1} of the meta's {k} {v}: the "
                            f"analysis covers those")
    if "vpp_size" in given:
        sizes["vpp_size"] = given["vpp_size"]
    else:
        v = 1
        for c in ("mc", "gmc"):
            a = cols[c][ok]
            a = a[np.isfinite(a) & (a >= 0)]
            if a.size:
                ext, _ = _extent(a)
                v = max(v, ext if c == "mc" else -(-ext // pp_size))
        sizes["vpp_size"] = min(v, SIZE_CAPS["vpp_size"])
        inferred.append("vpp_size")
    rk = cols["rank"][ok]
    per_worker = 1
    fin = np.isfinite(rk) & (rk >= 0)
    if fin.any():
        w = (cols["dp_rank"][ok] * pp_size + cols["stage"][ok])[fin]
        pairs = np.unique(np.stack([w, rk[fin]], axis=1), axis=0)
        per_worker = int(np.unique(pairs[:, 0], return_counts=True)[1].max())
    cp = given.get("cp_size", 1)
    sizes["cp_size"] = cp
    if "cp_size" not in given:
        inferred.append("cp_size")
    if "tp_size" in given:
        sizes["tp_size"] = given["tp_size"]
    elif "world_size" in given and given["world_size"] % (dp_size * pp_size * cp) == 0:
        sizes["tp_size"] = given["world_size"] // (dp_size * pp_size * cp)
        inferred.append("tp_size")
    else:
        sizes["tp_size"] = max(1, per_worker // cp) if per_worker % cp == 0 else per_worker
        inferred.append("tp_size")
    sizes["world_size"] = given.get("world_size") or dp_size * pp_size * sizes["tp_size"] * cp
    if "world_size" not in given:
        inferred.append("world_size")
    if sizes["world_size"] != dp_size * pp_size * sizes["tp_size"] * cp:
        warnings.append(f"world_size {sizes['world_size']} != dp_size*pp_size*tp_size*cp_size = "
                        f"{dp_size * pp_size * sizes['tp_size'] * cp} (other parallel dimensions are not modelled)")
    examples = []
    if skipped:
        examples.append(f"line {skipped[0]}: wrong number of fields ({len(skipped)} row(s))")
    for mask, why in reasons:
        idx = np.flatnonzero(mask)
        if len(examples) < MAX_EXAMPLES:
            examples.append(f"row {int(idx[0]) + 1}: {why} ({len(idx)} row(s))")
    keep = ~bad

    def ints(a: np.ndarray) -> np.ndarray:
        a = a[keep]
        return np.where(np.isfinite(a), a, -1).astype(np.int64)

    tr = OpTrace(path=path, dp=ints(cols["dp_rank"]), stage=ints(cols["stage"]), rank=ints(cols["rank"]),
                 step=ints(cols["step"]), op=codes[keep], optypes=names, start=cols["start_ts"][keep].copy(),
                 dur=cols["duration"][keep].copy(), seq=ints(cols["seq_id"]), mc=ints(cols["mc"]),
                 gmc=ints(cols["gmc"]), mb=ints(cols["mb_id"]), sizes=sizes, inferred=inferred,
                 malformed=int(bad.sum()) + len(skipped), examples=examples, warnings=warnings,
                 time_unit=given.get("time_unit", "ms"), rows=n + len(skipped))
    if "time_unit" not in given and len(tr):
        unit = infer_time_unit(tr)
        if unit is not None and unit != tr.time_unit:
            tr.time_unit = unit
            tr.inferred.append("time_unit")
    if tr.malformed:
        tr.warnings.append(f"{path}: {tr.malformed} malformed row(s) skipped ({'; '.join(examples[:2])})")
    if not len(tr):
        raise OpTraceError(f"{path}: no well-formed op rows ({tr.malformed} malformed)")
    check_plausible(tr)
    return tr


def _extent(v: np.ndarray) -> tuple[int, int | None]:
    """(size the values support, the first value far beyond the others or None) of non-negative integers:
    value u_i (the i-th distinct, ascending) is far beyond when u_i >= 2 * i + SPARSE_SLACK."""
    u = np.unique(v)
    if not u.size:
        return 1, None
    far = u >= 2 * np.arange(u.size) + SPARSE_SLACK
    if not far.any():
        return int(u[-1]) + 1, None
    i = int(np.argmax(far))
    return (int(u[i - 1]) + 1 if i else 1), int(u[i])


def check_plausible(tr: OpTrace) -> None:
    """Refuse a trace no real run could have written, with one line naming what is wrong (no verdict on it)."""
    present = sorted({tr.optypes[c] for c in np.unique(tr.op).tolist()})
    known = [x for x in present if x in KNOWN_OPS]
    shown = ", ".join(present[:5]) + (f" (+{len(present) - 5} more)" if len(present) > 5 else "")
    if not known:
        raise OpTraceError(f"{tr.path}: none of its op types ({shown}) is one the dependency model knows "
                           f"({', '.join(KNOWN_OPS[:4])}, ...): no verdict")
    if not any(x in COMPUTE_OPS for x in present):
        raise OpTraceError(f"{tr.path}: no compute op ({', '.join(COMPUTE_OPS)}) among its op types ({shown}): "
                           f"nothing to compare a slowdown with; no verdict")
    if "forward-compute" not in present or not any(x in COMPUTE_OPS[1:] for x in present):
        half = "forward" if "forward-compute" not in present else "backward"
        raise OpTraceError(f"{tr.path}: no {half} compute among its op types ({shown}): a training step has both "
                           f"forward-compute and backward-compute; no verdict")
    day = MAX_DAY.get(tr.time_unit, MAX_DAY["ms"])
    i = int(np.argmax(tr.dur))
    if tr.dur[i] > day:
        raise OpTraceError(f"{tr.path}: a {tr.optypes[tr.op[i]]} op of step {tr.step[i]} lasts {tr.dur[i]:.3g} "
                           f"{tr.time_unit}, more than a day: not a real time; no verdict")
    zero = int((tr.dur <= 0).sum())
    if zero > MAX_ZERO_SHARE * len(tr):
        raise OpTraceError(f"{tr.path}: {zero} of {len(tr)} ops last 0 {tr.time_unit}: these times cannot be real "
                           f"(a clock that does not advance); no verdict")
    o = np.lexsort((tr.start, tr.rank, tr.stage, tr.dp, tr.step))
    grp = np.r_[False, (np.diff(tr.step[o]) == 0) & (np.diff(tr.dp[o]) == 0) & (np.diff(tr.stage[o]) == 0)
                & (np.diff(tr.rank[o]) == 0)]
    same = int((grp & np.r_[False, np.diff(tr.start[o]) == 0]).sum())
    if same > MAX_SAME_SHARE * max(int(grp.sum()), 1) and same > 1:
        raise OpTraceError(f"{tr.path}: {same} of {len(tr)} ops start at the very instant of the op before them on "
                           f"their worker: these times cannot be real (a clock that does not advance); no verdict")
    steps, k = np.unique(tr.step, return_inverse=True)
    lo = np.full(len(steps), np.inf)
    hi = np.full(len(steps), -np.inf)
    np.minimum.at(lo, k, tr.start)
    np.maximum.at(hi, k, tr.start + tr.dur)
    span = hi - lo
    j = int(np.argmax(span))
    if not np.isfinite(span[j]) or span[j] > day:
        raise OpTraceError(f"{tr.path}: step {steps[j]} spans {span[j]:.3g} {tr.time_unit} from its first op to its "
                           f"last, more than a day: not a real time (one clock far off?); no verdict")
    if not (span > 0).any():
        raise OpTraceError(f"{tr.path}: no step takes any time (every op starts and ends at once); no verdict")
