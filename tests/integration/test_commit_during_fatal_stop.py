"""Fixed (the final writes of a fatal stop wait for the batch in the sink, within shutdown_timeout_s).
Found by the chaos run (tests/chaos, the deregistered consumer; EFO_CHAOS_SEED=452498066, full
size, iteration 2): when a fatal error stops the service, a batch the sink commits while the final
checkpoints and releases are under way is never checkpointed, so the next worker reads it again.
README: "A fatal error of any task ends the group; what was committed is still checkpointed and
the leases released". In the chaos run w1's batch ...-00000004 (60 records) was committed at
16:55:55.817, w1 logged leases.released at 16:55:55.941 with its checkpoints at the end of the batch
before, and w3 read the 60 records again. On SIGTERM the coordinator waits for the driver before
its final writes; on a fatal error it does not (``Coordinator.run``: ``except Exception: await
self._finish()``), and the driver finishes the batch in its sink meanwhile.

Reproduced in-process, deterministically: a batch is in the sink when the consumer turns out to be
deregistered; the sink commits it half a second later, while the (slowed) release is under way."""

from __future__ import annotations

import asyncio
from typing import Any

import botocore.exceptions
import pytest

from .memory_kinesis import MemoryKinesis
from .test_coordinator import until, world

pytestmark = pytest.mark.integration


def test_a_batch_the_sink_commits_while_a_fatal_error_stops_the_service_is_checkpointed(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        puts = kinesis.put("shard-000", 10)
        # A failover of 6 s: a busy machine's stall must not drop the lease before the point of the test.
        lease = {"heartbeat_interval_s": 0.25, "failover_s": 6.0, "sync_interval_s": 0.2}
        async with world(local_stack, kinesis, lease=lease) as w:
            w.driver.hold = True  # the sink is writing the batch
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            driver = asyncio.ensure_future(w.driver.run())
            await until(lambda: sum(len(chunk) for chunk in w.driver.held) == 10, what="the batch in the sink")
            w.coordinator.batch_started()

            loop = asyncio.get_running_loop()
            describe, release = kinesis.describe_stream_consumer, w.table.release

            async def describe_and_commit_soon(**kwargs: Any) -> Any:
                loop.call_later(0.5, w.driver.release_held)  # the sink finishes the batch a moment later
                return await describe(**kwargs)

            async def slow_release(lease: Any, **how: Any) -> None:
                await asyncio.sleep(2)  # a loaded DynamoDB: the final writes take a while
                await release(lease, **how)

            kinesis.describe_stream_consumer = describe_and_commit_soon  # type: ignore[method-assign]
            w.table.release = slow_release  # type: ignore[method-assign]
            kinesis.consumer_registered = False
            kinesis.stream_failures["shard-000"] = botocore.exceptions.ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "consumer not found"}}, "SubscribeToShard"
            )
            with pytest.raises(ExceptionGroup):
                await asyncio.wait_for(service, 20)
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)
            assert [seq for _, seq in w.driver.written] == puts, "the sink did not commit the batch"
            checkpoint = (await w.table.read()).leases["shard-000"].checkpoint
            assert checkpoint.sequence_number == str(puts[-1]), f"committed, not checkpointed: {checkpoint}"

    asyncio.run(asyncio.wait_for(scenario(), 60))
