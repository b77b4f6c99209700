"""DynamoDB Local (the jar the fleet benchmark runs) behind its meter: it prices every request as
the moto meter does, hides what it asked for on the client's behalf, and refuses to run where its
all-interfaces listener could be reached from beyond loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from efo.devstack.dynamodb_local import EXIT_NOT_ISOLATED, interfaces, isolating_command

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_jar_meter_prices_every_request_as_the_moto_meter_does_by_operation_and_partition_key() -> None:
    completed = subprocess.run(
        isolating_command([sys.executable, "-m", "tests.integration.dynamodb_twins"]),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    moto, jar = report["moto"], report["jar"]
    assert jar["operations"] == moto["operations"]
    assert jar["partitions"] == moto["partitions"]
    # the conditional write refused: charged by the stored item's size (1,5xx bytes: 2 units)
    assert jar["operations"]["UpdateItem"] == [2, 0.0, 4.0]
    # 20 items of about 1 KB, strongly consistent: 5 read units; eventually consistent: 2.5
    assert jar["operations"]["Query"] == [2, 7.5, 0.0]
    seen = jar["seen"]
    assert seen["refused"] == "ConditionalCheckFailedException"
    assert seen["refused_item"] is False, "the stored item the meter asked for reached the client"
    assert seen["update_consumed_capacity"] is False, "the units the meter asked for reached the client"
    assert seen["asked_consumed_capacity"] == 2.5, "a client that asks for its units gets them"
    assert seen["query_count"] == 20


def test_the_jar_meter_refuses_to_start_where_other_interfaces_than_loopback_exist() -> None:
    assert interfaces() != ["lo"], "this test needs a namespace with a network interface besides loopback"
    completed = subprocess.run(
        [sys.executable, "-m", "efo.devstack.dynamodb_local", "--port", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == EXIT_NOT_ISOLATED
    assert "listens on every interface" in completed.stderr and "unshare --net" in completed.stderr
