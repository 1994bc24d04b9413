"""Per-layer cost model and its reduction to per-chunk :class:`~pipeloom.core.costs.Costs` (no torch).

Every layer has a forward time ``F``, an input-gradient time ``B``, a weight-gradient time ``W``
(all in the time unit of ``--costs comm``) and an activation memory ``mem`` (any unit; only
ratios matter) of which ``mem_b`` is freed by B (default ``mem / 2``; W frees the rest). The
embedding adds its costs to the first global chunk, the head (final norm + vocabulary
projection + loss) to the last.

Chunk k of a :class:`~.layout.Partition` costs the sum over its layers (plus embedding / head).
Memory is normalised to the simulator's unit, one full-stage microbatch activation::

    a_k = mem_k * pp / sum_j mem_j        (sum over all chunks = pp, average chunk = 1/vpp)

so a uniform partition of identical layers gives exactly the default ``MemModel`` (a = 1/vpp)
and ``--mem-limit 1p`` keeps meaning "1F1B's peak" for the average device.

Layer-cost file (``--layer-costs FILE``), JSON::

    {"layers": [{"F": 1.0, "B": 1.0, "W": 1.0, "mem": 1.0}, ...],     # one object per layer
     "embedding": {"F": 0.1, "B": 0.0, "W": 0.1, "mem": 0.0},         # optional
     "head": {"F": 2.6, "B": 2.6, "W": 2.6, "mem": 4.0}}              # optional

or ``"layers": {"count": 32, "F": 1, "B": 1, "W": 1, "mem": 1}`` for identical layers. In a layer
object only ``F`` is required: ``B`` and ``W`` default to ``F``, ``mem`` to 1 (0 for embedding
and head), ``mem_b`` to ``mem / 2``. CSV: a header naming ``F`` (and any of ``name``, ``B``,
``W``, ``mem``, ``mem_b``), one row per layer in order; rows named ``embedding`` / ``head`` are
those parts.

Defaults without a file (:func:`default_layer_costs`): identical layers scaled so that the
average chunk costs the ``--costs`` F/B/W (so ``--layers`` with a uniform split reproduces the
unpartitioned simulation exactly), a free embedding, and, if ``vocab`` and ``hidden`` are
given, a head costed from FLOP and activation ratios:

* time: vocabulary projection ``2*b*s*h*V`` FLOPs vs a transformer layer's
  ``24*b*s*h^2 * (1 + s/(6h))`` (Narayanan et al. 2021, "Efficient large-scale language model
  training on GPU clusters"), i.e. ``head/layer = V / (12*h*(1 + s/(6h)))`` for F, B and W alike
  (all three are one GEMM of the same size); the ``s/(6h)`` term is used only when ``seq`` is given.
* memory: 16-bit logits plus the fp32 copy the softmax cross-entropy keeps, ``6*s*b*V`` bytes, vs
  a layer's ``34*s*b*h`` bytes (Korthikanti et al. 2022 with selective recomputation), i.e.
  ``head/layer = 6*V / (34*h)``.

With a model (``--model``, a :class:`~pipeloom.models.config.ModelConfig`) the ratios come from
that model instead: time from :func:`pipeloom.models.flops.layer_flops` and
:func:`~pipeloom.models.flops.head_flops` (F, B and W each: ``head_F / layer_F`` ...), which for a
mixture-of-experts layer charges the router and the top-k routed experts (and shared experts), not
all experts; memory from :func:`activation_bytes_per_token` (16-bit, fused kernels, flash
attention: the analytic memory model's default training) for the layer vs ``6*V`` for the head.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Sequence

from ..core.costs import Costs, MemModel
from ..models.config import ModelConfig
from ..core.files import InputFileError, parse_json, read_input
from ..core.limits import MAX_FILE_BYTES, MAX_LAYERS, check_at_most
from .layout import Partition, PartitionError


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """Costs of one layer (or of the embedding / head) for one microbatch."""

    F: float = 0.0
    """forward time"""
    B: float = 0.0
    """input-gradient backward time"""
    W: float = 0.0
    """weight-gradient backward time"""
    mem: float = 0.0
    """activation memory kept from F until the backward (any unit; normalised per partition)"""
    mem_b: float | None = None
    """part of ``mem`` freed by B (default mem/2); W frees the rest"""

    def __post_init__(self) -> None:
        for name in ("F", "B", "W", "mem"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise PartitionError(f"layer cost {name} must be a finite number >= 0, got {v!r}")
        if self.mem_b is not None:
            v = self.mem_b
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v > self.mem + 1e-12:
                raise PartitionError(f"layer cost mem_b must lie in [0, mem={self.mem}], got {v!r}")

    @property
    def total(self) -> float:
        return self.F + self.B + self.W

    @property
    def freed_by_b(self) -> float:
        return self.mem / 2 if self.mem_b is None else self.mem_b

    def to_dict(self) -> dict:
        d = {"F": self.F, "B": self.B, "W": self.W, "mem": self.mem}
        if self.mem_b is not None:
            d["mem_b"] = self.mem_b
        return d


ZERO = LayerCost()


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """Costs of every layer in order, plus embedding and head."""

    layers: tuple[LayerCost, ...]
    embedding: LayerCost = ZERO
    head: LayerCost = ZERO
    source: str = field(default="default", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise PartitionError("the layer cost model has no layers; give at least one")
        check_at_most(f"{self.source}: the number of layers", len(self.layers), MAX_LAYERS)
        parts = (*self.layers, self.embedding, self.head)
        if not any(p.total > 0 for p in parts):
            raise PartitionError(f"{self.source}: F, B and W are 0 for every layer (and the embedding and head), so "
                                 f"every schedule takes no time; give some layer F, B or W > 0")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    # ------------------------------------------------------------------ per chunk
    def chunk_costs(self, part: Partition) -> dict[str, list[float]]:
        """Per global chunk F, B, W, total time, mem and mem_b (raw units), embedding/head included."""
        if part.num_layers != self.num_layers:
            raise PartitionError(f"the partition covers {part.num_layers} layers but the cost model has "
                                 f"{self.num_layers}; make --layers match the layer-cost file")
        out = {k: [] for k in ("F", "B", "W", "total", "mem", "mem_b")}
        last = part.num_chunks - 1
        # one column of floats per field, summed per chunk in layer order (then embedding, head): the
        # same additions as summing the LayerCost objects, without an attribute lookup per layer and field
        cols = {key: [getattr(x, key) for x in self.layers] for key in ("F", "B", "W", "mem")}
        cols["mem_b"] = [x.freed_by_b for x in self.layers]
        for k, layers in enumerate(part.chunks):
            ends = ([self.embedding] if k == 0 and part.embedding else []) + \
                ([self.head] if k == last and part.head else [])
            for key in ("F", "B", "W", "mem", "mem_b"):
                col = cols[key]
                vals = [col[i] for i in layers]
                vals += [p.freed_by_b if key == "mem_b" else getattr(p, key) for p in ends]
                out[key].append(sum(vals))
            out["total"].append(out["F"][-1] + out["B"][-1] + out["W"][-1])
        return out

    def costs(self, part: Partition, *, comm: float = 0.0, overlap: float = 0.0, chunk_costs: dict | None = None
              ) -> Costs:
        """Per-chunk :class:`Costs` (tuples indexed by global chunk) for the simulator and builders
        (``chunk_costs``: this partition's :meth:`chunk_costs`, when the caller already has them)."""
        c = chunk_costs if chunk_costs is not None else self.chunk_costs(part)
        return Costs(F=tuple(c["F"]), B=tuple(c["B"]), W=tuple(c["W"]), comm=comm, overlap=overlap)

    def mem_model(self, part: Partition, *, chunk_costs: dict | None = None) -> MemModel:
        """Per-chunk :class:`MemModel`, normalised so the chunks' a sum to pp (average chunk 1/vpp)."""
        c = chunk_costs if chunk_costs is not None else self.chunk_costs(part)
        total = sum(c["mem"])
        if total <= 0:
            return MemModel()
        scale = part.pp / total
        return MemModel(a=tuple(x * scale for x in c["mem"]), b=tuple(x * scale for x in c["mem_b"]))

    def to_dict(self) -> dict:
        return {"layers": [x.to_dict() for x in self.layers], "embedding": self.embedding.to_dict(),
                "head": self.head.to_dict()}


# ---------------------------------------------------------------------- constructors
def uniform_chunk_costs(seg_layer_num: Sequence[int], layer: tuple[float, float, float],
                        head: tuple[float, float, float] = (0.0, 0.0, 0.0),
                        embedding: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> tuple[list[float], list[float],
                                                                                        list[float]]:
    """Per global chunk (F, B, W) of layers that all cost ``layer`` = (F, B, W): ``n * layer`` for a chunk of
    ``n`` layers, ``embedding`` added to the first chunk and ``head`` to the last. The closed form of
    :meth:`LayerCosts.chunk_costs` for identical layers (a product where that one sums layer by layer in layer
    order, for layers that differ); ``pipeloom tune`` costs its chunks with it."""
    out = []
    for i in range(3):
        vals = [n * layer[i] for n in seg_layer_num]
        if embedding[i]:
            vals[0] += embedding[i]
        vals[-1] += head[i]
        out.append(vals)
    return out[0], out[1], out[2]


def head_ratios(vocab: int, hidden: int, seq: int | None = None) -> tuple[float, float]:
    """(time, memory) of the head relative to one transformer layer (formulas in the module docstring)."""
    for name, v in (("vocab", vocab), ("hidden", hidden)):
        if not isinstance(v, int) or v < 1:
            raise PartitionError(f"--{name} must be an integer >= 1, got {v!r}")
    if seq is not None and (not isinstance(seq, int) or seq < 1):
        raise PartitionError(f"--seq must be an integer >= 1, got {seq!r}")
    # FLOPs: head 2*b*s*h*V, layer 24*b*s*h^2*(1 + s/(6h))  (Narayanan et al. 2021)
    attn = 1.0 + (seq / (6.0 * hidden) if seq else 0.0)
    t = vocab / (12.0 * hidden * attn)
    # bytes: head 6*s*b*V (bf16 logits + fp32 for the loss), layer 34*s*b*h (Korthikanti et al. 2022, selective)
    m = 6.0 * vocab / (34.0 * hidden)
    return t, m


def activation_bytes_per_token(model: ModelConfig) -> float:
    """Bytes one token of one transformer layer saves for the backward: 16-bit activations, fused kernels
    (norm, SwiGLU), flash attention, no recompute; for MoE the router and the top-k routed copies.
    The same tensors as :func:`pipeloom.memory.analytic.layer_activations` lists for that training
    (tests check the two agree)."""
    e, h, q, kv, a = 2, model.hidden, model.q_dim, model.kv_dim, model.heads
    stat = 8 if model.norm == "layernorm" else 4

    def norm(width: int, rows: int = 1) -> float:
        return e * width * rows + stat * rows

    def mlp(ffn: int) -> float:                     # fc1 input excluded; activation input(s); fc2 input
        return (e if model.mlp == "gelu" else 2 * e) * ffn + e * ffn

    n = norm(h) + e * h + e * q + 2 * e * kv + 4 * a + e * q            # norm, qkv in, q, k, v, lse, proj in
    if hasattr(model, "kv_lora_rank"):  # DeepSeek's MLA: latents and per-head q, k, v of their own widths
        from ..models.families.deepseek import mla_bytes_per_token

        n = norm(h) + mla_bytes_per_token(model, e)
    if model.qk_norm:
        n += norm(model.head_dim, a) + norm(model.head_dim, model.kv_heads)
    if model.dropout > 0:
        n += 2 * h                                                       # two residual dropout masks
    n += norm(h)
    if not model.moe:
        return n + e * h + mlp(model.ffn)
    k = model.experts_per_token
    n += e * h + 4 * model.experts + 12 * k                              # router input, fp32 probs, top-k
    n += k * (e * h + mlp(model.expert_ffn))                             # per routed copy: in, MLP (weighted
    #                                                                      SwiGLU: the output is not kept)
    n += model.shared_experts * mlp(model.shared_expert_ffn)
    if model.shared_experts and model.shared_expert_gate:
        n += 4 + e * h
    return n


def default_layer_costs(num_layers: int, num_chunks: int, base: Costs | None = None, *, vocab: int | None = None,
                        hidden: int | None = None, seq: int | None = None,
                        model: ModelConfig | None = None) -> LayerCosts:
    """Identical layers whose average chunk costs ``base``'s F/B/W; optional head from vocab/hidden.

    ``model`` (a :class:`~pipeloom.models.config.ModelConfig`, e.g. a preset or a Hugging Face config)
    costs the head from that model's FLOPs and activations instead (module docstring); ``seq`` then
    replaces the model's sequence length in the attention FLOPs.
    """
    if model is not None:
        if (vocab, hidden) != (None, None):
            raise PartitionError("give the model or vocab/hidden, not both")
        return _model_layer_costs(model, num_layers, num_chunks, base, seq)
    base = base or Costs()
    if not base.is_uniform():
        raise PartitionError("--costs gives per-chunk F/B/W lists, which a layer partition replaces; give scalar "
                             "F,B,W (per average chunk) or a --layer-costs file")
    if not isinstance(num_layers, int) or num_layers < 1:
        raise PartitionError(f"--layers must be an integer >= 1, got {num_layers!r}")
    per = num_chunks / num_layers
    layer = LayerCost(F=float(base.F) * per, B=float(base.B) * per, W=float(base.W) * per, mem=1.0)
    head = ZERO
    if (vocab is None) != (hidden is None):
        raise PartitionError("give both --vocab and --hidden to cost the head (or neither)")
    if vocab is not None:
        t, m = head_ratios(vocab, hidden, seq)
        head = LayerCost(F=layer.F * t, B=layer.B * t, W=layer.W * t, mem=m)
    src = "uniform layers" + (f", head from vocab={vocab} hidden={hidden}" + (f" seq={seq}" if seq else "")
                              if vocab is not None else "")
    return LayerCosts(tuple([layer] * num_layers), ZERO, head, source=src)


def _model_layer_costs(model: ModelConfig, num_layers: int, num_chunks: int, base: Costs | None,
                       seq: int | None) -> LayerCosts:
    from ..models.flops import head_flops, layer_flops

    if seq is not None and (not isinstance(seq, int) or seq < 1):
        raise PartitionError(f"--seq must be an integer >= 1, got {seq!r}")
    uniform = default_layer_costs(num_layers, num_chunks, base)
    layer = uniform.layers[0]
    lf, lb, lw = layer_flops(model, 1, seq=seq)
    hf, hb, hw = head_flops(model, 1)
    head = LayerCost(F=layer.F * hf / lf, B=layer.B * hb / lb, W=layer.W * hw / lw,
                     mem=6.0 * model.vocab / activation_bytes_per_token(model))
    src = f"uniform layers, head from model {model.name} (FLOPs" + (f", seq={seq}" if seq else "") + ")"
    return LayerCosts(uniform.layers, ZERO, head, source=src)


def _layer_from(obj, where: str, default_mem: float) -> LayerCost:
    if not isinstance(obj, dict):
        raise PartitionError(f"{where}: expected an object like {{\"F\": 1, \"B\": 1, \"W\": 1, \"mem\": 1}}")
    unknown = set(obj) - {"F", "B", "W", "mem", "mem_b", "name", "count"}
    if unknown:
        raise PartitionError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed are F, B, W, mem, mem_b")
    if "F" not in obj:
        raise PartitionError(f"{where}: the forward time F is required")
    f = _num(obj["F"], where, "F")
    kw = dict(F=f, B=_num(obj.get("B", f), where, "B"), W=_num(obj.get("W", f), where, "W"),
              mem=_num(obj.get("mem", default_mem), where, "mem"))
    if obj.get("mem_b") is not None:
        kw["mem_b"] = _num(obj["mem_b"], where, "mem_b")
    try:
        return LayerCost(**kw)
    except PartitionError as e:
        raise PartitionError(f"{where}: {e}") from None


def _num(v, where: str, key: str) -> float:
    if isinstance(v, bool):
        raise PartitionError(f"{where}: {key} must be a number, got {v!r}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise PartitionError(f"{where}: {key} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0:
        raise PartitionError(f"{where}: {key} must be a finite number >= 0 (costs cannot be negative), got {v!r}")
    return x


def layer_costs_from_dict(data: dict, source: str = "dict") -> LayerCosts:
    if not isinstance(data, dict) or "layers" not in data:
        raise PartitionError(f"{source}: expected a JSON object with a 'layers' list (see pipeloom partition --help)")
    unknown = set(data) - {"layers", "embedding", "head", "format", "comment", "model"}
    if unknown:
        raise PartitionError(f"{source}: unknown key {sorted(unknown)[0]!r}; allowed are layers, embedding, head")
    raw = data["layers"]
    if isinstance(raw, dict):
        n = raw.get("count")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PartitionError(f"{source}: 'layers' as an object needs an integer 'count' >= 1")
        check_at_most(f"{source}: layers count", n, MAX_LAYERS)
        one = _layer_from(raw, f"{source}: layers", 1.0)
        layers = [one] * n
    elif isinstance(raw, list):
        if not raw:
            raise PartitionError(f"{source}: 'layers' is empty; give one object per layer")
        layers = [_layer_from(x, f"{source}: layer {i}", 1.0) for i, x in enumerate(raw)]
    else:
        raise PartitionError(f"{source}: 'layers' must be a list of objects or {{\"count\": N, \"F\": ...}}")
    emb = _layer_from(data["embedding"], f"{source}: embedding", 0.0) if data.get("embedding") else ZERO
    head = _layer_from(data["head"], f"{source}: head", 0.0) if data.get("head") else ZERO
    return _checked(LayerCosts(tuple(layers), emb, head, source=source))


def _checked(lc: LayerCosts) -> LayerCosts:
    """A file's costs: memory given as 0 everywhere is refused (a file's layers default to mem 1, so 0 was
    written on purpose, and memory is shared out in proportion to it: there is nothing to share)."""
    if not any(p.mem > 0 for p in (*lc.layers, lc.embedding, lc.head)):
        raise PartitionError(f"{lc.source}: mem is 0 for every layer (and the embedding and head); memory is "
                             f"shared out in proportion to mem, so give some layer mem > 0 (or leave mem out: 1 "
                             f"per layer)")
    return lc


def layer_costs_from_csv(text: str, source: str = "csv") -> LayerCosts:
    rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].lstrip().startswith("#")]
    if not rows:
        raise PartitionError(f"{source}: empty; expected a header like name,F,B,W,mem then one row per layer")
    cols = [c.strip() for c in rows[0]]
    low = {c.lower(): i for i, c in enumerate(cols)}
    if "f" not in low:
        raise PartitionError(f"{source}: the header {','.join(cols)!r} must name an F column "
                             f"(columns: name, F, B, W, mem, mem_b)")
    canon = {"f": "F", "b": "B", "w": "W", "mem": "mem", "mem_b": "mem_b", "name": "name"}
    bad = [c for c in low if c not in canon]
    if bad:
        raise PartitionError(f"{source}: unknown column {bad[0]!r}; allowed are name, F, B, W, mem, mem_b")
    dup = sorted(c for c in low if [x.lower() for x in cols].count(c) > 1)
    if dup:
        raise PartitionError(f"{source}: the header names column {dup[0]!r} twice; give each column once")
    check_at_most(f"{source}: the number of rows", len(rows) - 1, MAX_LAYERS + 2)
    layers, emb, head = [], ZERO, ZERO
    seen: dict[str, int] = {}  # row name -> the row (file line) that first gave it
    for n, row in enumerate(rows[1:], 2):
        obj = {}
        for c, i in low.items():
            if i < len(row) and row[i].strip() != "":
                obj[canon[c]] = row[i].strip()
        name = str(obj.pop("name", "")).lower()
        where = f"{source} row {n}"
        if name and name in seen:
            raise PartitionError(f"{where}: a second row named {name!r} (the first is row {seen[name]}); each "
                                 f"layer, the embedding and the head appear once")
        if name:
            seen[name] = n
        if name == "embedding":
            emb = _layer_from(obj, where, 0.0)
        elif name == "head":
            head = _layer_from(obj, where, 0.0)
        else:
            layers.append(_layer_from(obj, where, 1.0))
    if not layers:
        raise PartitionError(f"{source}: no layer rows (rows other than embedding/head)")
    return _checked(LayerCosts(tuple(layers), emb, head, source=source))


#: the largest layer-cost file read (bytes): 256 per layer at the layer cap
MAX_FILE_CHARS = MAX_FILE_BYTES["layer-cost file"]


def load_layer_costs(path: str) -> LayerCosts:
    """Read a layer-cost file (.json or .csv; format in the module docstring)."""
    try:  # bounded; not a regular file, not UTF-8, bad JSON, too deep, a key twice: one line naming the file
        text = read_input(path, "layer-cost file")
        if str(path).lower().endswith(".csv") or not text.lstrip().startswith(("{", "[")):
            try:
                return layer_costs_from_csv(text, source=str(path))
            except csv.Error as e:
                raise PartitionError(f"--layer-costs {path}: not a readable CSV file ({e})") from None
        data = parse_json(text, f"--layer-costs {path}")
    except InputFileError as e:
        raise PartitionError(str(e) if str(e).startswith("--layer-costs") else f"--layer-costs: {e}") from None
    return layer_costs_from_dict(data, source=str(path))
