"""``efo doctor``'s judgements that need no server: the shards against the workers and the pool, a
provisioned table's capacity, the checkpoints' age against retention, and the exit code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from efo.config import load_settings
from efo.doctor.findings import Report
from efo.doctor.stream import StreamFacts, _stream_state
from efo.doctor.table import _capacity, _retention
from efo.errors import EXIT_OK, EXIT_RUNTIME
from efo.kinesis.registration import StreamInfo


def facts(shards: int, retention_hours: int = 24) -> StreamFacts:
    info = StreamInfo("orders", "arn:aws:kinesis:eu-west-1:1:stream/orders", datetime.now(UTC), "ACTIVE", shards)
    return StreamFacts(info, retention_hours, None)


def one(report: Report) -> tuple[str, str]:
    [finding] = report.findings
    return finding.status, finding.detail


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)


def settings(**values: Any) -> Any:
    return load_settings(stream="orders", app="a", sink="console", **values)


def test_the_shards_fit_the_workers_and_the_pool_keeps_each_reserve() -> None:
    report = Report()
    _stream_state(report, settings(), {"StreamModeDetails": {"StreamMode": "ON_DEMAND"}}, facts(64).info, 4)
    [shards] = [f for f in report.findings if f.check == "stream.shards"]
    status, detail = shards.status, shards.detail
    assert status == "ok" and detail.startswith("ON_DEMAND, 64 open shard(s), 16 per worker over 4 worker(s)")


def test_per_shard_reserves_beyond_the_pool_are_a_warning_naming_both_settings() -> None:
    report = Report()
    small = settings(pool={"max_pending_records": 5000, "reserved_records_per_shard": 1000})
    _stream_state(report, small, {}, facts(8).info, 1)
    [shards] = [f for f in report.findings if f.check == "stream.shards"]
    assert shards.status == "warn"
    assert "pool.reserved_records_per_shard (1000) x 8 shards is more than pool.max_pending_records (5000)" in (
        shards.detail
    )


def test_a_lease_limit_that_leaves_shards_unread_fails() -> None:
    report = Report()
    _stream_state(report, settings(lease={"max_leases_per_worker": 3}), {}, facts(10).info, 3)
    [shards] = [f for f in report.findings if f.check == "stream.shards"]
    assert shards.status == "fail" and "leaves 1 shard(s) unread" in shards.detail


@pytest.mark.parametrize(
    ("throughput", "expected"),
    [
        ({"ReadCapacityUnits": 100, "WriteCapacityUnits": 100}, "ok"),
        ({"ReadCapacityUnits": 1, "WriteCapacityUnits": 5}, "warn"),
    ],
)
def test_a_provisioned_table_must_carry_the_heartbeats_and_checkpoints(
    throughput: dict[str, int], expected: str
) -> None:
    report = Report()
    description = {"BillingModeSummary": {"BillingMode": "PROVISIONED"}, "ProvisionedThroughput": throughput}
    # 2 workers x 1 stream / 2 s heartbeats + 64 shards / 5 s checkpoints = 13.8 writes/s; 2 reads/s.
    _capacity(report, "t", description, settings(), 2, [(settings(), facts(64))])
    status, detail = one(report)
    assert status == expected and "about 14 writes/s and 2 reads/s for 2 worker(s)" in detail
    report = Report()
    _capacity(report, "t", {"BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"}}, settings(), 2, [])
    assert one(report)[0] == "ok"


def test_a_checkpoint_near_or_past_retention_is_a_warning() -> None:
    now = datetime.now(UTC)
    report = Report()
    _retention(report, "app", facts(2, retention_hours=24), [now - timedelta(hours=1), None])
    assert one(report)[0] == "ok"
    report = Report()
    _retention(report, "app", facts(2, retention_hours=24), [now - timedelta(hours=1), now - timedelta(hours=20)])
    status, detail = one(report)
    assert status == "warn" and "written 20.0 h ago; the stream keeps 24 h" in detail and "TRIM_HORIZON" in detail
    report = Report()
    _retention(report, "app", facts(2), [])
    assert one(report) == ("ok", "app: no checkpoint yet; the stream keeps 24 h")


def test_the_exit_code_is_1_only_when_a_check_fails() -> None:
    report = Report()
    report.add("a", "r", "ok", "")
    report.add("b", "r", "warn", "")
    report.add("c", "r", "skip", "")
    assert report.exit_code == EXIT_OK and report.to_json()["ok"] is True
    report.add("d", "r", "fail", "")
    assert report.exit_code == EXIT_RUNTIME and [f.check for f in report.failed] == ["d"]


def test_a_stream_being_deleted_fails_and_one_being_created_warns() -> None:
    for status, expected in (("DELETING", "fail"), ("CREATING", "warn"), ("UPDATING", "ok")):
        report = Report()
        info = StreamInfo("orders", "arn:s", datetime.now(UTC), status, 1)
        _stream_state(report, settings(), {}, info, 1)
        assert [f.status for f in report.findings if f.check == "stream.status"] == [expected]


class NoConsumer:
    async def describe_stream_consumer(self, **_: Any) -> Any:
        import botocore.exceptions

        error = {"Error": {"Code": "ResourceNotFoundException", "Message": "no such consumer"}}
        raise botocore.exceptions.ClientError(error, "DescribeStreamConsumer")


@pytest.mark.parametrize(("registered", "expected"), [(19, "warn"), (20, "fail")])
def test_a_consumer_to_register_needs_room_under_the_limit_of_20(registered: int, expected: str) -> None:
    import asyncio

    from efo.doctor.stream import _consumer

    report = Report()
    import dataclasses

    info = dataclasses.replace(facts(2).info, consumers=registered)  # the stream's ConsumerCount
    asyncio.run(_consumer(report, settings(), NoConsumer(), info))
    [consumer] = [f for f in report.findings if f.check == "consumer"]
    assert consumer.status == expected and f"{registered} " in consumer.detail


class Subscriber:
    """SubscribeToShard as AWS answers it for a shard the stream does not have (after IAM allowed
    the call on the consumer's ARN); records every shard asked for."""

    def __init__(self) -> None:
        self.shards: list[str] = []

    async def subscribe_to_shard(self, *, ConsumerARN: str, ShardId: str, StartingPosition: Any) -> Any:
        import botocore.exceptions

        self.shards.append(ShardId)
        error = {"Error": {"Code": "ResourceNotFoundException", "Message": f"Shard {ShardId} does not exist"}}
        raise botocore.exceptions.ClientError(error, "SubscribeToShard")


def test_the_subscribe_check_never_takes_over_a_shard_a_running_worker_reads() -> None:
    """On AWS a SubscribeToShard 5 s or more after another one on the same consumer and shard takes
    the subscription over (the worker's fails with ResourceInUseException): the check must not name
    a shard of the stream, and a shard not found is an answer only a permitted call gets."""
    import asyncio

    from efo.doctor.stream import _subscribe

    report = Report()
    subscriber = Subscriber()
    open_shards = [f"shardId-{n:012d}" for n in range(4)]
    asyncio.run(_subscribe(report, subscriber, "arn:aws:kinesis:eu-west-1:1:stream/orders/consumer/c:1"))
    assert subscriber.shards and not set(subscriber.shards) & set(open_shards)
    [finding] = report.findings
    assert (finding.check, finding.status) == ("kinesis:SubscribeToShard", "ok"), finding


def test_an_aws_profile_that_does_not_exist_fails_the_credentials_check_and_no_aws_check_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from efo.doctor import _identity

    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    report = Report()
    assert _identity(report, settings(region="eu-west-1")) is False
    [credentials] = [f for f in report.findings if f.check == "credentials"]
    assert (
        credentials.status == "fail" and "AWS_PROFILE" in credentials.detail and "no-such-profile" in credentials.detail
    )
    assert [f.status for f in report.findings if f.check == "aws"] == ["skip"]


def test_aws_checks_that_do_not_finish_in_time_fail_the_doctor_naming_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint that never answers leaves every AWS check unknown: that is no deployment that
    holds, so the doctor exits 1, not 0 with a skip nobody reads in a helm test."""
    import asyncio

    from efo import doctor

    async def hangs(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(60)

    monkeypatch.setattr(doctor, "check_stream", hangs)
    monkeypatch.setattr(doctor, "AWS_CHECKS_TIMEOUT_S", 0.05)
    report = Report()
    endpoints = {"kinesis_endpoint": "http://127.0.0.1:9", "dynamodb_endpoint": "http://127.0.0.1:9"}
    asyncio.run(doctor._aws(report, settings(region="eu-west-1", **endpoints), 1))
    [finding] = report.findings
    assert finding.status == "fail" and "did not finish within 0.05 s" in finding.detail, finding
    assert report.exit_code == EXIT_RUNTIME


@pytest.mark.parametrize("code", ["ResourceInUseException", "LimitExceededException"])
def test_a_subscribe_check_refused_for_its_rate_or_an_open_subscription_holds(code: str) -> None:
    """Found in CI: a doctor run two seconds after another got ResourceInUseException (the local stack
    refuses a second subscription to the same consumer and shard for 3-4 s; AWS refuses more than one
    call a second per consumer and shard with LimitExceededException). Both answer a permitted call."""
    import asyncio

    import botocore.exceptions

    from efo.doctor.stream import _subscribe

    class Busy:
        async def subscribe_to_shard(self, **_: Any) -> Any:
            raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "busy"}}, "SubscribeToShard")

    report = Report()
    asyncio.run(_subscribe(report, Busy(), "arn:aws:kinesis:eu-west-1:1:stream/orders/consumer/c:1"))
    [finding] = report.findings
    assert (finding.check, finding.status) == ("kinesis:SubscribeToShard", "ok"), finding
