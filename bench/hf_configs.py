"""Benchmark: parameter counts of published Hugging Face configs, pipeloom vs transformers.

For every config.json shipped with pipeloom (src/pipeloom/models/hf_configs/), compare

* ours          ``total_params`` of ``pipeloom memory --model FILE --json`` (the file read as JSON, no transformers),
* transformers  ``sum(p.numel() for p in model.parameters())`` of ``AutoModelForCausalLM.from_config`` built on
                the meta device (tied weights counted once),
* active        :func:`pipeloom.models.flops.active_params`: the parameters one token goes through (MoE: top-k
                experts), which is what MoE model cards publish as "active",

next to the nominal size the model's name or card publishes.

    .venv/bin/python bench/hf_configs.py [--out docs/bench/hf_configs.md]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time

from _harness import write_text

#: nominal sizes as published (model name / model card)
NOMINAL = {
    "Llama-2-7b": "7B",
    "Meta-Llama-3-8B": "8B",
    "Mistral-7B-v0.1": "7B (7.24B on the card)",
    "Mixtral-8x7B-v0.1": "46.7B, 12.9B active",
    "Qwen1.5-MoE-A2.7B": "14.3B, 2.7B active",
    "Qwen2-0.5B": "0.49B",
    "Qwen2-7B": "7.07B (one embedding matrix counted)",
    "Qwen3-8B": "8.2B",
    "Qwen3-30B-A3B": "30.5B, 3.3B active",
    "gpt2": "124M (117M in the GPT-2 paper)",
    "DeepSeek-V2-Lite": "15.7B, 2.4B active (without the embedding)",
    "DeepSeek-V3": "671B, 37B active (36.6B without the embedding); + 11.5B MTP module",
    "gemma-7b": "8.54B (7,751,248,896 non-embedding)",
    "gemma-2-9b": "9.24B (8,324,201,984 non-embedding)",
    "Phi-3-mini-4k-instruct": "3.8B",
}

COMMAND = ".venv/bin/python bench/hf_configs.py --out docs/bench/hf_configs.md"


def ours(path) -> int:
    from pipeloom.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["memory", "--model", str(path), "--pp", "1", "-m", "1", "--json"])
    if rc not in (0, 1):
        raise SystemExit(f"pipeloom memory failed on {path}")
    return json.loads(buf.getvalue())["total_params"]


def theirs(path) -> int:
    import torch
    import transformers

    conf = transformers.AutoConfig.for_model(**json.loads(path.read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for p in model.parameters())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the markdown page here (default: print the table)")
    args = ap.parse_args(argv)
    import transformers

    from pipeloom.models.flops import active_params
    from pipeloom.models.hf_config import from_hf_config, shipped_configs

    rows = []
    t0 = time.perf_counter()
    for path in shipped_configs().values():
        cfg = json.loads(path.read_text())
        a, b = ours(path), theirs(path)
        act = active_params(from_hf_config(path))
        rows.append(f"| {path.stem} | `{cfg['model_type']}` | {a:,} | {b:,} | {'yes' if a == b else 'NO'} | "
                    f"{act:,} | {NOMINAL.get(path.stem, '')} |")
    table = "\n".join(["| model | model_type | pipeloom | transformers | equal | active per token | published |",
                       "|---|---|---:|---:|:-:|---:|---|", *rows])
    if args.out is None:
        print(table)
        return 0
    page = f"""# Published Hugging Face configs: parameter counts

`pipeloom memory --model FILE` reads a Hugging Face `config.json` as JSON (no transformers, no download;
see [the memory page](../memory.md#your-own-model-hugging-face-config)). This table compares its
`total_params` with what transformers reports for the same config: `AutoModelForCausalLM.from_config`
built on the meta device, `sum(p.numel() for p in model.parameters())` (tied weights counted once).
The configs are the published `config.json` files (configuration fields only) shipped with pipeloom in
`src/pipeloom/models/hf_configs/`; any of them can be named by its file name, e.g.
`pipeloom memory --model Mixtral-8x7B-v0.1 --pp 8 -m 16`.

"Active per token" is `pipeloom.models.flops.active_params`: the whole model with only the top-k routed
experts of each MoE layer (plus the router), the size MoE model cards publish as "active".
The "published" column is the nominal size from the model's name or card. Qwen2-7B's 7.07B counts the
embedding matrix once although the model's head is a separate matrix (7.07B + 0.55B = 7.62B).
DeepSeek-V3 is the main model as transformers' `DeepseekV3ForCausalLM` builds it, like the 671B its report
publishes: its multi-token prediction module (11,610,067,968 more parameters besides the shared embedding and
head, counted by `pipeloom.models.families.deepseek.mtp_params` and equal to transformers' `MtpModel`) is not
in it; its "active per token" counts the input embedding (0.93B), which the published 37B (36.6B) leaves out.

Produced with transformers {transformers.__version__} by

    {COMMAND}

{table}

All counts are exact integers; the comparison is also a test
(`tests/models/test_models_hf_config.py::test_published_config_counts_like_transformers`).
The whole table takes {time.perf_counter() - t0:.0f} s, mostly transformers' import.
"""
    write_text(args.out, page)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
