"""efo as a Spark Structured Streaming source, without Spark: its options, its offsets, the engine
that reads the streams in Spark's reader process, and the replay of a planned batch.

``pyspark_efo`` (the top-level package Spark finds by name) is the thin Spark side; everything here
is plain Python on efo's own parts (subscriptions, pool, KPL, registration, shard graph), so that it
is tested without a JVM and never imports pyspark.
"""
