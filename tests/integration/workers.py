"""Several ``efo run`` processes of one application on the local stack, with the Spark-free sink of
ledger_check.py: start and stop them, read who holds what from the lease table, and read their logs."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from efo.devstack.leases import shard_leases
from efo.devstack.stack import StackEndpoints

from .ledger_check import Producer, Verdict, check
from .service import ServiceRun, arrow_env, create_stream, unique

#: The lease defaults (failover 10 s, heartbeat 2 s, a lease cycle a second): the figures the
#: README quotes come from these, not from the tests' faster settings.
LEASE_DEFAULTS = {
    "EFO_LEASE__FAILOVER_S": "10",
    "EFO_LEASE__HEARTBEAT_INTERVAL_S": "2",
    "EFO_LEASE__SYNC_INTERVAL_S": "1",
}


class Workers:
    def __init__(
        self,
        stack: StackEndpoints,
        kinesis: Any,
        dynamodb: Any,
        tmp_path: Path,
        *,
        shards: int,
        initial_position: str = "TRIM_HORIZON",
        stream_prefix: str = "workers",
        **env: str,
    ) -> None:
        self.stack = stack
        self.stream, self.app = unique(stream_prefix), unique("app")
        create_stream(kinesis, self.stream, shards)
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.sink = tmp_path / "sink"
        self.logs = tmp_path
        self.env = arrow_env(
            stack, stream=self.stream, app=self.app, sink_dir=self.sink, initial_position=initial_position, **env
        )
        self.producer = Producer(kinesis, self.stream)
        self.runs: dict[str, ServiceRun] = {}
        self.stopped: set[str] = set()
        self.args: tuple[str, ...] = ()  # after ``efo run`` in every process, e.g. ("--config", path)
        arn = kinesis.describe_stream_summary(StreamName=self.stream)["StreamDescriptionSummary"]["StreamARN"]
        self.stream_arn = arn

    def start(self, name: str, **env: str) -> ServiceRun:
        run = ServiceRun({**self.env, "EFO_WORKER_ID": name, **env}, self.logs / f"{name}.log", args=self.args).start()
        self.runs[name] = run
        return run

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM) -> int:
        self.stopped.add(name)
        return self.runs[name].stop(sig)

    def leases(self) -> dict[str, dict[str, Any]]:
        return shard_leases(self.dynamodb, self.app, self.app, self.stream_arn)

    def owners(self) -> dict[str, str | None]:
        return {sid: item.get("lease_owner", {}).get("S") for sid, item in self.leases().items()}

    def holdings(self) -> Counter[str]:
        return Counter(owner for owner in self.owners().values() if owner)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Seconds until ``condition`` held; fails naming ``what`` (and any worker that died)."""
        started = time.monotonic()
        while not condition():
            for name, run in self.runs.items():
                if name in self.stopped:
                    continue
                if run.process is not None and run.process.poll() is not None:
                    raise AssertionError(f"worker {name} exited {run.process.returncode}:\n{run.tail()}")
            assert time.monotonic() - started < timeout_s, f"no {what} within {timeout_s} s: {dict(self.holdings())}"
            time.sleep(0.2)
        return time.monotonic() - started

    def verdict(self) -> Verdict:
        return check(self.producer.acknowledged, self.sink)

    def wait_for_everything(self, timeout_s: float = 90.0) -> Verdict:
        verdict = self.verdict()
        deadline = time.monotonic() + timeout_s
        while verdict.lost and time.monotonic() < deadline:
            time.sleep(0.5)
            verdict = self.verdict()
        return verdict

    def dynamodb_requests(self) -> Counter[str]:
        """What the local DynamoDB has served so far, by operation (efo.devstack.dynamodb)."""
        with urllib.request.urlopen(f"{self.stack.dynamodb_endpoint}/_efo/requests", timeout=5) as response:
            return Counter(json.loads(response.read()))

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        return [e for e in self.runs[name].events() if e.get("event") == event]


def at(event: dict[str, Any]) -> float:
    """A log event's timestamp, in epoch seconds."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()
