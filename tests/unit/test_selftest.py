"""``efo selftest``'s plan and its verdict without a server: what it says it creates and costs, and
that a record missing or out of order per key fails the verification."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.config import load_settings
from efo.selftest.run import PREFIX, Outcome, Plan, SelfTest, SelfTestFailed
from efo.selftest.sink import ROWS_FILE


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
