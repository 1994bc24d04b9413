"""Run logs and their analysis (no torch).

    formats the trace formats check and trace read: sniff(path) + read(path) into the run model, one
            registry entry each (op traces, pipeloom's logs, torch profiler traces; ``register`` adds one)
    writer  the job-log format: one JSON line per event, written by the runtime
    reader  read logs of a run (pipeloom's and the worker-log text lines), keep profiled steps, align clocks
    check   measured vs planned bubbles, late jobs, straggler attribution, a verdict
    synth   synthetic logs of a schedule with injected trouble (tests, demos)
    sweep   how small a slowdown the check finds (``python -m pipeloom.trace.sweep``)
    optrace         op traces of any trainer (Parquet/CSV, dp x tp x pp): columns, sizes, malformed rows
    opmodel         the dependency model of an op trace as real trainers write it (lanes, P2P pairs, no-op
                    records, collectives, clock alignment) and its vectorised replay
    whatif          what-if scenarios on that model: S / S_t / S_w / M_W / M_S, replay accuracy
    verdicts        actionable verdicts from a what-if analysis (straggler, imbalanced stage, ...)
    opcheck         the whole op-trace check (analysis, verdicts, pictures, JSON) behind ``pipeloom check``
    runops          run logs (pipeloom's, worker-log text, torch profiler traces) as op traces: one input for the what-if
    optrace_synth   synthetic op traces with one planted cause (``python -m pipeloom.trace.optrace_synth``)
"""
