"""A size given as the memory limit holds in bytes for memory-aware schedules, also where B allocates
(b < 0: full recompute with a B/W split). Before, ``memory`` planned such configurations with b clamped to 0:
llama2-7b, pp 4, zbh2, full recompute, --mem-limit 40GiB peaked at 107 units under a 25-unit limit (69.6 GiB)."""
import pytest

from pipeloom.memory.analytic import estimate
from pipeloom.memory.layers import TrainConfig

GiB = 1024 ** 3


@pytest.mark.parametrize("schedule,limit", [("zbh2", 40), ("zbh1", 40), ("zbh2", 48)])
def test_mem_limit_in_bytes_holds_with_b_below_zero(schedule, limit):
    rep = estimate("llama2-7b", TrainConfig(recompute="full"), schedule=schedule, pp=4, microbatches=16,
                   gpu_bytes="80GiB", mem_limit=f"{limit}GiB")
    assert min(rep.mem_b) < 0  # the case: B allocates more than it frees
    assert max(d.peak_units for d in rep.devices) <= rep.mem_limit_units + 1e-9
    assert max(d.peak_bytes for d in rep.devices) <= limit * GiB
