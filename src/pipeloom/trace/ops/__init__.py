"""Op traces of any trainer and the what-if straggler analysis on them (no torch).

This sub-package sits below the run logs of :mod:`pipeloom.trace` (it never imports them: run logs come in
as op traces through :mod:`pipeloom.trace.runops`).

    optrace     op traces (Parquet/CSV, dp x tp x pp): columns, sizes, malformed rows
    arrays      vectorised group helpers over numpy columns (keys, group reductions, matching, Kahn levels)
    opmodel     the dependency model of an op trace as real trainers write it (lanes, P2P pairs, no-op
                records, collectives, clock alignment)
    replay      the model's arrays in replay order and its vectorised replay
    whatif      what-if scenarios on that model: S / S_t / S_w / M_W / M_S, replay accuracy
    verdicts    actionable verdicts from a what-if analysis (straggler, imbalanced stage, ...)
    opcheck     the whole op-trace check (analysis, verdicts, pictures, JSON) behind ``pipeloom check``
    synth       synthetic op traces in pipeloom's own format with one planted cause
                (CLI: ``python -m pipeloom.trace.ops.synth_cli``)
    synth_real  synthetic op traces as a Megatron-style trainer's profiler writes them
"""
