"""Build hook for the optional C accelerator (everything else is in pyproject.toml).

``pipeloom.sim._accel`` is the compiled form of the timing kernel (``pipeloom/sim/kernel.py``), of the greedy
pass in ``pipeloom/schedule/search/greedy.py`` and of the validator's witness check (tested to give identical
results). ``optional=True``: if no C compiler is available the install still succeeds and pipeloom uses Python.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pipeloom.sim._accel",
            ["src/pipeloom/sim/_accel.c"],
            optional=True,
            # no fused multiply-add: the C pass must round exactly as the Python pass does
            extra_compile_args=["-O2", "-ffp-contract=off", "-std=c11"],
        )
    ]
)
