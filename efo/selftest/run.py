"""``efo selftest``: the whole path against a real account, and nothing left behind.

It creates a stream with a unique prefix, puts records, starts a worker (``efo run``, with a
Spark-free sink of its own: efo/selftest/sink.py) that registers the consumer and creates the
table, splits a shard while it reads, puts more, waits until the worker has delivered everything,
and checks that every record arrived at least once and in order per key. Then, and also when a
step fails or the run is interrupted (SIGINT, SIGTERM), it stops the worker and deletes what it
made: the stream with its consumer, the table, its local files; and says so, or names what it
could not delete and how to.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.config
import botocore.session

from efo.aws import USER_AGENT_EXTRA
from efo.config import Settings
from efo.devstack.traffic import Producer, Traffic
from efo.errors import EXIT_OK, EXIT_RUNTIME, EfoError, error_code, translate
from efo.selftest.sink import OUTPUT_VARIABLE, read_rows

#: The steps, in order; a test interrupts the run at the start of one (TEST_INTERRUPT_VARIABLE).
STEPS = ("create-stream", "put", "start-worker", "split", "put-more", "caught-up", "verify")
TEST_INTERRUPT_VARIABLE = "EFO_TEST_SELFTEST_INTERRUPT"
PREFIX = "efo-selftest-"
STREAM_ACTIVE_TIMEOUT_S = 120.0
WORKER_STOP_TIMEOUT_S = 60.0
#: How long the clean-up waits for a stream or table that may not be deleted yet: AWS refuses to
#: delete a stream still CREATING or UPDATING (a split) and a table still CREATING.
CLEAN_UP_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.5
#: The worker's settings: small batches and quick checkpoints and listings, so a run takes seconds.
WORKER_SETTINGS = {
    "EFO_SINK": "arrow:efo.selftest.sink:write",
    "EFO_INITIAL_POSITION": "TRIM_HORIZON",
    "EFO_BATCH__MAX_WAIT_S": "1",
    "EFO_CHECKPOINT__INTERVAL_S": "1",
    "EFO_SHARDS__SYNC_INTERVAL_S": "2",
    "EFO_LOG__FORMAT": "json",
}
#: List prices in us-east-1 (2026): provisioned stream and EFO consumer, each per shard-hour.
SHARD_HOUR_USD = 0.015
CONSUMER_SHARD_HOUR_USD = 0.015


class SelfTestFailed(EfoError):
    """A step of the selftest failed (its cause said), after which it deleted what it made."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one selftest makes: everything under one unique name."""

    name: str
    region: str
    shards: int = 2
    records: int = 1000
    size_bytes: int = 100
    keys: int = 16

    @classmethod
    def new(cls, region: str, **values: Any) -> Plan:
        return cls(f"{PREFIX}{uuid.uuid4().hex[:8]}", region, **values)

    def lines(self) -> list[str]:
        """What it will create, and roughly what that costs."""
        peak = self.shards + 1
        at_most = peak * (SHARD_HOUR_USD + CONSUMER_SHARD_HOUR_USD)
        return [
            f"efo selftest creates, in region {self.region} of these credentials, and deletes again:",
            f"  Kinesis stream  {self.name}  ({self.shards} shards, {peak} open after a split)",
            f"  EFO consumer    {self.name}  (registered by the worker)",
            f"  DynamoDB table  {self.name}  (PAY_PER_REQUEST, created by the worker)",
            f"and puts {self.records:,} records of {self.size_bytes} bytes; it takes a minute or two.",
            f"Cost at us-east-1 list prices: the stream and the consumer ${SHARD_HOUR_USD} each per shard-hour, "
            f"{peak} shards for a few minutes: at most about ${at_most:.2f} should partial hours be billed whole; "
            "the data and the table's requests: well under a cent.",
        ]


@dataclass
class Outcome:
    exit_code: int
    lines: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what could not be deleted, with how to


def _client(service: str, settings: Settings) -> Any:
    endpoint = settings.kinesis_endpoint if service == "kinesis" else settings.dynamodb_endpoint
    return botocore.session.get_session().create_client(
        service,
        region_name=settings.region,
        endpoint_url=endpoint,
        config=botocore.config.Config(
            retries={"mode": "standard", "max_attempts": 5}, user_agent_extra=USER_AGENT_EXTRA
        ),
    )


