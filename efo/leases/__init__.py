"""Ownership and progress of shards: the DynamoDB lease and checkpoint table, one claim's
checkpoint ledger, and the life of a claimed shard as a state machine."""
