"""``pipeloom tune --explain`` shows the best plan's proven lower bound and its gap (issue: the tuner ranks by
the plans it runs and says how good they are)."""
import json

import pytest
from clirun import pipeloom


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_explain_reports_the_plans_bound_and_gap():
    r = pipeloom("tune", "--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9",
                 "--gpu-memory", "24MiB", "--reserve", "0", "--global-batch", "16", "--schedules", "zbv,vhalf,vmin",
                 "--max-microbatch-size", "2", "--pp", "4", "--json", "--explain")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    pb = d["explain"]["plan_bound"]
    assert pb is not None and pb["final_plan"] is True  # the leaders are planned again with the defaults
    assert 0 < pb["lower_bound_s"] <= pb["makespan_s"] * (1 + 1e-12)
    assert pb["gap"] == pytest.approx(pb["makespan_s"] / pb["lower_bound_s"] - 1, abs=1e-9)
    assert pb["bound_limit_units"] > 0  # the limit the plan was made under
