"""DynamoDB Local (the jar the fleet benchmark runs) behind its meter: it prices every request as
the moto meter does, hides what it asked for on the client's behalf, and refuses to run where its
all-interfaces listener could be reached from beyond loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from efo.devstack.dynamodb_local import (
    EXIT_NOT_ISOLATED,
    UNPRICED,
    NotIsolated,
    check_isolation_possible,
    interfaces,
    interfaces_up,
    isolated,
    isolating_command,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # the fleet benchmark's instrument (a JVM, 12-14 s): make chaos, beside the benchmarks
def test_the_jar_meter_prices_every_request_as_the_moto_meter_does_by_operation_and_partition_key() -> None:
    try:
        check_isolation_possible()
    except NotIsolated as exc:
        pytest.skip(str(exc))
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
    assert not [op for op in jar["operations"] if op.endswith(UNPRICED)], jar["operations"]
    # The indexed table's 12 puts also write its index: billed by AWS and DynamoDB Local, not by
    # moto's meter (it counts no index writes). Everything else is priced the same.
    index_writes = 12.0
    assert jar["partitions"].pop("i") == [12, 0.0, 2 * index_writes]
    assert moto["partitions"].pop("i") == [12, 0.0, index_writes]
    assert jar["partitions"] == moto["partitions"]
    assert jar["operations"].pop("PutItem") == [36, 0.0, moto["operations"].pop("PutItem")[2] + index_writes]
    assert jar["operations"] == moto["operations"]
    # refused conditional writes (3, whatever the client asked back): by the stored item, 1.5 KB: 2 units each
    assert jar["operations"]["UpdateItem"] == [4, 0.0, 8.0]
    assert jar["partitions"]["big"] == [4, 0.0, 12.0], "a smaller item over a larger, a delete: by the larger"
    assert jar["operations"]["TransactWriteItems"] == [1, 0.0, 4.0], "a transaction costs twice"
    assert jar["partitions"]["by_owner:w2"] == [1, 1.5, 0.0], "a Query on an index is charged to the index's key"
    for operation in ("Query", "GetItem"):
        assert jar["bytes"][operation] == moto["bytes"][operation] > 0
    assert jar["bytes"]["PutItem"] > 0
    seen = jar["seen"]
    assert seen["refused_None"] == ["ConditionalCheckFailedException", False], "the meter's ALL_OLD reached the client"
    assert seen["refused_NONE"] == ["ConditionalCheckFailedException", False]
    assert seen["refused_ALL_OLD"] == ["ConditionalCheckFailedException", True], "the client's own ALL_OLD was lost"
    assert seen["update_consumed_capacity"] is False, "the units the meter asked for reached the client"
    assert seen["asked_consumed_capacity"] == 2.5, "a client that asks for its units gets them"
    assert seen["query_count"] == 20 and seen["index_count"] == 12


def test_the_jar_meter_refuses_to_start_where_another_interface_than_loopback_is_up() -> None:
    if isolated():
        pytest.skip(f"no interface but loopback is up here ({interfaces()}): nothing to refuse")
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
    assert any(name in completed.stderr for name in interfaces_up() if name != "lo"), "it names what is up"
