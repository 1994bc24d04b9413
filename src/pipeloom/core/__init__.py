"""The ground floor (no torch, imports nothing else of pipeloom).

    ir      the schedule value: jobs, placement, :class:`Schedule`
    rules   THE dependency and memory rules every engine, validator and runtime uses
    costs   cost and memory model of a job, memory-limit parsing
    errors  the errors pipeloom raises and the :class:`Violation` a validator reports
"""
