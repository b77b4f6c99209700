"""One iteration of a chaos scenario: real ``efo run`` workers on a fresh stream of the local stack,
a producer writing in the background, the disruptions (each with its exact duplicate bound), the
time each took to recover from, and the verdict of the invariant checker.

Everything random comes from one ``random.Random`` seeded with ``<seed>/<scenario>/<iteration>``,
so ``EFO_CHAOS_SEED=<seed>`` at the same size replays the same kill points, fault timings and
reshards (the machine's own timing still varies). Every failure names the seed and the command.

Recovery time, unless a scenario says otherwise: from the end of the disruption (a kill sent, a
fault fired, a pause resumed, a reshard ACTIVE) until every record acknowledged by then, and one
more written to every partition key at that moment (so to every shard), is committed by the sink.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from efo.devstack.faults import FaultClient
from efo.devstack.producer import wait_active
from efo.devstack.stack import StackEndpoints
from tests.integration.ledger_check import Checkpoint, Disruption, Produced, Verdict, check, committed_rows
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
    cleared and DynamoDB resumed, and a failure gains the seed and the replay command."""

    def __init__(
        self,
        scenario: str,
        iteration: int,
        stack: StackEndpoints,
        kinesis: Any,
        dynamodb: Any,
        tmp_path: Path,
        *,
        shards: int,
        initial_position: str = "TRIM_HORIZON",
        about: str | None = None,
        test: str = "tests/chaos",
        **env: str,
    ) -> None:
        self.scenario = scenario
        self.iteration = iteration
        self.test = test
        self.rng = random.Random(f"{SIZE.seed}/{scenario}/{iteration}")
        self.stack = stack
        self.kinesis = kinesis
        self.tmp_path = tmp_path
        self.w = Workers(
            stack,
            kinesis,
            dynamodb,
            tmp_path,
            shards=shards,
            initial_position=initial_position,
            **CHAOS_SETTINGS,
            **env,
        )
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
        self.w.wait_until(lambda: all(self.w.events(n, "service.ready") for n in names), timeout_s, "service.ready")

    def wait_committing(self, *names: str, timeout_s: float = 60.0) -> None:
        """Until each of these workers has committed a batch: a kill point after it means something."""

        def committing() -> bool:
            workers = {row["worker"] for row in committed_rows(self.w.sink)}
            return all(self.w.runs[name].env["EFO_WORKER_ID"] in workers for name in names)

        self.w.wait_until(committing, timeout_s, "a commit by each worker")

    def checkpoints(self, worker_ids: set[str] | None = None) -> dict[str, Checkpoint]:
        """The checkpoints of the shards these workers hold (None: of every shard), from the table."""
        return {
            shard_id: Checkpoint.of(lease)
            for shard_id, lease in self.w.leases().items()
            if worker_ids is None or lease.get("lease_owner", {}).get("S") in worker_ids
        }

    def kill(self, name: str, sig: signal.Signals) -> float:
        """Signal one worker and wait for its exit; returns when the signal was sent (epoch s).
        SIGKILL: what it committed past the checkpoints of its shards, read from the table just
        before and just after the kill (a claim may land in between), may be committed again.
        SIGTERM hands every lease over: exit 0 and nothing read twice."""
        run = self.w.runs[name]
        assert run.process is not None
        worker_id, pid = run.env["EFO_WORKER_ID"], run.process.pid
        before = self.checkpoints({worker_id})
        sent_at = time.time()
        code = self.w.stop(name, sig)
        if sig is signal.SIGKILL:
            after = self.checkpoints({worker_id})
            self.disruptions.append(Disruption(f"SIGKILL {name}", {**after, **before}, frozenset({(worker_id, pid)})))
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

    # ---- the stream -----------------------------------------------------------------------

    def reshard(self, max_open: int = 6) -> str:
        """One random reshard of the stream while it is read: split a random open shard at a
        random hash key, merge a random pair of adjacent open shards, or UpdateShardCount to a
        random count; waits until the stream is ACTIVE again and says what it did."""
        shards = self.kinesis.list_shards(StreamName=self.w.stream)["Shards"]
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
                StreamName=self.w.stream,
                ShardToSplit=shard["ShardId"],
                NewStartingHashKey=str(self.rng.randint(low + 1, high)),
            )
            what = f"split {shard['ShardId']}"
        elif op == "merge":
            a, b = self.rng.choice(adjacent)
            self.kinesis.merge_shards(
                StreamName=self.w.stream, ShardToMerge=a["ShardId"], AdjacentShardToMerge=b["ShardId"]
            )
            what = f"merge {a['ShardId']} and {b['ShardId']}"
        else:
            targets = [n for n in range((count + 1) // 2, min(2 * count, max_open) + 1) if n != count]
            target = self.rng.choice(targets)
            self.kinesis.update_shard_count(
                StreamName=self.w.stream, TargetShardCount=target, ScalingType="UNIFORM_SCALING"
            )
            what = f"UpdateShardCount {count} -> {target}"
        wait_active(self.kinesis, self.w.stream)
        return what

    # ---- DynamoDB --------------------------------------------------------------------------

    def pause_dynamodb(self) -> None:
        """SIGSTOP the local DynamoDB: every request hangs until it resumes. What any worker had
        committed past the checkpoints of the moment may be committed again once it resumes."""
        self.disruptions.append(Disruption("DynamoDB paused", self.checkpoints()))
        os.kill(self.stack.dynamodb_pid, signal.SIGSTOP)
        self._dynamodb_paused = True

    def resume_dynamodb(self) -> float:
        os.kill(self.stack.dynamodb_pid, signal.SIGCONT)
        self._dynamodb_paused = False
        resumed_ns = time.time_ns()
        pause = self.disruptions[-1]
        assert pause.what == "DynamoDB paused"
        self.disruptions[-1] = Disruption(pause.what, pause.checkpoints, until_ns=resumed_ns)
        return resumed_ns / 1e9

    # ---- records ---------------------------------------------------------------------------

    def put(self, count: int) -> list[Produced]:
        with self._producing:
            return self.w.producer.put(count)

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

        thread = threading.Thread(target=produce, name="chaos-producer", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(30)
        if failed:
            raise AssertionError(f"the producer failed: {failed[0]!r}")

    def committed(self) -> set[tuple[str, str]]:
        return {(row["shard"], row["seq"]) for row in committed_rows(self.w.sink)}

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
        self.put(len(self.w.producer.keys))
        self._wait_until_committed(f"recovery from {what}")
        seconds = round(time.time() - since, 2)
        self.outcome.recoveries.append((what, seconds))
        return seconds

    def _wait_until_committed(self, what: str) -> None:
        """Until every record acknowledged so far is committed, at most RECOVERY_BOUND_S."""
        with self._producing:
            wanted = {(p.shard_id, p.sequence_number) for p in self.w.producer.acknowledged}
        self.w.wait_until(lambda: wanted <= self.committed(), RECOVERY_BOUND_S, what)

    # ---- the verdict -----------------------------------------------------------------------

    def verdict(self) -> Verdict:
        with self._producing:
            produced = list(self.w.producer.acknowledged)
        return check(produced, self.w.sink, self.disruptions)

    def finish(self) -> Verdict:
        """Wait until everything acknowledged is committed, stop the workers (SIGTERM, exit 0), and
        check: nothing lost, per-key order kept, every duplicate accounted for by a disruption."""
        try:
            self._wait_until_committed("every record committed")
        finally:
            self.stop_all()
            verdict = self.verdict()
            self.outcome.checked(verdict)
            self._checked = True
        assert not verdict.lost, f"{len(verdict.lost)} records lost, e.g. {verdict.lost[:5]}: {verdict}"
        assert not verdict.out_of_order, f"out of order: {verdict.out_of_order[:5]}: {verdict}"
        assert not verdict.undue, (
            f"{len(verdict.undue)} duplicates no kill or outage accounts for, e.g. {verdict.undue[:5]} "
            f"(disruptions: {[d.what for d in self.disruptions]}): {verdict}"
        )
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
        "- **records**: acknowledged by Kinesis, over all iterations. **lost** and **out-of-order** (per "
        "partition key, in commit order) must be 0.",
        "- **duplicates**: extra copies committed (a record committed three times counts two); **allowed**: "
        "the copies the kills and outages of the scenario may repeat, each a commit by a SIGKILLed worker (or "
        "any worker, for the DynamoDB pause) past its shard's checkpoint as the lease table had it at that "
        "moment. Each such commit may be repeated once, so no record may have more extra copies than it has "
        "such commits (a record two kills left uncheckpointed may come three times); where nothing is killed "
        "or paused none is allowed.",
        "- **max recovery**: the longest, over the iterations, from the end of a disruption (a kill sent, "
        "the last fault fired, DynamoDB resumed, a reshard ACTIVE, the sink hung) until every record "
        "acknowledged by then, and one written then to every partition key, was committed. Exceptions "
        "are named below.",
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
