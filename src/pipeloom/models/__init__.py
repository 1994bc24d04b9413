"""Models: what pipeloom knows of a model, and the small torch models it runs.

    slicing  cut a model's layers into the schedule's chunks (torch)
    llama    the built-in tiny Llama used by the demo, the tests and the benchmarks (torch)

Importing this package imports nothing heavy; the torch modules are imported by name.
"""
