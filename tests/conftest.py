import gc
import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def reference_cases():
    from pipeloom.schedule.io.official import load_reference

    ref = load_reference()
    if ref is None:
        pytest.skip("official reference schedules (../shared/reference/official_zb.json) not found")
    return ref["cases"]


def pytest_collection_finish(session):
    """What collection made (every test module, torch, hypothesis's strategies) lives until the end: move it out
    of the garbage collector's generations (gc.freeze), so that a full collection during the tests does not walk
    it again and again (with the hook below, 18 -> 6 s of CPU per `make test-fast`)."""
    _freeze_survivors()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test module's last test (its fixtures gone), the same for what is still alive: the libraries its
    tests imported (transformers, matplotlib, ortools) and the caches they filled. Only survivors are frozen;
    objects freed by reference counting are freed as before."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze_survivors()


def _freeze_survivors() -> None:
    """Collect the garbage, then move every object still alive into the collector's permanent generation."""
    gc.collect()
    gc.freeze()
