"""What records travel in and through, between Kinesis and the sink: positions and record chunks,
the global pending pool that bounds them, and the handoff queue to the Spark driver thread."""
