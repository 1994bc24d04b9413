"""Build hook for the optional C accelerator of the greedy scheduler (everything else is in pyproject.toml).

``pipeloom.schedule.search._accel`` is a transcription of the pure-Python pass in
``pipeloom/schedule/search/greedy.py`` (tested to give identical schedules). ``optional=True``: if no C
compiler is available the install still succeeds and pipeloom uses the Python pass.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pipeloom.schedule.search._accel",
            ["src/pipeloom/schedule/search/_accel.c"],
            optional=True,
            # no fused multiply-add: the C pass must round exactly as the Python pass does
            extra_compile_args=["-O2", "-ffp-contract=off", "-std=c11"],
        )
    ]
)
