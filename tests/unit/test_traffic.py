"""``efo dev put``'s producer without a server: payload sizes, PutRecords limits, pacing on a fake
clock, KPL aggregates that efo's own de-aggregation reads back, refused records put again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from efo.devstack.traffic import PUT_RECORDS_MAX, PUT_RECORDS_MAX_BYTES, Producer, Traffic, entries, payload
from efo.errors import EfoError
from efo.kinesis.kpl import deaggregate


class FakeKinesis:
    """PutRecords that acknowledges every record (but those ``refuse`` says), shard by key."""

    def __init__(self, refuse: int = 0, clock: list[float] | None = None) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.at: list[float] = []
        self.refuse = refuse  # the first N records offered are refused, once each call until used up
        self.clock = clock

    def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(Records)
        if self.clock is not None:
            self.at.append(self.clock[0])
        results = []
        for record in Records:
            if self.refuse > 0:
                self.refuse -= 1
                results.append({"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow down"})
            else:
                shard = f"shardId-{hash(record['PartitionKey']) % 2:012d}"
                results.append({"ShardId": shard, "SequenceNumber": str(len(results))})
        return {"FailedRecordCount": sum("ErrorCode" in r for r in results), "Records": results}


class FakeClock:
    def __init__(self) -> None:
        self.now = [0.0]
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now[0]

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.now[0] += seconds


@pytest.mark.parametrize("size", [64, 100, 1000, 50_000])
def test_every_payload_is_json_of_exactly_the_size_asked_naming_its_number_and_key(size: int) -> None:
    traffic = Traffic(count=20, size_bytes=size, keys=3)
    for n, (key, data) in enumerate(traffic.records()):
        assert len(data) == size
        assert json.loads(data)["n"] == n and json.loads(data)["key"] == key == f"key-{n % 3}"


def test_a_size_too_small_for_the_json_or_too_large_for_a_record_is_refused_naming_the_range() -> None:
    smallest = len(payload(9, "key-0", 0))
    assert Traffic(count=10, size_bytes=smallest, keys=1).problems() == []
    [problem] = Traffic(count=10, size_bytes=smallest - 1, keys=1).problems()
    assert problem.startswith(f"--size {smallest - 1}: allowed: {smallest} to ")
    assert Traffic(count=1, size_bytes=2 * 1024 * 1024).problems()
    assert len(Traffic(count=0, keys=0, rate_per_s=-1, aggregate=-1).problems()) == 4


def test_put_records_calls_stay_within_500_records_and_5_mib() -> None:
    kinesis = FakeKinesis()
    report = Producer(kinesis, "orders").put(Traffic(count=1200, size_bytes=100))
    assert [len(call) for call in kinesis.calls] == [500, 500, 200]
    assert report.records == report.kinesis_records == 1200 and report.calls == 3
    big = FakeKinesis()
    Producer(big, "orders").put(Traffic(count=30, size_bytes=400_000))
    sizes = [sum(len(r["Data"]) + len(r["PartitionKey"]) for r in call) for call in big.calls]
    assert max(sizes) <= PUT_RECORDS_MAX_BYTES
    assert sum(len(call) for call in big.calls) == 30 and len(big.calls) > 1
    assert PUT_RECORDS_MAX == 500


def test_a_rate_paces_the_calls_on_the_clock() -> None:
    fake = FakeClock()
    kinesis = FakeKinesis(clock=fake.now)
    report = Producer(kinesis, "orders", clock=fake.clock, sleep=fake.sleep).put(Traffic(count=50, rate_per_s=10))
    assert report.records == 50
    sent = 0
    for at, call in zip(kinesis.at, kinesis.calls, strict=True):
        sent += len(call)
        assert sent <= int(at * 10) + 1  # never ahead of the rate
    assert 4.8 <= fake.now[0] <= 5.0  # and not behind it: 50 records at 10/s take 4.9 s


def test_without_a_rate_nothing_waits() -> None:
    fake = FakeClock()
    Producer(FakeKinesis(), "orders", clock=fake.clock, sleep=fake.sleep).put(Traffic(count=1000))
    assert fake.slept == []


def test_refused_records_are_put_again_after_a_back_off() -> None:
    fake = FakeClock()
    kinesis = FakeKinesis(refuse=7)
    report = Producer(kinesis, "orders", clock=fake.clock, sleep=fake.sleep).put(Traffic(count=10))
    assert report.records == 10 and report.retried == 7
    assert [len(call) for call in kinesis.calls] == [10, 7]
    assert fake.slept == [0.1]


def test_records_refused_every_time_end_with_an_error_naming_the_code_and_what_to_do() -> None:
    fake = FakeClock()
    producer = Producer(FakeKinesis(refuse=10**6), "orders", clock=fake.clock, sleep=fake.sleep, max_attempts=3)
    with pytest.raises(EfoError) as info:
        producer.put(Traffic(count=5))
    message = str(info.value)
    assert "stream 'orders' refused 5 record(s) 3 times (ProvisionedThroughputExceededException: 5)" in message
    assert "--rate" in message
    assert fake.slept == [0.1, 0.2]


def test_kpl_aggregates_hold_the_records_asked_and_efo_reads_every_one_back() -> None:
    traffic = Traffic(count=95, size_bytes=80, keys=7, aggregate=10)
    aggregated = list(entries(traffic))
    assert [entry.records for entry in aggregated] == [10] * 9 + [5]
    read_back = []
    for entry in aggregated:
        subs = deaggregate(entry.request["Data"])
        read_back += [(sub.partition_key, sub.data) for sub in subs]
    assert read_back == list(traffic.records())
    report = Producer(FakeKinesis(), "orders").put(traffic)
    assert (report.records, report.kinesis_records) == (95, 10)
