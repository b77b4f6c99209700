"""Memory is bounded by configuration: RSS of ``efo run`` at 64 and 256 shards with a stalled sink.

Starts the local stack as ``efo dev up`` starts it, a stream of each ``--shards`` count, and ``efo run``
whose sink never returns (the first batch blocks forever), so nothing is ever committed and the
pool fills. It writes several times the pool's budget into the stream and samples the service's
resident memory (the Python process; the JVM is a separate process with its own heap setting)
against the bound:

    RSS <= baseline + max_pending_bytes + max_pending_records * k_record
           + 2 * min(batch.max_bytes, max_pending_bytes)
           + shards * (largest event + HTTP and framing buffers)

``baseline`` is the RSS after ``service.ready`` and before any record. The pool holds the payload
bytes and ``k_record`` per record (sequence-number and partition-key strings, ints, list slots).
The driver holds two Arrow copies at most: the batch in the sink and the next one, prepared while
Spark commits. Each shard holds one decoded event waiting for budget, aiohttp's read buffer (to
its 128 KiB high-water mark) and what botocore's framing buffer keeps of the last socket read
(up to another 128 KiB). Runs with several pool sizes to show that memory follows the
configuration, not the amount of data written. The margin is the part of the budget above the
baseline that the peak left unused: (bound - peak) / (bound - baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import command_line, write_json  # noqa: E402

from efo.devstack.producer import kinesis_client, put_all, wait_active  # noqa: E402
from efo.devstack.stack import DEFAULT_SHARD_LIMIT, LocalStack, StackEndpoints, die_with_parent_process  # noqa: E402

BATCH_MAX_BYTES = 64 * 2**20  # batch.max_bytes, the default
K_RECORD_BYTES = 250  # tracemalloc: strings, list slots and ints per record, 20-character keys
# Per shard, besides the decoded event waiting for budget: aiohttp's read buffer to its high-water
# mark (2 x 64 KiB) and botocore's framing buffer (the rest of the last socket read, up to as much).
SHARD_BUFFER_BYTES = 256 * 1024
STALL_MODULE = "def write(df, batch):\n    import time\n    while True:\n        time.sleep(3600)\n"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def produce(kinesis: Any, stream: str, shards: list[dict[str, Any]], records: int, size: int) -> int:
    """``records`` of ``size`` bytes, spread evenly over the shards by explicit hash key."""
    payload = os.urandom(size)
    entries = (
        {
            "Data": payload,
            "PartitionKey": "k",
            "ExplicitHashKey": shards[i % len(shards)]["HashKeyRange"]["StartingHashKey"],
        }
        for i in range(records)
    )
    return len(put_all(kinesis, stream, entries))


def run_case(
    endpoints: StackEndpoints, args: argparse.Namespace, shard_count: int, pool_mib: int, workdir: Path
) -> dict[str, Any]:
    # kinesis-local answers slowly with hundreds of subscriptions open: more patience than the default
    kinesis = kinesis_client(endpoints.kinesis_endpoint, endpoints.region, retries=10)
    stream = f"mem-{shard_count}-{pool_mib}-{int(time.time())}"
    kinesis.create_stream(StreamName=stream, ShardCount=shard_count)
    wait_active(kinesis, stream, timeout_s=120)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    pool_bytes = pool_mib * 2**20
    pool_records = max(1, pool_bytes // args.record_bytes)
    handlers = workdir / "handlers"
    handlers.mkdir(exist_ok=True)
    (handlers / "stalled_sink.py").write_text(STALL_MODULE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(handlers), str(ROOT / "bench")]),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "EFO_STREAM": stream,
        "EFO_APP": stream,
        "EFO_INITIAL_POSITION": "TRIM_HORIZON",
        # handler: runs the Spark driver in this process (the JVM is another one); arrow: no Spark at all
        "EFO_SINK": "handler:stalled_sink:write" if args.sink == "spark" else "arrow:sinks:stall",
        "EFO_REGION": endpoints.region,
        "EFO_KINESIS_ENDPOINT": endpoints.kinesis_endpoint,
        "EFO_DYNAMODB_ENDPOINT": endpoints.dynamodb_endpoint,
        "EFO_POOL__MAX_PENDING_BYTES": str(pool_bytes),
        "EFO_POOL__MAX_PENDING_RECORDS": str(pool_records),
        "EFO_BATCH__MAX_WAIT_S": "1",
        "EFO_SPARK__MASTER": "local[1]",
        "EFO_LOG__FORMAT": "json",
        "EFO_SHUTDOWN_TIMEOUT_S": "2",
    }
    log_path = workdir / f"efo-{shard_count}-{pool_mib}.log"
    with log_path.open("wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "efo.cli", "run"],
            env=env,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent_process,
        )
    try:
        deadline = time.monotonic() + 120
        while b'"service.ready"' not in log_path.read_bytes():
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"efo run did not get ready; see {log_path}")
            time.sleep(0.2)
        time.sleep(2)
        baseline = rss_bytes(service.pid)
        total_bytes = args.data_factor * pool_bytes
        records = total_bytes // args.record_bytes
        started = time.monotonic()
        with ThreadPoolExecutor(1) as producer:  # sample while producing: memory must not follow the data
            producing = producer.submit(produce, kinesis, stream, shards, records, args.record_bytes)
            samples = []
            while not producing.done() or time.monotonic() - started < args.seconds:
                samples.append((round(time.monotonic() - started, 1), rss_bytes(service.pid)))
                time.sleep(0.5)
            produced = producing.result()
            produce_s = time.monotonic() - started
            end = time.monotonic() + args.settle_s  # and after: the pool stays full, nothing grows
            while time.monotonic() < end:
                samples.append((round(time.monotonic() - started, 1), rss_bytes(service.pid)))
                time.sleep(0.5)
        event_bytes = min(produced // shard_count, 10_000) * args.record_bytes  # kinesis-local: <= 10,000 per event
        arrow_copies = 2 * min(BATCH_MAX_BYTES, pool_bytes)
        bound = (
            baseline
            + pool_bytes
            + pool_records * K_RECORD_BYTES
            + arrow_copies
            + shard_count * (event_bytes + SHARD_BUFFER_BYTES)
        )
        peak = max(rss for _, rss in samples)
        received = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        return {
            "shards": shard_count,
            "pool_mib": pool_mib,
            "produced_mib": produced * args.record_bytes / 2**20,
            "baseline": baseline,
            "peak": peak,
            "bound": bound,
            "margin": (bound - peak) / (bound - baseline),
            "terms": {
                "pool": pool_bytes,
                "records": pool_records * K_RECORD_BYTES,
                "arrow": arrow_copies,
                "shards": shard_count * (event_bytes + SHARD_BUFFER_BYTES),
            },
            "samples": samples,
            "events": len(received),
            "produce_s": produce_s,
        }
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)  # its shards count against the limit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="64,256", help="comma-separated shard counts")
    parser.add_argument("--record-bytes", type=int, default=4096)
    parser.add_argument("--pools-mib", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--data-factor", type=int, default=3, help="data written, in multiples of the pool")
    parser.add_argument("--seconds", type=float, default=60.0, help="RSS is sampled at least this long")
    parser.add_argument("--settle-s", type=float, default=10.0, help="and this long after producing ended")
    parser.add_argument("--sink", choices=["spark", "arrow"], default="spark", help="a stalled Spark or arrow sink")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    if not all(1 <= n <= DEFAULT_SHARD_LIMIT for n in shard_counts):
        parser.error(f"--shards must be in 1..{DEFAULT_SHARD_LIMIT} (the local stack's shard limit)")
    workdir = Path(tempfile.mkdtemp(prefix="efo-membench-"))
    results = []
    with LocalStack(log_dir=workdir / "stack") as endpoints:
        for shard_count in shard_counts:
            for pool_mib in args.pools_mib:
                results.append(run_case(endpoints, args, shard_count, pool_mib, workdir))
    mib = 2**20
    print(f"command: `{command_line()}`\n")
    print(
        f"{args.record_bytes} B records, {args.sink} sink stalled (nothing ever committed), "
        f"{args.data_factor}x the pool written, "
        f"RSS sampled every 0.5 s for at least {args.seconds:g} s and {args.settle_s:g} s after producing ended. "
        "Bound terms above the baseline: pool bytes + per-record overhead + two Arrow copies + per shard (one "
        "event + HTTP and framing buffers).\n"
    )
    print(
        "| shards | pool MiB | data written MiB | baseline RSS MiB | peak RSS MiB | bound MiB | peak - baseline MiB "
        "| bound terms MiB (pool + records + Arrow + shards) | margin | within |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for r in results:
        terms = " + ".join(f"{v / mib:.1f}" for v in r["terms"].values())
        print(
            f"| {r['shards']} | {r['pool_mib']} | {r['produced_mib']:.0f} | {r['baseline'] / mib:.0f} | "
            f"{r['peak'] / mib:.0f} | {r['bound'] / mib:.0f} | {(r['peak'] - r['baseline']) / mib:.0f} | {terms} | "
            f"{r['margin']:.0%} | {'yes' if r['peak'] <= r['bound'] else 'NO'} |"
        )
    print("\nRSS over time (MiB):\n")
    for r in results:
        series = " ".join(f"{t:g}s:{rss / mib:.0f}" for t, rss in r["samples"][::8])
        print(f"- {r['shards']} shards, pool {r['pool_mib']} MiB: {series}")
    for r in results:
        r["samples"] = r["samples"][::8]
    write_json(args.json, {"cases": results})


if __name__ == "__main__":
    main()