class SelfTest:
    def __init__(
        self,
        plan: Plan,
        settings: Settings,
        *,
        say: Callable[[str], None],
        timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self._say = say
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self.kinesis = _client("kinesis", settings)
        self.dynamodb = _client("dynamodb", settings)
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"{plan.name}-"))
        self.worker: subprocess.Popen[bytes] | None = None
        self.split_shard: str | None = None
        self._interrupt_at = os.environ.get(TEST_INTERRUPT_VARIABLE)

    # ---- the run -------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Every step, then the clean-up (also after a failure or an interrupt), then the outcome."""
        outcome = Outcome(EXIT_RUNTIME)
        step = STEPS[0]
        try:
            with _interrupts_raise():
                for step in STEPS:
                    if step == self._interrupt_at:
                        signal.raise_signal(signal.SIGINT)  # a test's Ctrl-C, at the start of this step
                    getattr(self, "_" + step.replace("-", "_"))(outcome)
            outcome.exit_code = EXIT_OK
        except KeyboardInterrupt:
            outcome.lines.append(f"interrupted at step {step}")
        except Exception as exc:  # an AWS refusal of a step (SplitShard is not in efo's own policy): its cause
            error = translate(exc, resource=f"stream {self.plan.name!r}", hint="see the IAM policy in the README")
            outcome.lines.append(f"step {step} failed: {error}")
        finally:
            with _interrupts_ignored():  # the clean-up is bounded; a second Ctrl-C must not leave things behind
                self._clean_up(outcome)
        if outcome.left:
            outcome.exit_code = EXIT_RUNTIME
        return outcome

    def _create_stream(self, outcome: Outcome) -> None:
        try:
            self.kinesis.create_stream(StreamName=self.plan.name, ShardCount=self.plan.shards)
        except Exception as exc:
            raise translate(
                exc, resource=f"stream {self.plan.name!r}", hint="see the IAM policy in the README"
            ) from None
        self._wait_active()
        self._say(f"created stream {self.plan.name} ({self.plan.shards} shards)")

    def _put(self, outcome: Outcome, *, first: int = 0) -> None:
        half = self.plan.records // 2
        count = half if first == 0 else self.plan.records - half
        traffic = Traffic(count=count, size_bytes=self.plan.size_bytes, keys=self.plan.keys, first=first)
        report = Producer(self.kinesis, self.plan.name, clock=self._clock, sleep=self._sleep).put(traffic)
        self._say(f"put {report.records:,} records")

    def _start_worker(self, outcome: Outcome) -> None:
        env = {name: value for name, value in os.environ.items() if not name.upper().startswith("EFO_")}
        env.update(WORKER_SETTINGS)
        env.update({"EFO_STREAM": self.plan.name, "EFO_APP": self.plan.name, OUTPUT_VARIABLE: str(self.work_dir)})
        for name, value in (
            ("EFO_REGION", self.settings.region),
            ("EFO_KINESIS_ENDPOINT", self.settings.kinesis_endpoint),
            ("EFO_DYNAMODB_ENDPOINT", self.settings.dynamodb_endpoint),
        ):
            if value:
                env[name] = value
        log = (self.work_dir / "worker.log").open("wb")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "efo.cli", "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self._wait_for("the worker's first records", lambda: len(read_rows(self.work_dir)) > 0)
        self._say(f"the worker (pid {self.worker.pid}) registered the consumer, created the table and reads")

    def _split(self, outcome: Outcome) -> None:
        shards = self.kinesis.list_shards(StreamName=self.plan.name, ShardFilter={"Type": "AT_LATEST"})["Shards"]
        shard = shards[0]
        low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
        self.kinesis.split_shard(
            StreamName=self.plan.name, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2)
        )
        self._wait_active()
        self.split_shard = str(shard["ShardId"])
        self._say(f"split {self.split_shard} while the worker reads")

    def _put_more(self, outcome: Outcome) -> None:
        self._put(outcome, first=self.plan.records // 2)

    def _caught_up(self, outcome: Outcome) -> None:
        wanted = set(range(self.plan.records))
        self._wait_for(
            f"all {self.plan.records:,} records delivered",
            lambda: wanted <= {row["n"] for row in read_rows(self.work_dir)},
        )
        code = self._stop_worker()
        if code != EXIT_OK:
            raise SelfTestFailed(f"the worker exited {code} on SIGTERM, not 0: {self._worker_tail()}")
        self._say("the worker delivered every record and stopped (exit 0)")

    def _verify(self, outcome: Outcome) -> None:
        rows = read_rows(self.work_dir)
        numbers = [row["n"] for row in rows]
        missing = sorted(set(range(self.plan.records)) - set(numbers))
        if missing:
            raise SelfTestFailed(f"{len(missing)} record(s) never delivered, e.g. {missing[:5]}")
        first_seen: dict[str, list[int]] = {}
        seen: set[int] = set()
        for row in rows:
            if row["n"] not in seen:
                seen.add(row["n"])
                first_seen.setdefault(row["key"], []).append(row["n"])
        for key, order in first_seen.items():
            if order != sorted(order):
                wrong = next(i for i in range(1, len(order)) if order[i] < order[i - 1])
                raise SelfTestFailed(f"key {key!r}: record {order[wrong]} arrived after record {order[wrong - 1]}")
        children = {row["shard"] for row in rows} - {row["shard"] for row in rows if row["n"] < self.plan.records // 2}
        outcome.lines.append(
            f"verified: {self.plan.records:,} records put, {len(rows):,} delivered ({len(rows) - len(seen)} twice), "
            f"every one at least once and in order per key ({len(first_seen)} keys), across the split of "
            f"{self.split_shard} (the later records from {len(children)} shard(s) the first half never used)"
        )

    # ---- waiting -------------------------------------------------------------------------

    def _wait_active(self) -> None:
        deadline = self._clock() + STREAM_ACTIVE_TIMEOUT_S
        while True:
            summary = self.kinesis.describe_stream_summary(StreamName=self.plan.name)["StreamDescriptionSummary"]
            if summary["StreamStatus"] == "ACTIVE":
                return
            if self._clock() > deadline:
                raise SelfTestFailed(f"stream {self.plan.name} not ACTIVE after {STREAM_ACTIVE_TIMEOUT_S:g} s")
            self._sleep(POLL_INTERVAL_S)

    def _wait_for(self, what: str, done: Callable[[], bool]) -> None:
        deadline = self._clock() + self.timeout_s
        while not done():
            if self.worker is not None and self.worker.poll() is not None:
                raise SelfTestFailed(f"the worker exited {self.worker.returncode} before {what}: {self._worker_tail()}")
            if self._clock() > deadline:
                raise SelfTestFailed(
                    f"waited {self.timeout_s:g} s (--wait-s) for {what}, in vain: {self._worker_tail()}"
                )
            self._sleep(POLL_INTERVAL_S)

    def _worker_tail(self) -> str:
        """The worker's last ``efo:`` line, or the end of its log."""
        try:
            lines = (self.work_dir / "worker.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        for line in reversed(lines):
            if '"efo: ' in line or line.startswith("efo: "):
                return line if line.startswith("efo: ") else line[line.index('"efo: ') + 1 :].split('"')[0]
        return lines[-1] if lines else "(empty log)"

    def _stop_worker(self) -> int | None:
        worker, self.worker = self.worker, None
        if worker is None:
            return None
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            return worker.wait()

    # ---- clean-up ------------------------------------------------------------------------

    def _clean_up(self, outcome: Outcome) -> None:
        """Stop the worker, delete the stream (with its consumer) and the table, remove the local
        files; each whether or not it was made (the names are this run's alone)."""
        self._stop_worker()
        name = self.plan.name
        deadline = self._clock() + CLEAN_UP_TIMEOUT_S
        deleted = []
        try:
            self._delete(lambda: self.kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True), deadline)
            deleted.append(f"stream {name} (with its consumer)")
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                outcome.left.append(
                    f"stream {name}: {translate(exc, resource=f'stream {name!r}')}; delete it: aws kinesis "
                    f"delete-stream --stream-name {name} --enforce-consumer-deletion"
                )
        try:
            self._delete(lambda: self.dynamodb.delete_table(TableName=name), deadline)
            deleted.append(f"table {name}")
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                outcome.left.append(
                    f"table {name}: {translate(exc, resource=f'DynamoDB table {name!r}')}; delete it: aws dynamodb "
                    f"delete-table --table-name {name}"
                )
        shutil.rmtree(self.work_dir, ignore_errors=True)
        outcome.lines.append("deleted " + (", ".join(deleted) if deleted else "nothing (nothing was made)"))

    def _delete(self, delete: Callable[[], Any], deadline: float) -> None:
        """``delete()``, again while AWS refuses it with ResourceInUseException (not ACTIVE yet), until ``deadline``."""
        while True:
            try:
                delete()
                return
            except Exception as exc:
                if error_code(exc) != "ResourceInUseException" or self._clock() > deadline:
                    raise
            self._sleep(POLL_INTERVAL_S)


@contextmanager
def _interrupts_raise() -> Iterator[None]:
    """SIGTERM as SIGINT: either interrupts the run (KeyboardInterrupt), and the clean-up runs."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _interrupts_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _die_with_parent() -> None:
    from efo.devstack.stack import die_with_parent_process

    die_with_parent_process()
