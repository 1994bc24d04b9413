"""Search engines shared by the schedule families (no torch).

    greedy      event-driven list scheduler over a grid of policies (+ the C pass ``_accel``)
    lockstep    the official ZB-V generator's lock-step construction (V placement, vpp 2)
    polish      lower bounds and CP-SAT polish / large-neighbourhood search of a greedy schedule
"""
