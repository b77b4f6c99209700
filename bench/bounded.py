"""A bounded run (``efo run --until caught-up``) over a backlog, beside a continuous ``efo run``
stopped by hand at the moment it had caught up.

The local stack as ``efo dev up`` starts it; one stream of ``--shards`` shards with a backlog of
``--records`` records written before either run starts; each run is its own application (its own
lease table and consumer) reading the same backlog from TRIM_HORIZON, Spark-free sink
(``arrow:sinks:discard``), one worker.

* **bounded**: ``efo run --until caught-up``: wall time from the process's start to its exit (it
  exits by itself: every shard caught up, everything committed and checkpointed, leases released).
* **continuous, stopped at caught-up**: ``efo run``, watched through its /metrics every
  ``--poll`` seconds; SIGTERM as soon as it has committed the whole backlog and every shard's lag
  is 0 (a perfect operator: no person stops it sooner), then wall time from start to exit.

Records/s is the backlog over that wall time (start-up, consumer registration and shutdown
included, as a scheduler sees it).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from common import EfoProcess, command_line, efo_env, free_port, write_json
from prometheus_client.parser import text_string_to_metric_families

from efo.devstack.producer import kinesis_client, put_all, wait_active
from efo.devstack.stack import LocalStack, StackEndpoints

RUN_TIMEOUT_S = 600.0


def scrape(port: int) -> tuple[float, list[float]]:
    """(records committed, every shard's lag in seconds) from an efo run's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    committed, lags = 0.0, []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "efo_records_committed_total":
                committed += sample.value
            elif sample.name == "efo_shard_lag_seconds":
                lags.append(sample.value)
    return committed, lags


def backlog(stack: StackEndpoints, shards: int, records: int) -> str:
    stream = f"bounded-{shards}-{uuid.uuid4().hex[:6]}"
    kinesis = kinesis_client(stack.kinesis_endpoint, stack.region)
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_active(kinesis, stream, timeout_s=120)
    payload = b"x" * 200
    put_all(kinesis, stream, ({"Data": payload, "PartitionKey": f"k{i}"} for i in range(records)))
    return stream


def run_once(
    stack: StackEndpoints, stream: str, shards: int, records: int, workdir: Path, *, bounded: bool, poll_s: float
) -> dict[str, Any]:
    app = f"{'bounded' if bounded else 'continuous'}-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = efo_env(
        EFO_STREAM=stream,
        EFO_APP=app,
        EFO_SINK="arrow:sinks:discard",
        EFO_REGION=stack.region,
        EFO_KINESIS_ENDPOINT=stack.kinesis_endpoint,
        EFO_DYNAMODB_ENDPOINT=stack.dynamodb_endpoint,
        EFO_INITIAL_POSITION="TRIM_HORIZON",
        EFO_METRICS_PORT=str(port),
        EFO_WORKER_ID=app,
        **({"EFO_RUN__UNTIL": "caught-up"} if bounded else {}),
    )
    started = time.monotonic()
    worker = EfoProcess(env, workdir / f"{app}.log")
    deadline = started + RUN_TIMEOUT_S
    stopped_at = None
    while worker.process.poll() is None:
        if time.monotonic() > deadline:
            worker.stop(signal.SIGKILL)
            raise RuntimeError(f"{app} did not finish within {RUN_TIMEOUT_S:g} s; see {worker.log_path}")
        if not bounded and stopped_at is None:
            try:
                committed, lags = scrape(port)
            except OSError:
                committed, lags = 0.0, []
            if committed >= records and len(lags) == shards and not any(lags):
                stopped_at = time.monotonic()
                worker.process.send_signal(signal.SIGTERM)
        time.sleep(poll_s)
    wall_s = time.monotonic() - started
    code = worker.process.returncode
    if code != 0:
        raise RuntimeError(f"{app} exited {code}; see {worker.log_path}")
    if bounded:  # its own count of what it read: no run.progress event at the end is a failure, not a pass
        progress = list(worker.events("run.progress"))
        if not progress:
            raise RuntimeError(f"{app} logged no run.progress event; see {worker.log_path}")
        read = progress[-1]["records"]
        if read < records:
            raise RuntimeError(f"{app} read {read} of {records} records; see {worker.log_path}")
    return {
        "mode": "bounded" if bounded else "continuous",
        "wall_s": round(wall_s, 2),
        "records_per_s": round(records / wall_s, 1),
        "caught_up_after_s": None if stopped_at is None else round(stopped_at - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--records", type=int, default=20_000, help="the backlog, over all shards")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode over the same backlog")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between /metrics reads (continuous)")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="efo-bounded-"))
    runs: list[dict[str, Any]] = []
    with LocalStack(log_dir=workdir / "stack", shard_limit=max(64, args.shards * 4)) as stack:
        stream = backlog(stack, args.shards, args.records)
        for _ in range(args.repeats):
            for bounded in (True, False):
                runs.append(
                    run_once(stack, stream, args.shards, args.records, workdir, bounded=bounded, poll_s=args.poll)
                )

    print(f"command: `{command_line()}`\n")
    print(
        f"One `efo run` worker (Spark-free sink) reading a backlog of {args.records:,} records of 200 bytes on "
        f"{args.shards} shards from TRIM_HORIZON on the local stack; wall time from process start to exit, "
        f"medians of {args.repeats} run(s) each.\n"
    )
    print("| run | wall time, s | records/s | caught up after, s |")
    print("|---|---:|---:|---:|")
    figures: dict[str, Any] = {"shards": args.shards, "records": args.records, "runs": runs}
    modes = (("bounded", "`--until caught-up` (exits by itself)"), ("continuous", "continuous, SIGTERM at caught-up"))
    for mode, what in modes:
        mine = [r for r in runs if r["mode"] == mode]
        wall = statistics.median(r["wall_s"] for r in mine)
        caught = [r["caught_up_after_s"] for r in mine if r["caught_up_after_s"] is not None]
        figures[f"{mode}_wall_s"] = wall
        caught_s = f"{statistics.median(caught):.1f}" if caught else ""
        print(f"| {what} | {wall:.1f} | {args.records / wall:,.0f} | {caught_s} |")
    ratio = figures["bounded_wall_s"] / figures["continuous_wall_s"]
    figures["ratio"] = round(ratio, 3)
    print(f"\nBounded / continuous wall time: {ratio:.2f} (no goal).")
    write_json(args.json, figures)


if __name__ == "__main__":
    sys.exit(main())
