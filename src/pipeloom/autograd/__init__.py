"""torch autograd mechanisms shared by the runtime and the memory tracer (needs torch).

    splitgrad  the split backward: defer the weight gradients of a module's GEMMs (nn.Linear,
               transformers' Conv1D) from B to W, by forward hooks on module instances; the executor
               (pipeloom.runtime) runs schedules with it and the memory tracer (pipeloom.memory.traced)
               replays them with it, so the tracer measures what the runtime runs

This package sits below both (it knows modules and autograd, not schedules, ranks or processes), so
neither imports the other for it. Importing the package imports nothing; the modules are imported by name.
"""
