"""Run logs and their analysis (no torch).

    writer  the job-log format: one JSON line per event, written by the runtime
    reader  read logs of a run (pipeloom's and seed 003's text lines), keep profiled steps, align clocks
    check   measured vs planned bubbles, late jobs, straggler attribution, a verdict
    synth   synthetic logs of a schedule with injected trouble (tests, demos)
    sweep   how small a slowdown the check finds (``python -m pipeloom.trace.sweep``)
"""
