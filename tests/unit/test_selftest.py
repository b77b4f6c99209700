"""``efo selftest`` without a server: what it says it creates and costs, that a record missing or
out of order per key fails the verification, and its clean-up, on a fake account (FakeAccount:
Kinesis and DynamoDB as far as the selftest calls them, with AWS's refusal to delete a stream or a
table that is not ACTIVE yet) and a fake worker."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from efo.config import load_settings
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME
from efo.selftest.run import PREFIX, STEPS, TEST_INTERRUPT_VARIABLE, Outcome, Plan, SelfTest, SelfTestFailed
from efo.selftest.sink import ROWS_FILE


@pytest.fixture(autouse=True)
def no_aws_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """No botocore client is made (a third of a second each): no test here reaches AWS."""
    monkeypatch.setattr("efo.selftest.run._client", lambda service, settings: None)


@pytest.fixture
def selftest(monkeypatch: pytest.MonkeyPatch) -> Iterator[SelfTest]:
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(
        stream="s", app="a", sink="console", region="eu-west-1", kinesis_endpoint="http://127.0.0.1:9"
    )
    test = SelfTest(Plan.new("eu-west-1", records=6, keys=2), settings, say=lambda line: None)
    test.split_shard = "shardId-000000000000"
    yield test
    shutil.rmtree(test.work_dir, ignore_errors=True)


def rows(test: SelfTest, numbers: list[int]) -> None:
    lines = [json.dumps({"n": n, "key": f"key-{n % 2}", "shard": "s", "seq": str(n)}) for n in numbers]
    (test.work_dir / ROWS_FILE).write_text("".join(line + "\n" for line in lines))


def test_the_plan_names_what_it_creates_under_one_unique_name_and_the_cost() -> None:
    plan = Plan.new("eu-west-1", shards=3)
    assert plan.name.startswith(PREFIX) and plan.name != Plan.new("eu-west-1").name
    text = "\n".join(plan.lines())
    assert f"Kinesis stream  {plan.name}  (3 shards, 4 open after a split)" in text
    assert f"DynamoDB table  {plan.name}" in text and "region eu-west-1" in text
    assert "at most about $0.12" in text  # 4 shards x ($0.015 stream + $0.015 consumer) for an hour


def test_every_record_at_least_once_and_in_order_per_key_passes(selftest: SelfTest) -> None:
    rows(selftest, [0, 1, 2, 3, 2, 3, 4, 5])  # a replay of 2 and 3: at least once is fine
    outcome = Outcome(1)
    selftest._verify(outcome)
    assert (
        "6 records put, 8 delivered (2 twice), every one at least once and in order per key (2 keys)"
        in (outcome.lines[0])
    )


@pytest.mark.parametrize(
    ("numbers", "message"),
    [
        ([0, 1, 2, 3, 5], "1 record(s) never delivered, e.g. [4]"),
        ([0, 1, 4, 3, 2, 5], "key 'key-0': record 2 arrived after record 4"),
    ],
)
def test_a_record_missing_or_out_of_order_fails(selftest: SelfTest, numbers: list[int], message: str) -> None:
    rows(selftest, numbers)
    with pytest.raises(SelfTestFailed) as failed:
        selftest._verify(Outcome(1))
    assert str(failed.value) == message


def test_the_workers_last_efo_line_is_its_cause(selftest: SelfTest) -> None:
    log: Any = selftest.work_dir / "worker.log"
    Path(log).write_text('{"event": "service.ready"}\n{"level": "error", "event": "efo: access to table denied"}\n')
    assert selftest._worker_tail() == "efo: access to table denied"


# ---- the clean-up, on a fake account -----------------------------------------------------------


def aws_error(code: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": code}}, operation)


@dataclass
class Stream:
    status: str = "CREATING"
    polls: int = 0  # calls on a CREATING or UPDATING stream until it is ACTIVE (time passing)
    shards: list[str] = field(default_factory=lambda: ["shardId-000000000000", "shardId-000000000001"])


class FakeAccount:
    """Kinesis and DynamoDB as the selftest calls them. A stream is CREATING (after a split
    UPDATING) for ``polls`` descriptions, and, as on AWS, not deleted before it is ACTIVE; a table
    the fake worker creates is CREATING for ``table_polls`` DeleteTable calls, refused meanwhile.
    ``interrupt_on`` raises KeyboardInterrupt (a Ctrl-C) at the first call of that operation,
    ``interrupt_after`` once its first call is done."""

    def __init__(
        self,
        *,
        polls: int = 0,
        table_polls: int = 0,
        interrupt_on: str | None = None,
        interrupt_after: str | None = None,
    ) -> None:
        self.streams: dict[str, Stream] = {}
        self.tables: dict[str, int] = {}  # name: DeleteTable calls it still refuses (CREATING)
        self.polls, self.table_polls = polls, table_polls
        self.interrupt_on, self.interrupt_after = interrupt_on, interrupt_after
        self.records: list[tuple[int, str, str]] = []
        self.rows_to: Path | None = None  # the worker's output once it reads

    def _call(self, operation: str) -> None:
        if operation == self.interrupt_on:
            self.interrupt_on = None
            raise KeyboardInterrupt

    def _done(self, operation: str) -> None:
        if operation == self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt

    def _stream(self, name: str, operation: str) -> Stream:
        if name not in self.streams:
            raise aws_error("ResourceNotFoundException", operation)
        return self.streams[name]

    def create_stream(self, StreamName: str, ShardCount: int) -> None:
        self._call("CreateStream")
        self.streams[StreamName] = Stream("CREATING", self.polls, [f"shardId-{n:012d}" for n in range(ShardCount)])
        self._done("CreateStream")

    def describe_stream_summary(self, StreamName: str) -> dict[str, Any]:
        self._call("DescribeStreamSummary")
        stream = self._tick(self._stream(StreamName, "DescribeStreamSummary"))
        return {"StreamDescriptionSummary": {"StreamStatus": stream.status}}

    @staticmethod
    def _tick(stream: Stream) -> Stream:
        if stream.status != "ACTIVE":
            stream.polls -= 1
            stream.status = "ACTIVE" if stream.polls < 0 else stream.status
        return stream

    def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
        self._call("PutRecords")
        stream = self._stream(StreamName, "PutRecords")
        results = []
        for record in Records:
            shard = stream.shards[hash(record["PartitionKey"]) % len(stream.shards)]
            self.records.append((json.loads(record["Data"])["n"], record["PartitionKey"], shard))
            results.append({"ShardId": shard, "SequenceNumber": str(len(self.records))})
        self.deliver()
        return {"FailedRecordCount": 0, "Records": results}

    def deliver(self) -> None:
        """The worker's sink: every record put so far, once the worker reads."""
        if self.rows_to is not None:
            lines = [json.dumps({"n": n, "key": key, "shard": shard, "seq": "1"}) for n, key, shard in self.records]
            (self.rows_to / ROWS_FILE).write_text("".join(line + "\n" for line in lines))

    def list_shards(self, StreamName: str, ShardFilter: Any) -> dict[str, Any]:
        shards = self._stream(StreamName, "ListShards").shards
        return {
            "Shards": [{"ShardId": s, "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}} for s in shards]
        }

    def split_shard(self, StreamName: str, ShardToSplit: str, NewStartingHashKey: str) -> None:
        self._call("SplitShard")
        stream = self._stream(StreamName, "SplitShard")
        stream.status, stream.polls = "UPDATING", self.polls
        stream.shards = [s for s in stream.shards if s != ShardToSplit] + [
            "shardId-000000000008",
            "shardId-000000000009",
        ]
        self._done("SplitShard")

    def delete_stream(self, StreamName: str, EnforceConsumerDeletion: bool) -> None:
        stream = self._stream(StreamName, "DeleteStream")
        if stream.status != "ACTIVE":
            self._tick(stream)
            raise aws_error("ResourceInUseException", "DeleteStream")  # "... is not currently ACTIVE"
        del self.streams[StreamName]

    def delete_table(self, TableName: str) -> None:
        if TableName not in self.tables:
            raise aws_error("ResourceNotFoundException", "DeleteTable")
        if self.tables[TableName] > 0:
            self.tables[TableName] -= 1
            raise aws_error("ResourceInUseException", "DeleteTable")  # "Table is being created"
        del self.tables[TableName]


class FakeWorker:
    """``efo run`` as the selftest sees it: running until a signal, then exit 0."""

    def __init__(self) -> None:
        self.pid = 4242
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None, "waited for a worker that was never stopped"
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


class OnFakeAccount(SelfTest):
    """The selftest with the fake account's clients, a fake clock, and the fake worker in place of
    ``efo run`` (which registers the consumer, creates the table and reads)."""

    def __init__(self, account: FakeAccount, plan: Plan, settings: Any) -> None:
        self.now = 0.0
        super().__init__(plan, settings, say=lambda line: None, clock=lambda: self.now, sleep=self._advance)
        self.kinesis = self.dynamodb = account
        self.account = account

    def _advance(self, seconds: float) -> None:
        self.now += seconds

    def _start_worker(self, outcome: Outcome) -> None:
        self.worker = FakeWorker()  # type: ignore[assignment]
        self.account.tables[self.plan.name] = self.account.table_polls
        self.account.rows_to = self.work_dir
        self.account.deliver()


@pytest.fixture
def on_account(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``on_account(account)``: a selftest of 40 records on ``account``, its files under tmp_path."""
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = load_settings(stream="s", app="a", sink="console", region="eu-west-1")

    def make(account: FakeAccount) -> OnFakeAccount:
        return OnFakeAccount(account, Plan.new("eu-west-1", records=40, keys=4), settings)

    return make


def test_a_stream_or_table_not_yet_active_when_interrupted_is_deleted_once_it_may_be(
    on_account: Any, tmp_path: Path
) -> None:
    """DeleteStream refuses a stream still CREATING or UPDATING (a split), DeleteTable a table still
    CREATING (ResourceInUseException): a Ctrl-C in either wait must not leave them behind."""
    for account in (
        FakeAccount(polls=3, interrupt_after="CreateStream"),  # Ctrl-C while the stream is CREATING
        FakeAccount(polls=3, interrupt_after="SplitShard"),  # ... while it is being split (UPDATING)
        FakeAccount(table_polls=2, interrupt_after="SplitShard"),  # ... while the worker's table is CREATING
    ):
        test = on_account(account)
        outcome = test.run()
        assert outcome.exit_code == EXIT_RUNTIME and outcome.lines[0].startswith("interrupted at step ")
        assert outcome.left == [] and account.streams == {} and account.tables == {}, outcome
        assert outcome.lines[-1].startswith(f"deleted stream {test.plan.name}")
        assert not test.work_dir.exists()


class Interrupts:
    """Ctrl-C as a terminal delivers it: SIGINT raises KeyboardInterrupt (Python's own handler)."""

    def __enter__(self) -> None:
        self.previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGINT, self.previous)


def test_the_whole_path_on_the_fake_account_is_verified_and_everything_is_deleted(on_account: Any) -> None:
    account = FakeAccount(polls=2)
    test = on_account(account)
    outcome = test.run()
    assert outcome.exit_code == EXIT_OK and outcome.left == [], outcome
    assert outcome.lines[0].startswith("verified: 40 records put, 40 delivered (0 twice)")
    assert outcome.lines[-1] == f"deleted stream {test.plan.name} (with its consumer), table {test.plan.name}"
    assert account.streams == {} and account.tables == {} and not test.work_dir.exists()


@pytest.mark.parametrize("step", STEPS)
def test_interrupted_at_each_step_by_its_hook_it_deletes_what_it_made(
    on_account: Any, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Every step, at its start, by the hook the integration tests use on the local stack
    (TEST_INTERRUPT_VARIABLE: a real SIGINT): the worker stopped, the stream and the table deleted
    if they were made, the local files gone, exit 1."""
    monkeypatch.setenv(TEST_INTERRUPT_VARIABLE, step)
    account = FakeAccount(polls=1)
    with Interrupts():
        test = on_account(account)
        outcome = test.run()
    assert outcome.exit_code == EXIT_RUNTIME and outcome.lines[0] == f"interrupted at step {step}", outcome
    assert outcome.left == [] and account.streams == {} and account.tables == {}
    assert test.worker is None and not test.work_dir.exists()  # stopped, and its files removed
    name = test.plan.name
    made = {
        "create-stream": "nothing (nothing was made)",
        "put": f"stream {name} (with its consumer)",
        "start-worker": f"stream {name} (with its consumer)",
    }.get(step, f"stream {name} (with its consumer), table {name}")
    assert outcome.lines[-1] == f"deleted {made}"


def test_without_a_terminal_and_without_yes_it_refuses_before_it_makes_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from efo.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    monkeypatch.setattr("efo.cli.selftest.SelfTest", None)  # a selftest made would fail the command (TypeError)
    assert main(["selftest"]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    assert out == "" and "--yes" in err and err.startswith("efo: refusing to create a stream")


def test_a_worker_that_never_delivers_times_out_naming_the_option_that_sets_the_wait(on_account: Any) -> None:
    account = FakeAccount()
    test = on_account(account)
    test.timeout_s = 30.0
    test._start_worker = lambda outcome: setattr(test, "worker", FakeWorker())  # runs, delivers nothing
    outcome = test.run()
    assert outcome.exit_code == EXIT_RUNTIME and outcome.left == [] and account.streams == {}
    expected = "step caught-up failed: waited 30 s (--wait-s) for all 40 records delivered, in vain: "
    assert outcome.lines[0].startswith(expected), outcome.lines


@pytest.mark.parametrize(
    ("operation", "code"),
    [
        ("SplitShard", "AccessDeniedException"),
        ("PutRecords", "AccessDeniedException"),
        ("SplitShard", "LimitExceededException"),
    ],
)
def test_an_aws_error_of_a_step_is_said_with_its_step_and_cause_and_everything_is_deleted(
    on_account: Any, operation: str, code: str
) -> None:
    """A refusal the selftest does not expect (efo's own policy lacks kinesis:SplitShard and
    PutRecords; a split can be throttled) is a failed step with its cause, not a traceback that
    hides the clean-up's outcome."""
    account = FakeAccount()

    def refused(*args: Any, **kwargs: Any) -> None:
        raise aws_error(code, operation)

    setattr(account, "split_shard" if operation == "SplitShard" else "put_records", refused)
    test = on_account(account)
    outcome = test.run()
    step = "split" if operation == "SplitShard" else "put"
    assert outcome.exit_code == EXIT_RUNTIME and outcome.left == [], outcome
    assert outcome.lines[0].startswith(f"step {step} failed: ") and code in outcome.lines[0], outcome.lines
    assert f"stream {test.plan.name!r}" in outcome.lines[0], outcome.lines
    assert outcome.lines[-1].startswith(f"deleted stream {test.plan.name}")
    assert account.streams == {} and account.tables == {} and not test.work_dir.exists()
