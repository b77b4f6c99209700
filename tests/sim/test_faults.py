"""Each fault of efo.sim.faults alone, on a small fleet in simulated time: every invariant holds."""

from __future__ import annotations

import pytest

from efo.sim import faults
from efo.sim.fleet import FleetConfig
from efo.sim.run import RunConfig
from tests.sim.running import run


@pytest.mark.parametrize("fault", faults.FAULTS)
def test_each_fault_alone_keeps_every_invariant(fault: str, record_property: pytest.RecordProperty) -> None:
    run(
        RunConfig(fleet=FleetConfig(shards=32, workers=4), seed=1, duration_s=120.0, faults=(fault,), drain_s=60.0),
        record_property,
    )
