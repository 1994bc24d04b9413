"""Search engines shared by the schedule families (no torch).

    greedy    event-driven list scheduler over a grid of policies (its C transcription: ``_accel.c``)
    accel     the C extension's loader, and the validator's one-pass witness check
    lockstep  the official ZB-V generator's lock-step construction (V placement, vpp 2)
    cpsat     the integer job graph of a shape and its CP-SAT models (exact builder, polish)
    bounds    proven makespan lower bounds under a memory limit
    polish    a deterministic CP-SAT polish and a large-neighbourhood search of a greedy schedule
    reorder   a local search over any finished schedule's job orders, timed by the simulator, under any
              peak function (e.g. a runtime's retention that the memory model has no term for)
"""
