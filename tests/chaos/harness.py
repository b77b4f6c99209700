"""One iteration of a chaos scenario: real ``efo run`` workers on a fresh stream of the local stack
(or on several fresh streams of one application, ``streams=``), a producer per stream writing in
the background, the disruptions (each with its exact duplicate bound), the time each took to
recover from, and the verdict of the invariant checker (per stream, summed for the table).

Everything random comes from one ``random.Random`` seeded with ``<seed>/<scenario>/<iteration>``,
so ``EFO_CHAOS_SEED=<seed>`` at the same size replays the same kill points, fault timings and
reshards (the machine's own timing still varies). Every failure names the seed and the command.

Recovery time, unless a scenario says otherwise: from the end of the disruption (a kill sent, a
fault fired, a pause resumed, a reshard ACTIVE) until every record acknowledged by then, and one
more written to every partition key at that moment (so to every shard), is committed by the sink;
over several streams, every acknowledged record of every stream and one more to each of its keys.

Several streams: each has its own producer whose partition keys start with the stream's short name
(``orders-003``), its own starting position, and its own verdict (shard ids and checkpoints repeat
across streams, so a kill's checkpoints are taken from every stream's leases, one Disruption per
stream); the workers read them all through one YAML file (``efo run --config``).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from efo.devstack.faults import FaultClient
from efo.devstack.leases import shard_leases
from efo.devstack.producer import wait_active
from efo.devstack.stack import StackEndpoints
from tests.integration.ledger_check import (
    Checkpoint,
    Disruption,
    Produced,
    Producer,
    Verdict,
    check,
    committed_rows,
)
from tests.integration.service import create_stream, unique
from tests.integration.workers import Workers

ITERATIONS_ENV = "EFO_CHAOS_ITERATIONS"
SEED_ENV = "EFO_CHAOS_SEED"
SIZE_ENV = "EFO_CHAOS_SIZE"  # "reduced" (default, inside make test) or "full" (make chaos)
TABLE_ENV = "EFO_CHAOS_TABLE"  # a file to write the table to (make chaos: docs/chaos.md)
#: The user property that carries an iteration's Outcome in its test report, to the process that prints.
REPORT_PROPERTY = "chaos_outcome"

#: Leases fail over in 5 s (a heartbeat a second: a worker trusts its leases 4 s after its last
#: heartbeat landed, time for a throttled heartbeat's retries), checkpoints every 2 s (what a kill
#: may repeat), a silent subscription renewed after 3 s, a batch closed half a second after its
#: first record.
CHAOS_SETTINGS = {
    "EFO_BATCH__MAX_WAIT_S": "0.5",
    "EFO_LEASE__FAILOVER_S": "5",
    "EFO_LEASE__HEARTBEAT_INTERVAL_S": "1",
    "EFO_LEASE__SYNC_INTERVAL_S": "1",
    "EFO_CHECKPOINT__INTERVAL_S": "2",
    "EFO_SUBSCRIPTION__READ_TIMEOUT_S": "3",
    "EFO_SHARDS__SYNC_INTERVAL_S": "1",
}
#: How the proxy logs a fault it fires (logging's asctime is local time).
PROXY_FAULT_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) \S+ fault (?P<id>\d+): ")
#: No scenario may take longer than this to recover: a bound that proves "no hang", not a target.
RECOVERY_BOUND_S = 60.0
#: A SIGTERM ends a worker within shutdown_timeout_s (30 s) plus its final writes and exit.
STOP_BOUND_S = 45.0


@dataclass(frozen=True)
class Size:
    seed: int
    iterations: int
    full: bool

    @classmethod
    def from_env(cls) -> Size:
        seed = os.environ.get(SEED_ENV) or str(random.SystemRandom().randrange(1, 10**9))
        return cls(int(seed), int(os.environ.get(ITERATIONS_ENV) or 1), os.environ.get(SIZE_ENV, "reduced") == "full")

    def pick(self, reduced: Any, full: Any) -> Any:
        return full if self.full else reduced

    @property
    def name(self) -> str:
        return "full" if self.full else "reduced"


SIZE = Size.from_env()


@dataclass
class Outcome:
    """What one iteration of a scenario measured, in a form that travels in a test report (JSON):
    the verdict's counts once every record was committed (or as of the failure: then what was not
    committed yet counts as lost), the recoveries, and why it failed."""

    scenario: str
    iteration: int
    seed: int = 0
    size: str = ""
    about: str = ""  # the scenario's test docstring
    records: int = 0
    lost: int = 0
    out_of_order: int = 0
    duplicates: int = 0
    allowed: int = 0
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    failed: str | None = None

    def checked(self, verdict: Verdict) -> None:
        self.records, self.lost, self.out_of_order = verdict.produced, len(verdict.lost), len(verdict.out_of_order)
        self.duplicates, self.allowed = verdict.duplicates, verdict.allowed

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        fields = json.loads(text)
        fields["recoveries"] = [(what, seconds) for what, seconds in fields["recoveries"]]
        return cls(**fields)


@dataclass
class ChaosStream:
    """One stream a scenario reads: its short name (``""`` when it is the only one), its real name
    and ARN, its producer, and its starting position."""

    name: str
    stream: str
    arn: str
    producer: Producer
    initial_position: str
    #: Written before the first start to a stream read from LATEST: not in the producer's ledger
    #: (no worker is to read it), and never to be committed.
    skipped: list[Produced] = field(default_factory=list)

    def label(self, what: str) -> str:
        return f"{self.name}: {what}" if self.name else what


def merged(verdicts: Mapping[str, Verdict]) -> Verdict:
    """The verdicts of several streams as one (counts summed, records named ``<stream>/<shard>``)."""
    if len(verdicts) == 1:
        return next(iter(verdicts.values()))
    by_worker: Counter[str] = Counter()
    for verdict in verdicts.values():
        by_worker.update(verdict.by_worker)
    return Verdict(
        produced=sum(v.produced for v in verdicts.values()),
        committed=sum(v.committed for v in verdicts.values()),
        lost=[(f"{name}/{shard}", seq) for name, v in verdicts.items() for shard, seq in v.lost],
        out_of_order=[o for v in verdicts.values() for o in v.out_of_order],  # keys name their stream
        duplicates=sum(v.duplicates for v in verdicts.values()),
        by_worker=dict(by_worker),
        allowed=sum(v.allowed for v in verdicts.values()),
        undue=[(f"{name}/{shard}", seq) for name, v in verdicts.items() for shard, seq in v.undue],
    )


def replay_hint(scenario: str, iteration: int, test: str) -> str:
    """How to run this iteration again with the same random choices (the size changes them)."""
    again = (
        f"EFO_CHAOS_SEED={SIZE.seed} EFO_CHAOS_SIZE={SIZE.name} EFO_CHAOS_ITERATIONS={iteration + 1} "
        f".venv/bin/python -m pytest '{test}'"
    )
    whole = f"EFO_CHAOS_SEED={SIZE.seed} make chaos (every scenario), or " if SIZE.full else ""
    where = f"chaos seed {SIZE.seed}, {SIZE.name} size, scenario {scenario!r}, iteration {iteration}"
    return f"{where}: replay with {whole}{again}"


class Chaos:
    """Use as a context manager: on the way out every worker still running is killed, every fault
    cleared and DynamoDB resumed, and a failure gains the seed and the replay command.

    One stream of ``shards`` shards, or with ``streams`` (short name -> shards, in order) several
    streams of one application, each read from ``initial_position`` unless ``initial_positions``
    (short name -> position) says otherwise. Methods that concern one stream take its short name
    (none: the only stream)."""

    def __init__(
        self,
        scenario: str,
        iteration: int,
        stack: StackEndpoints,
        kinesis: Any,
        dynamodb: Any,
        tmp_path: Path,
        *,
        shards: int | None = None,
        streams: Mapping[str, int] | None = None,
        initial_position: str = "TRIM_HORIZON",
        initial_positions: Mapping[str, str] | None = None,
        about: str | None = None,
        test: str = "tests/chaos",
        **env: str,
    ) -> None:
        if (shards is None) == (streams is None):
            raise ValueError("a scenario reads one stream (shards=) or several (streams=)")
        self.scenario = scenario
        self.iteration = iteration
        self.test = test
        self.rng = random.Random(f"{SIZE.seed}/{scenario}/{iteration}")
        self.stack = stack
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.tmp_path = tmp_path
        counts = dict(streams) if streams is not None else {"": shards or 0}
        positions = {name: (initial_positions or {}).get(name, initial_position) for name in counts}
        first = next(iter(counts))
        self.w = Workers(
            stack,
            kinesis,
            dynamodb,
            tmp_path,
            shards=counts[first],
            initial_position=initial_position,
            stream_prefix=first or "workers",
            **CHAOS_SETTINGS,
            **env,
        )
        self.streams: dict[str, ChaosStream] = {
            first: ChaosStream(first, self.w.stream, self.w.stream_arn, self.w.producer, positions[first])
        }
        for name in list(counts)[1:]:
            stream = unique(name)
            create_stream(kinesis, stream, counts[name])
            arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
            self.streams[name] = ChaosStream(name, stream, arn, Producer(kinesis, stream), positions[name])
        if streams is not None:
            for s in self.streams.values():
                s.producer.keys = [f"{s.name}-{i:03d}" for i in range(len(s.producer.keys))]
            config = tmp_path / "efo.yaml"
            entries = [{"stream": s.stream, "initial_position": s.initial_position} for s in self.streams.values()]
            config.write_text(yaml.safe_dump({"streams": entries}))
            del self.w.env["EFO_STREAM"]
            self.w.args = ("--config", str(config))
        self.proxy_faults = FaultClient(stack.kinesis_endpoint)
        self.dynamodb_faults = FaultClient(stack.dynamodb_endpoint)
        self.disruptions: list[Disruption] = []
        self.outcome = Outcome(scenario, iteration, SIZE.seed, SIZE.name, about or "")
        self._producing = threading.Lock()
        self._dynamodb_paused = False
        self._checked = False

    def __enter__(self) -> Chaos:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._tidy_up()
        if not isinstance(exc, Exception):  # none, or an interrupt: as it is
            return
        if not self._checked:  # as of the failure: what was not committed yet counts as lost
            self.outcome.checked(self.verdict())
        self.outcome.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = replay_hint(self.scenario, self.iteration, self.test)
        raise AssertionError(f"{exc}\n{hint}; logs in {self.tmp_path}") from exc

    def _tidy_up(self) -> None:
        if self._dynamodb_paused:
            self.resume_dynamodb()
        self.proxy_faults.clear()
        self.dynamodb_faults.clear()
        for run in self.w.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()

    # ---- workers ---------------------------------------------------------------------------

    def start(self, *names: str, **env: str) -> None:
        """Start workers; ``name`` may be ``<worker id>.<n>`` to restart a worker id in a new process."""
        for name in names:
            self.w.stopped.discard(name)
            self.w.start(name, EFO_WORKER_ID=name.split(".")[0], **env)

    def expect_exit(self, *names: str) -> None:
        """These workers are to exit on their own: waits on the others do not fail when they do."""
        self.w.stopped.update(names)

    def live(self) -> list[str]:
        return [name for name, run in self.w.runs.items() if run.process is not None and run.process.poll() is None]

    def wait_ready(self, *names: str, timeout_s: float = 60.0) -> None:
        """Until each of these workers is ready for every stream (each stream's coordinator says so)."""
        streams = {s.stream for s in self.streams.values()}

        def ready(name: str) -> bool:
            return streams <= {e.get("stream") for e in self.w.events(name, "service.ready")}

        self.w.wait_until(lambda: all(ready(n) for n in names), timeout_s, "service.ready")

    def wait_committing(self, *names: str, timeout_s: float = 60.0) -> None:
        """Until each of these workers has committed a batch: a kill point after it means something."""

        def committing() -> bool:
            workers = {row["worker"] for row in committed_rows(self.w.sink)}
            return all(self.w.runs[name].env["EFO_WORKER_ID"] in workers for name in names)

        self.w.wait_until(committing, timeout_s, "a commit by each worker")

    def stream(self, name: str | None = None) -> ChaosStream:
        """A stream by its short name; none: the only stream."""
        if name is None:
            if len(self.streams) > 1:
                raise ValueError(f"which stream? {sorted(self.streams)}")
            (only,) = self.streams.values()
            return only
        return self.streams[name]

    def leases(self, name: str | None = None) -> dict[str, dict[str, Any]]:
        return shard_leases(self.dynamodb, self.w.app, self.w.app, self.stream(name).arn)

    def checkpoints(self, worker_ids: set[str] | None = None, name: str | None = None) -> dict[str, Checkpoint]:
        """The checkpoints of the shards of a stream these workers hold (None: of every shard), from
        the table."""
        return {
            shard_id: Checkpoint.of(lease)
            for shard_id, lease in self.leases(name).items()
            if worker_ids is None or lease.get("lease_owner", {}).get("S") in worker_ids
        }

    def _disrupted(
        self,
        what: str,
        checkpoints: Mapping[str, Mapping[str, Checkpoint]],
        victims: frozenset[tuple[str, int]] | None = None,
    ) -> None:
        """One disruption per stream, each over the checkpoints of its own stream's shards."""
        for name, s in self.streams.items():
            self.disruptions.append(Disruption(what, checkpoints[name], victims, stream=s.stream))

    def kill(self, name: str, sig: signal.Signals) -> float:
        """Signal one worker and wait for its exit; returns when the signal was sent (epoch s).
        SIGKILL: what it committed past the checkpoints of its shards, read from the table just
        before and just after the kill (a claim may land in between), may be committed again.
        SIGTERM hands every lease over: exit 0 and nothing read twice."""
        run = self.w.runs[name]
        assert run.process is not None
        worker_id, pid = run.env["EFO_WORKER_ID"], run.process.pid
        before = {stream: self.checkpoints({worker_id}, stream) for stream in self.streams}
        sent_at = time.time()
        code = self.w.stop(name, sig)
        if sig is signal.SIGKILL:
            after = {stream: self.checkpoints({worker_id}, stream) for stream in self.streams}
            both = {stream: {**after[stream], **before[stream]} for stream in self.streams}
            self._disrupted(f"SIGKILL {name}", both, frozenset({(worker_id, pid)}))
        else:
            assert code == 0, f"{name} exited {code} after {sig.name}:\n{run.tail()}"
        return sent_at

    def stop_all(self) -> None:
        """SIGTERM to every live worker at once (a second signal would exit at once), each exits 0."""
        names = self.live()
        for name in names:
            self.w.stopped.add(name)
            self.w.runs[name].process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]  # the process only
        for name in names:
            run = self.w.runs[name]
            assert run.process is not None
            code = run.process.wait(STOP_BOUND_S)
            assert code == 0, f"{name} exited {code} after SIGTERM:\n{run.tail()}"

    # ---- faults through the conformance proxy -------------------------------------------------

    def add_proxy_fault(self, **rule: Any) -> int:
        return int(self.proxy_faults.add(**rule)["id"])

    def proxy_faults_fired(self) -> dict[int, float]:
        """When each fault rule of the proxy fired (epoch s), from its log ("fault <id>: ...")."""
        fired: dict[int, float] = {}
        log = Path(self.stack.log_dir) / "efo-proxy.log"
        for line in log.read_text(errors="replace").splitlines():
            match = PROXY_FAULT_LINE.match(line)
            if match:
                at = time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1000
                fired.setdefault(int(match["id"]), at)
        return fired

    def wait_for_proxy_faults(self, ids: set[int], timeout_s: float) -> float:
        """Until every one of these rules fired; returns when the last one did (epoch s)."""
        self.wait_for(lambda: ids <= set(self.proxy_faults_fired()), timeout_s, f"proxy faults {sorted(ids)} fired")
        return max(at for rule, at in self.proxy_faults_fired().items() if rule in ids)

    # ---- the streams ----------------------------------------------------------------------

    def reshard(self, name: str | None = None, max_open: int = 6) -> str:
        """One random reshard of a stream while it is read: split a random open shard at a
        random hash key, merge a random pair of adjacent open shards, or UpdateShardCount to a
        random count; waits until the stream is ACTIVE again and says what it did."""
        chosen = self.stream(name)
        stream = chosen.stream
        shards = self.kinesis.list_shards(StreamName=stream)["Shards"]
        open_shards = sorted(
            (s for s in shards if s["SequenceNumberRange"].get("EndingSequenceNumber") is None),
            key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
        )
        adjacent = [
            (a, b)
            for a, b in itertools.pairwise(open_shards)
            if int(a["HashKeyRange"]["EndingHashKey"]) + 1 == int(b["HashKeyRange"]["StartingHashKey"])
        ]
        count = len(open_shards)
        choices = ["update"] + (["split"] if count < max_open else []) + (["merge"] if adjacent else [])
        op = self.rng.choice(choices)
        if op == "split":
            shard = self.rng.choice(open_shards)
            low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
            self.kinesis.split_shard(
                StreamName=stream,
                ShardToSplit=shard["ShardId"],
                NewStartingHashKey=str(self.rng.randint(low + 1, high)),
            )
            what = f"split {shard['ShardId']}"
        elif op == "merge":
            a, b = self.rng.choice(adjacent)
            self.kinesis.merge_shards(StreamName=stream, ShardToMerge=a["ShardId"], AdjacentShardToMerge=b["ShardId"])
            what = f"merge {a['ShardId']} and {b['ShardId']}"
        else:
            targets = [n for n in range((count + 1) // 2, min(2 * count, max_open) + 1) if n != count]
            target = self.rng.choice(targets)
            self.kinesis.update_shard_count(StreamName=stream, TargetShardCount=target, ScalingType="UNIFORM_SCALING")
            what = f"UpdateShardCount {count} -> {target}"
        wait_active(self.kinesis, stream)
        return chosen.label(what)

    # ---- DynamoDB --------------------------------------------------------------------------

    def pause_dynamodb(self) -> None:
        """SIGSTOP the local DynamoDB: every request hangs until it resumes. What any worker had
        committed past the checkpoints of the moment may be committed again once it resumes."""
        self._disrupted("DynamoDB paused", {stream: self.checkpoints(name=stream) for stream in self.streams})
        os.kill(self.stack.dynamodb_pid, signal.SIGSTOP)
        self._dynamodb_paused = True

    def resume_dynamodb(self) -> float:
        os.kill(self.stack.dynamodb_pid, signal.SIGCONT)
        self._dynamodb_paused = False
        resumed_ns = time.time_ns()
        pauses = [i for i, d in enumerate(self.disruptions) if d.what == "DynamoDB paused" and d.until_ns is None]
        assert pauses, "DynamoDB resumed, yet not paused"
        for i in pauses:  # one per stream
            pause = self.disruptions[i]
            self.disruptions[i] = Disruption(pause.what, pause.checkpoints, until_ns=resumed_ns, stream=pause.stream)
        return resumed_ns / 1e9

    # ---- records ---------------------------------------------------------------------------

    def put(self, count: int, *names: str) -> list[Produced]:
        """``count`` records to each of these streams (none: to every stream)."""
        with self._producing:
            return [p for name in names or list(self.streams) for p in self.streams[name].producer.put(count)]

    def put_before_start(self, count: int) -> None:
        """``count`` records to every stream before any worker starts: a stream read from
        TRIM_HORIZON is to read them; one read from LATEST is not, so they leave its producer's
        ledger for ``skipped`` (``finish`` checks that none was committed)."""
        assert not self.w.runs, "put_before_start after a worker started"
        with self._producing:
            for s in self.streams.values():
                written = s.producer.put(count)
                if s.initial_position == "LATEST" and written:  # [-0:] would be the whole ledger
                    del s.producer.acknowledged[-len(written) :]
                    s.skipped.extend(written)

    @contextmanager
    def traffic(self, records: int = 24, every_s: float = 0.25) -> Iterator[None]:
        """A producer in the background for as long as the block runs: ``records`` every ``every_s``."""
        done = threading.Event()
        failed: list[BaseException] = []

        def produce() -> None:
            while not done.wait(every_s):
                try:
                    self.put(records)
                except BaseException as exc:  # reported when the block ends
                    failed.append(exc)
                    return

        thread = threading.Thread(target=produce, name="chaos-producer", daemon=True)  # to every stream
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(30)
        if failed:
            raise AssertionError(f"the producer failed: {failed[0]!r}")

    def committed(self, name: str | None = None) -> set[tuple[str, str]]:
        """(shard id, sequence number) of what the sink committed of a stream."""
        return {(row["shard"], row["seq"]) for row in committed_rows(self.w.sink, self.stream(name).stream)}

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Until ``condition`` holds (failing if a worker dies); returns when it did (epoch s)."""
        self.w.wait_until(condition, timeout_s, what)
        return time.time()

    def sleep(self, low_s: float, high_s: float) -> float:
        """A random pause of the scenario (the kill point, a fault's moment)."""
        seconds = self.rng.uniform(low_s, high_s)
        time.sleep(seconds)
        return seconds

    def recovered(self, since: float, what: str) -> float:
        """Seconds from ``since`` (epoch s) until every record acknowledged so far and one written
        now to every key is committed (see the module's docstring); recorded for the table."""
        with self._producing:
            for s in self.streams.values():
                s.producer.put(len(s.producer.keys))
        self._wait_until_committed(f"recovery from {what}")
        seconds = round(time.time() - since, 2)
        self.outcome.recoveries.append((what, seconds))
        return seconds

    def _wait_until_committed(self, what: str) -> None:
        """Until every record of every stream acknowledged so far is committed, at most RECOVERY_BOUND_S."""
        with self._producing:
            wanted = {
                (s.stream, p.shard_id, p.sequence_number)
                for s in self.streams.values()
                for p in s.producer.acknowledged
            }

        def committed() -> set[tuple[str, str, str]]:
            return {(row["stream"], row["shard"], row["seq"]) for row in committed_rows(self.w.sink)}

        self.w.wait_until(lambda: wanted <= committed(), RECOVERY_BOUND_S, what)

    # ---- the verdict -----------------------------------------------------------------------

    def verdicts(self) -> dict[str, Verdict]:
        """Each stream's verdict, over its own rows and the disruptions of its own shards."""
        with self._producing:
            produced = {name: list(s.producer.acknowledged) for name, s in self.streams.items()}
        return {
            name: check(produced[name], self.w.sink, self.disruptions, stream=s.stream)
            for name, s in self.streams.items()
        }

    def verdict(self) -> Verdict:
        """The verdict over every stream (summed: see ``merged``)."""
        return merged(self.verdicts())

    def committed_before_start(self) -> dict[str, int]:
        """By stream, how many records written before the first start of a stream read from LATEST
        were committed (must be none)."""
        return {
            name: len({(p.shard_id, p.sequence_number) for p in s.skipped} & self.committed(name or None))
            for name, s in self.streams.items()
            if s.skipped
        }

    def finish(self) -> Verdict:
        """Wait until everything acknowledged is committed, stop the workers (SIGTERM, exit 0), and
        check: nothing lost, per-key order kept, every duplicate accounted for by a disruption."""
        try:
            self._wait_until_committed("every record committed")
        finally:
            self.stop_all()
            verdicts = self.verdicts()
            verdict = merged(verdicts)
            self.outcome.checked(verdict)
            self._checked = True
        about = f"{verdict}" + (
            "; " + "; ".join(f"{name}: {v}" for name, v in verdicts.items()) if len(verdicts) > 1 else ""
        )
        assert not verdict.lost, f"{len(verdict.lost)} records lost, e.g. {verdict.lost[:5]}: {about}"
        assert not verdict.out_of_order, f"out of order: {verdict.out_of_order[:5]}: {about}"
        assert not verdict.undue, (
            f"{len(verdict.undue)} duplicates no kill or outage accounts for, e.g. {verdict.undue[:5]} "
            f"(disruptions: {list(dict.fromkeys(d.what for d in self.disruptions))}): {about}"
        )
        early = self.committed_before_start()
        assert not any(early.values()), f"written before the first start, read from LATEST, yet committed: {early}"
        return verdict

    # ---- logs ------------------------------------------------------------------------------

    def events(self, event: str) -> list[dict[str, Any]]:
        return [e for run in self.w.runs.values() for e in run.events() if e.get("event") == event]


def table_rows(outcomes: list[Outcome]) -> list[list[str]]:
    """One row per scenario, in the order they ran: the sums over its iterations, the worst recovery."""
    by_scenario: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_scenario.setdefault(outcome.scenario, []).append(outcome)
    rows = []
    for scenario, runs in by_scenario.items():
        recoveries = [seconds for run in runs for _, seconds in run.recoveries]
        failed = sum(1 for run in runs if run.failed)
        rows.append(
            [
                scenario,
                f"{len(runs)}" + (f" ({failed} failed)" if failed else ""),
                str(sum(run.records for run in runs)),
                str(sum(run.lost for run in runs)),
                str(sum(run.out_of_order for run in runs)),
                f"{sum(run.duplicates for run in runs)} (allowed {sum(run.allowed for run in runs)})",
                f"{max(recoveries):.1f} s" if recoveries else "-",
            ]
        )
    return rows


def scenario_notes(outcomes: list[Outcome]) -> list[str]:
    """One bullet per test: the scenarios it ran, and what it does (its docstring)."""
    scenarios: dict[str, list[str]] = {}
    for outcome in outcomes:
        names = scenarios.setdefault(" ".join(outcome.about.split()), [])
        if outcome.scenario not in names:
            names.append(outcome.scenario)
    return [f"- **{'; '.join(names)}**: {about}" for about, names in scenarios.items()]


HEADER = ["scenario", "iterations", "records", "lost", "out-of-order", "duplicates", "max recovery"]


def markdown_table(outcomes: list[Outcome]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(outcomes)]
    return "\n".join(lines)


def replay_line(outcomes: list[Outcome]) -> str:
    runs = sorted({(o.seed, o.size) for o in outcomes})
    iterations = max(o.iteration for o in outcomes) + 1
    return "; ".join(
        f"seed {seed}, {size} size, {iterations} iteration(s) per scenario: EFO_CHAOS_SEED={seed} "
        + ("make chaos replays it" if size == "full" else f"EFO_CHAOS_SIZE={size} pytest tests/chaos replays it")
        for seed, size in runs
    )


def summary(terminalreporter: Any, outcomes: list[Outcome]) -> None:
    """The end of the test output (tests/conftest.py, from every process's reports): the seed and
    the table; with EFO_CHAOS_TABLE, the page docs/chaos.md written there."""
    terminalreporter.section("chaos")
    terminalreporter.write_line(replay_line(outcomes))
    terminalreporter.write_line(markdown_table(outcomes))
    path = os.environ.get(TABLE_ENV)
    if path:
        Path(path).write_text(page(outcomes))
        terminalreporter.write_line(f"written to {path}")


def page(outcomes: list[Outcome]) -> str:
    """docs/chaos.md: the table, how it was made, and what each row did."""
    (seed, size), *_ = sorted({(o.seed, o.size) for o in outcomes})
    iterations = max(o.iteration for o in outcomes) + 1
    failed = [o for o in outcomes if o.failed]
    command = f"EFO_CHAOS_SEED={seed} " + (
        "make chaos" if size == "full" else f"EFO_CHAOS_SIZE={size} pytest tests/chaos"
    )
    lines = [
        "# Chaos run",
        "",
        f"Written by `{command}` (tests/chaos; {size} size, {iterations} "
        f"iteration(s) per scenario) on {time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} shared "
        f"cores, Python {platform.python_version()}, against the local stack (kinesis-local behind the "
        "conformance proxy, moto DynamoDB). The same command replays the same kill points, fault timings "
        "and reshards; the machine's own timing still varies.",
        "",
        markdown_table(outcomes),
        "",
        "- **records**: acknowledged by Kinesis, over all iterations (and over every stream of a scenario "
        "that reads several, each checked on its own). **lost** and **out-of-order** (per partition key, in "
        "commit order) must be 0.",
        "- **duplicates**: extra copies committed (a record committed three times counts two); **allowed**: "
        "the copies the kills and outages of the scenario may repeat, each a commit by a SIGKILLed worker (or "
        "any worker, for the DynamoDB pause) past its shard's checkpoint as the lease table had it at that "
        "moment. Each such commit may be repeated once, so no record may have more extra copies than it has "
        "such commits (a record two kills left uncheckpointed may come three times); where nothing is killed "
        "or paused none is allowed.",
        "- **max recovery**: the longest, over the iterations, from the end of a disruption (a kill sent, "
        "the last fault fired, DynamoDB resumed, a reshard ACTIVE, the sink hung) until every record "
        "acknowledged by then, and one written then to every partition key of every stream, was committed. "
        "Exceptions are named below.",
        "",
        "## Scenarios",
        "",
        *scenario_notes(outcomes),
    ]
    if failed:
        lines += [
            "",
            "## Failed iterations",
            "",
            "Counts as of the failure: what was not committed yet counts as lost.",
            "",
        ]
        lines += [f"- {o.scenario}, iteration {o.iteration}: {_shortened(o.failed or '')}" for o in failed]
    return "\n".join(lines) + "\n"


def _shortened(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
