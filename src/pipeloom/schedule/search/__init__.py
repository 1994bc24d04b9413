"""Search engines shared by the schedule families (no torch).

    greedy       the event-driven greedy pass of one policy (its C transcription: ``sim/_accel.c``)
    portfolio    the best schedule over a grid of policies, the lock-step passes and the building blocks
    localsearch  re-timing (by the timing kernel, :mod:`pipeloom.sim.kernel`) and local search of job lists
    accel        the C extension as the planners use it, and the validator's one-pass witness check
    vblock       building blocks with a fixed lifespan (the controllable-memory construction)
    lockstep     the official ZB-V generator's lock-step construction (V placement, vpp 2)
    cpsat        the integer job graph of a shape and its CP-SAT models (exact builder, polish)
    bounds       proven makespan lower bounds under a memory limit
    polish       a deterministic CP-SAT polish and a large-neighbourhood search of a greedy schedule
    reorder      a local search over any finished schedule's job orders, timed by the simulator, under any
                 peak function (e.g. a runtime's retention that the memory model has no term for)
"""
