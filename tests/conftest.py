import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = pathlib.Path(__file__).resolve().parents[1]


def reference_path() -> pathlib.Path | None:
    """../shared/reference/official_zb.json next to the checkout (or $PIPELOOM_REFERENCE)."""
    env = os.environ.get("PIPELOOM_REFERENCE")
    for p in ([pathlib.Path(env)] if env else []) + [REPO.parent / "shared" / "reference" / "official_zb.json"]:
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="session")
def reference_cases():
    import json

    p = reference_path()
    if p is None:
        pytest.skip("official reference schedules (../shared/reference/official_zb.json) not found")
    return json.loads(p.read_text())["cases"]
