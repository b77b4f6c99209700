"""Everything that talks to Kinesis: shards and their graph, the stream consumer, one shard's
SubscribeToShard loop, the event decoder and KPL de-aggregation."""
