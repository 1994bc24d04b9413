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
