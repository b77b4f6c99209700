"""Memory is bounded by configuration: RSS of ``efo run`` at 64 and 256 shards with a stalled sink.

Runs ``efo run`` on a stream of each ``--shards`` count with a sink that never returns (the first
batch blocks forever), so nothing is ever committed and the pool fills, and samples the service's
resident memory (the Python process; the JVM is a separate process with its own heap setting)
against the bound. The data comes from the synthetic SubscribeToShard server (``--source
synthetic``, the default: empty events until efo is ready and its baseline taken, then as fast as
efo reads, for ever), or from kinesis-local on the local stack (``--source stack``: several times
the pool written into the stream; at 256 shards kinesis-local, starved of CPU on a loaded machine,
may not answer the puts in time). The bound:

    RSS <= baseline + max_pending_bytes + max_pending_records * k_record
           + 2 * min(batch.max_bytes, max_pending_bytes)
           + shards * (4 x largest event + 512 KiB of HTTP and framing buffers)

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
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import (  # noqa: E402
    REGION,
    command_line,
    rss_bytes,
    start_dynamodb,
    start_synthetic_server,
    write_json,
)
from synthetic_server import consumer_arn, stream_name  # noqa: E402

from efo.devstack.producer import kinesis_client, put_all, wait_active  # noqa: E402
from efo.devstack.stack import DEFAULT_SHARD_LIMIT, LocalStack, StackEndpoints, die_with_parent_process  # noqa: E402

BATCH_MAX_BYTES = 64 * 2**20  # batch.max_bytes, the default
# Per record at 100 records an event: 250 B of strings, list slots and ints (tracemalloc, 20-character
# keys), and about 40 B for each payload's bytes of its own (README).
K_RECORD_BYTES = 350
# Per shard with events arriving back to back (a consumer catching up), measured in docs/benchmarks.md
# (about 1.2 MiB a stalled shard with 200 KiB events): the decoded event waiting for budget, its raw
# base64 frame (held by aiobotocore's suspended generator), the socket read being framed and
# botocore's framing buffer (EVENT_COPIES x the event), plus aiohttp's and asyncio's read buffers.
EVENT_COPIES = 4
SHARD_BUFFER_BYTES = 512 * 1024
STALL_MODULE = "def write(df, batch):\n    import time\n    while True:\n        time.sleep(3600)\n"


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


class StackSource:
    """A kinesis-local stream on the local stack, and a producer that writes ``data_factor`` pools into it."""

    def __init__(self, endpoints: StackEndpoints, args: argparse.Namespace, shard_count: int, pool_bytes: int):
        # kinesis-local answers slowly with hundreds of subscriptions open: more patience than the default
        self.kinesis = kinesis_client(endpoints.kinesis_endpoint, endpoints.region, retries=10)
        self.stream = f"mem-{shard_count}-{pool_bytes >> 20}-{int(time.time())}"
        self.kinesis.create_stream(StreamName=self.stream, ShardCount=shard_count)
        wait_active(self.kinesis, self.stream, timeout_s=120)
        self.shards = self.kinesis.list_shards(StreamName=self.stream)["Shards"]
        self.records = args.data_factor * pool_bytes // args.record_bytes
        self.args = args
        self.env = {
            "EFO_STREAM": self.stream,
            "EFO_REGION": endpoints.region,
            "EFO_KINESIS_ENDPOINT": endpoints.kinesis_endpoint,
            "EFO_DYNAMODB_ENDPOINT": endpoints.dynamodb_endpoint,
        }
        self.produced = 0
        self._producer = ThreadPoolExecutor(1)
        self._producing: Any = None

    def start(self) -> None:
        self._producing = self._producer.submit(
            produce, self.kinesis, self.stream, self.shards, self.records, self.args.record_bytes
        )

    def producing(self) -> bool:
        return self._producing is not None and not self._producing.done()

    def finish(self) -> tuple[float, int]:
        """(MiB written, largest event in bytes): kinesis-local sends at most 10,000 records an event."""
        self.produced = self._producing.result()
        event_records = min(self.produced // len(self.shards), 10_000)
        return self.produced * self.args.record_bytes / 2**20, event_records * self.args.record_bytes

    def close(self) -> None:
        self._producer.shutdown(wait=False, cancel_futures=True)
        try:  # its shards count against the stack's limit
            self.kinesis.delete_stream(StreamName=self.stream, EnforceConsumerDeletion=True)
        except Exception as exc:
            print(f"  could not delete {self.stream}: {exc}", file=sys.stderr)


class SyntheticSource:
    """The synthetic server, held (empty events only) until ``start``, then as fast as efo reads."""

    def __init__(self, dynamodb: str, args: argparse.Namespace, shard_count: int) -> None:
        self.server, endpoint = start_synthetic_server(None, hold=True)
        self.endpoint = endpoint
        self.event_bytes = args.records_per_event * args.record_bytes
        self.env = {
            "EFO_STREAM": stream_name(shard_count),
            "EFO_CONSUMER_ARN": consumer_arn(args.record_bytes, args.records_per_event),
            "EFO_REGION": REGION,
            "EFO_KINESIS_ENDPOINT": endpoint,
            "EFO_DYNAMODB_ENDPOINT": dynamodb,
        }

    def start(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/_bench/release", method="POST"), timeout=5)

    def producing(self) -> bool:
        return False

    def finish(self) -> tuple[float, int]:
        return float("inf"), self.event_bytes

    def close(self) -> None:
        self.server.kill()
        self.server.wait()


def run_case(source: Any, args: argparse.Namespace, shard_count: int, pool_mib: int, workdir: Path) -> dict[str, Any]:
    pool_bytes = pool_mib * 2**20
    pool_records = max(1, pool_bytes // args.record_bytes)
    handlers = workdir / "handlers"
    handlers.mkdir(exist_ok=True)
    (handlers / "stalled_sink.py").write_text(STALL_MODULE)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EFO_")},
        "PYTHONPATH": os.pathsep.join([str(handlers), str(ROOT / "bench")]),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "EFO_APP": f"mem-{shard_count}-{pool_mib}-{int(time.time())}",
        "EFO_INITIAL_POSITION": "TRIM_HORIZON",
        # handler: runs the Spark driver in this process (the JVM is another one); arrow: no Spark at all
        "EFO_SINK": "handler:stalled_sink:write" if args.sink == "spark" else "arrow:sinks:stall",
        "EFO_POOL__MAX_PENDING_BYTES": str(pool_bytes),
        "EFO_POOL__MAX_PENDING_RECORDS": str(pool_records),
        "EFO_BATCH__MAX_WAIT_S": "1",
        "EFO_SPARK__MASTER": "local[1]",
        "EFO_LOG__FORMAT": "json",
        "EFO_SHUTDOWN_TIMEOUT_S": "2",
        **source.env,
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
        deadline = time.monotonic() + 180
        while b'"service.ready"' not in log_path.read_bytes():
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"efo run did not get ready; see {log_path}")
            time.sleep(0.2)
        time.sleep(2)
        baseline, baseline_anon = rss_bytes(service.pid), rss_bytes(service.pid, "RssAnon")
        peak_anon = baseline_anon
        started = time.monotonic()
        source.start()
        samples = []  # sampled while data comes: memory must not follow it
        while source.producing() or time.monotonic() - started < args.seconds:
            samples.append((round(time.monotonic() - started, 1), rss_bytes(service.pid)))
            peak_anon = max(peak_anon, rss_bytes(service.pid, "RssAnon"))
            time.sleep(0.5)
        produced_mib, event_bytes = source.finish()
        end = time.monotonic() + args.settle_s  # and after: the pool stays full, nothing grows
        while time.monotonic() < end:
            samples.append((round(time.monotonic() - started, 1), rss_bytes(service.pid)))
            time.sleep(0.5)
        arrow_copies = 2 * min(BATCH_MAX_BYTES, pool_bytes)
        terms = {
            "pool": pool_bytes,
            "records": pool_records * K_RECORD_BYTES,
            "arrow": arrow_copies,
            "shards": shard_count * (EVENT_COPIES * event_bytes + SHARD_BUFFER_BYTES),
        }
        bound = baseline + sum(terms.values())
        peak = max(rss for _, rss in samples)
        return {
            "shards": shard_count,
            "pool_mib": pool_mib,
            "produced_mib": produced_mib,
            "event_kib": event_bytes / 1024,
            "baseline": baseline,
            "peak": peak,
            "bound": bound,
            "margin": (bound - peak) / (bound - baseline),
            "anon_growth": peak_anon - baseline_anon,
            "terms": terms,
            "samples": samples,
        }
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
        source.close()


def written_mib(mib: float) -> str:
    return "unbounded" if mib == float("inf") else f"{mib:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="64,256", help="comma-separated shard counts")
    parser.add_argument("--record-bytes", type=int, default=4096)
    parser.add_argument("--pools-mib", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--data-factor", type=int, default=3, help="data written, in multiples of the pool")
    parser.add_argument("--seconds", type=float, default=60.0, help="RSS is sampled at least this long")
    parser.add_argument("--settle-s", type=float, default=10.0, help="and this long after producing ended")
    parser.add_argument("--sink", choices=["spark", "arrow"], default="spark", help="a stalled Spark or arrow sink")
    parser.add_argument(
        "--source",
        choices=["synthetic", "stack"],
        default="synthetic",
        help="the synthetic server (as fast as efo reads) or kinesis-local with a producer (--data-factor)",
    )
    parser.add_argument("--records-per-event", type=int, default=50, help="of the synthetic server")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    if not all(1 <= n <= DEFAULT_SHARD_LIMIT for n in shard_counts):
        parser.error(f"--shards must be in 1..{DEFAULT_SHARD_LIMIT} (the local stack's shard limit)")
    workdir = Path(tempfile.mkdtemp(prefix="efo-membench-"))
    results = []
    cases = [(shards, pool_mib) for shards in shard_counts for pool_mib in args.pools_mib]
    if args.source == "stack":
        with LocalStack(log_dir=workdir / "stack") as endpoints:
            for shards, pool_mib in cases:
                source = StackSource(endpoints, args, shards, pool_mib * 2**20)
                results.append(run_case(source, args, shards, pool_mib, workdir))
    else:
        dynamodb, dynamodb_endpoint = start_dynamodb(workdir)
        try:
            for shards, pool_mib in cases:
                results.append(
                    run_case(SyntheticSource(dynamodb_endpoint, args, shards), args, shards, pool_mib, workdir)
                )
        finally:
            dynamodb.terminate()
            dynamodb.wait()
    mib = 2**20
    print(f"command: `{command_line()}`\n")
    written = (
        f"kinesis-local, {args.data_factor}x the pool written"
        if args.source == "stack"
        else f"the synthetic server sending {args.records_per_event} records an event as fast as efo reads"
    )
    print(
        f"{args.record_bytes} B records from {written}, {args.sink} sink stalled (nothing ever committed), "
        f"RSS sampled every 0.5 s for at least {args.seconds:g} s and {args.settle_s:g} s more. "
        "Bound terms above the baseline: pool bytes + per-record overhead + two Arrow copies + per shard (one "
        "event + HTTP and framing buffers).\n"
    )
    print(
        "| shards | pool MiB | data written MiB | largest event KiB | baseline RSS MiB | peak RSS MiB | bound MiB "
        "| peak - baseline MiB (anonymous) | bound terms MiB (pool + records + Arrow + shards) | margin | within |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for r in results:
        terms = " + ".join(f"{v / mib:.1f}" for v in r["terms"].values())
        print(
            f"| {r['shards']} | {r['pool_mib']} | {written_mib(r['produced_mib'])} | {r['event_kib']:.0f} | "
            f"{r['baseline'] / mib:.0f} | {r['peak'] / mib:.0f} | {r['bound'] / mib:.0f} | "
            f"{(r['peak'] - r['baseline']) / mib:.0f} ({r['anon_growth'] / mib:.0f}) | {terms} | "
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
