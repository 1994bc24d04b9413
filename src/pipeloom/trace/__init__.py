"""Run logs and their analysis (no torch).

    formats the trace formats check and trace read: sniff(path) + read(path) into the run model, one
            registry entry each (op traces, pipeloom's logs, torch profiler traces; ``register`` adds one)
    run     the run model every reader produces (RunLog, RankLog, LogJob)
    writer  the job-log format: one JSON line per event, written by the runtime
    reader  read logs of a run (pipeloom's and the worker-log text lines), keep profiled steps, align clocks
    sanity  what cannot happen in real logs, said before any verdict
    torch_profile  torch profiler traces of a torch.distributed.pipelining run as a run
    check   measured vs planned bubbles, late jobs, straggler attribution, a verdict
    tp_costs  the measured per-chunk costs of a tensor-parallel run (the slowest TP rank's)
    synth   synthetic logs of a schedule with injected trouble (tests, demos)
    sweep   how small a slowdown the check finds (``python -m pipeloom.trace.sweep``)
    runops  run logs as op traces, and the what-if analysis of a run log (``check_run_whatif``)
    ops/    op traces of any trainer and the what-if analysis on them (below the run logs: it never reads
            them; see :mod:`pipeloom.trace.ops`)
"""
