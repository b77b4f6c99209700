"""Found by the chaos run (tests/chaos, the DynamoDB pause): after a worker's leases were in doubt,
a lease it still held in the table but no longer ran was left unread for as long as both workers
lived. The worker treated its own lease as free ("ours in the table, not running here: take it
back") but claimed free leases only up to its share; the other worker saw the lease held by a live
worker, and a spread of one asks for nothing. Fixed: such a lease beyond the worker's share is
released in the same cycle. Reproduced in-process, deterministically: w1 holds two of three shards,
w0 one (w0's share is two, being first by name); w1's heartbeats fail until it drops its shards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from efo.errors import Retriable

from .memory_kinesis import MemoryKinesis
from .test_coordinator import running, until, world

pytestmark = pytest.mark.integration


def test_every_shard_is_read_again_after_a_worker_whose_leases_were_in_doubt_recovers(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(3)
        async with world(local_stack, kinesis) as w1, running(w1) as stop_w1:
            await until(lambda: len(w1.coordinator.owned) == 3, what="w1 holding all three")
            w0 = await w1.worker("w0", bootstrap=False)
            async with running(w0) as stop_w0:
                # w0 joins before w1 may shed (its claims are recent): w0 asks for one lease. (On a loaded
                # machine w1's first heartbeats may miss this file's 0.75 s validity: it then releases
                # what it held and w0 claims two. Either way both read, one shard apart.)
                await until(
                    lambda: len(w0.coordinator.owned) >= 1
                    and len(w0.coordinator.owned) + len(w1.coordinator.owned) == 3,
                    what="w0 reading one shard or two, w1 the rest",
                )
                await asyncio.sleep(2.5)  # past the settling cycles: a spread of one moves nothing
                assert sorted((len(w0.coordinator.owned), len(w1.coordinator.owned))) == [1, 2]

                real, failing = w1.table.heartbeat, True

                async def heartbeat(*, in_doubt: bool = False, leaving: bool = False) -> bool:
                    if failing:
                        raise Retriable("ThrottlingException on DynamoDB table (injected)")
                    return await real(in_doubt=in_doubt, leaving=leaving)

                w1.table.heartbeat = heartbeat  # type: ignore[method-assign]
                await until(lambda: not w1.coordinator.owned, timeout_s=3, what="w1 dropping its shards")
                failing = False
                try:
                    await until(lambda: len(w0.coordinator.owned) + len(w1.coordinator.owned) == 3, timeout_s=5)
                except AssertionError:
                    table = await w1.owners()
                    running_at = {w.table.worker_id: sorted(w.coordinator.owned) for w in (w0, w1)}
                    raise AssertionError(f"not every shard read again: running {running_at}, table {table}") from None
                await stop_w0()
            await stop_w1()

    asyncio.run(asyncio.wait_for(scenario(), 60))
