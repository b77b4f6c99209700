"""The parts of one worker, wired together by :class:`efo.coordinator.Coordinator`:

- :mod:`~efo.worker.owned`: the shards held here (the only writer of that set);
- :mod:`~efo.worker.liveness`: the heartbeat, and whether the leases can still be trusted;
- :mod:`~efo.worker.shardsync`: the first start's leases, and leases for shards born later;
- :mod:`~efo.worker.cycle`: the lease cycle (losses, requests, resets, claims, handovers);
- :mod:`~efo.worker.runner`: one shard's claim from its start position to its release;
- :mod:`~efo.worker.checkpointer`: the sink's commits turned into fenced checkpoint writes.
"""
