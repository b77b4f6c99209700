"""The local DynamoDB meters what each request would cost on AWS (``/_efo/usage``,
efo/devstack/dynamodb.py): the server runs in this process on a loopback port, moto behind it, and
boto3 speaks to it as efo does. Each test has its own table, so moto's shared state does not leak."""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from efo.devstack.dynamodb import REQUESTS_PATH, SCAN_PARTITION, Serialized
from efo.devstack.faults import FaultClient
from efo.devstack.units import Usage, usage

KB = 1024


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    app = Serialized(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture
def ddb(endpoint: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="eu-west-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@pytest.fixture
def table(ddb: Any, endpoint: str) -> str:
    """A fresh table shaped like efo's (pk HASH, sk RANGE), with the usage counters cleared after."""
    name = f"usage-{uuid.uuid4().hex[:12]}"
    ddb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    )
    usage(endpoint, reset=True)
    return name


def item(pk: str, sk: str, size: int) -> dict[str, Any]:
    """An item of exactly ``size`` bytes as DynamoDB counts them."""
    fixed = len("pk") + len(pk) + len("sk") + len(sk) + len("data")
    assert size >= fixed
    return {"pk": {"S": pk}, "sk": {"S": sk}, "data": {"S": "x" * (size - fixed)}}


def key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def test_a_3_5_kb_put_costs_4_write_units_charged_to_its_partition_key(ddb: Any, endpoint: str, table: str) -> None:
    ddb.put_item(TableName=table, Item=item("app|a", "lease", 3584))
    report = usage(endpoint)
    assert report.operations["PutItem"].write_units == 4
    assert report.operations["PutItem"].bytes == 3584
    assert report.operations["PutItem"].read_units == 0
    assert report.partitions == {"app|a": report.partitions["app|a"]}
    assert (report.partitions["app|a"].requests, report.partitions["app|a"].write_units) == (1, 4)


def test_a_write_costs_the_larger_of_the_item_before_and_after(ddb: Any, endpoint: str, table: str) -> None:
    ddb.put_item(TableName=table, Item=item("p", "s", 3 * KB))
    usage(endpoint, reset=True)
    ddb.put_item(TableName=table, Item=item("p", "s", 500))  # replaces 3 KB with 0.5 KB: 3 units
    ddb.update_item(  # grows 500 bytes by 2 KB: 3 units
        TableName=table,
        Key=key("p", "s"),
        UpdateExpression="SET more = :more",
        ExpressionAttributeValues={":more": {"S": "y" * (2 * KB - 4)}},
    )
    ddb.delete_item(TableName=table, Key=key("p", "s"))  # deletes those 2,548 bytes: 3 units
    ddb.delete_item(TableName=table, Key=key("p", "gone"))  # deletes nothing: still 1 unit
    report = usage(endpoint)
    assert report.operations["PutItem"].write_units == 3
    assert report.operations["UpdateItem"].write_units == 3
    assert report.operations["UpdateItem"].bytes == 500 + 2 * KB
    assert report.operations["DeleteItem"].write_units == 3 + 1
    assert (report.partitions["p"].requests, report.partitions["p"].write_units) == (4, 10)


def test_a_failed_conditional_write_still_costs_its_write_units(ddb: Any, endpoint: str, table: str) -> None:
    ddb.put_item(TableName=table, Item=item("app|a", "lease", 2 * KB))
    usage(endpoint, reset=True)
    with pytest.raises(ClientError) as failed:
        ddb.update_item(
            TableName=table,
            Key=key("app|a", "lease"),
            UpdateExpression="SET data = :d",
            ConditionExpression="attribute_not_exists(pk)",
            ExpressionAttributeValues={":d": {"S": "taken"}},
        )
    assert failed.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    with pytest.raises(ClientError):  # a failed conditional put costs the larger of stored and offered
        ddb.put_item(
            TableName=table, Item=item("app|a", "lease", 3 * KB), ConditionExpression="attribute_not_exists(pk)"
        )
    report = usage(endpoint)
    assert report.operations["UpdateItem"].write_units == 2
    assert report.operations["PutItem"].write_units == 3
    assert report.partitions["app|a"].write_units == 5


def test_a_request_aws_refuses_costs_nothing_but_counts(ddb: Any, endpoint: str, table: str) -> None:
    with pytest.raises(ClientError):
        ddb.get_item(TableName=f"{table}-missing", Key=key("p", "s"))
    faults = FaultClient(endpoint)
    faults.add(operation="PutItem", action="error", count=1)
    with pytest.raises(ClientError):
        boto3.client(
            "dynamodb",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(retries={"total_max_attempts": 1}),  # no retry of the throttle
        ).put_item(TableName=table, Item=item("p", "s", 100))
    report = usage(endpoint)
    assert report.operations["GetItem"].requests == 1 and report.operations["GetItem"].read_units == 0
    assert report.operations["PutItem"].requests == 1 and report.operations["PutItem"].write_units == 0
    assert report.partitions == {}


def put_ten_1_kb_items(ddb: Any, table: str, pk: str) -> None:
    for n in range(10):
        ddb.put_item(TableName=table, Item=item(pk, f"shard#{n:04d}", KB))


def test_a_query_pays_once_for_all_it_read_halved_when_eventually_consistent(
    ddb: Any, endpoint: str, table: str
) -> None:
    put_ten_1_kb_items(ddb, table, "app|a")
    put_ten_1_kb_items(ddb, table, "app|b")
    usage(endpoint, reset=True)
    condition = {"KeyConditionExpression": "pk = :pk", "ExpressionAttributeValues": {":pk": {"S": "app|a"}}}
    assert len(ddb.query(TableName=table, ConsistentRead=True, **condition)["Items"]) == 10  # 10 KB: 3 units
    report = usage(endpoint, reset=True)
    assert report.operations["Query"].read_units == 3 and report.operations["Query"].bytes == 10 * KB
    assert report.partitions["app|a"].read_units == 3
    ddb.query(TableName=table, ConsistentRead=False, **condition)
    assert usage(endpoint, reset=True).operations["Query"].read_units == 1.5
    ddb.query(
        TableName=table,
        KeyConditionExpression="#p = :pk",
        ExpressionAttributeNames={"#p": "pk"},
        ExpressionAttributeValues={":pk": {"S": "app|a"}},
    )
    assert usage(endpoint).partitions["app|a"].read_units == 1.5  # eventually consistent by default


def test_a_query_pays_for_what_it_evaluated_not_for_what_a_projection_or_filter_left(
    ddb: Any, endpoint: str, table: str
) -> None:
    put_ten_1_kb_items(ddb, table, "app|a")
    usage(endpoint, reset=True)
    values = {":pk": {"S": "app|a"}}
    projected = ddb.query(  # as efo's own cleanup query does
        TableName=table, KeyConditionExpression="pk = :pk", ExpressionAttributeValues=values, ProjectionExpression="sk"
    )
    assert projected["Items"][0] == {"sk": {"S": "shard#0000"}}
    filtered = ddb.query(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="pk = :pk",
        FilterExpression="sk = :none",
        ExpressionAttributeValues={**values, ":none": {"S": "nothing"}},
    )
    assert filtered["Count"] == 0 and filtered["ScannedCount"] == 10
    first_page = ddb.query(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues=values,
        Limit=4,
    )
    ddb.query(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues=values,
        ExclusiveStartKey=first_page["LastEvaluatedKey"],
        Select="COUNT",
    )
    report = usage(endpoint)
    # 1.5 (projected, eventually consistent) + 3 (filtered) + 1 (4 KB page) + 2 (the other 6 KB, counted)
    assert report.operations["Query"].read_units == 1.5 + 3 + 1 + 2
    assert report.operations["Query"].requests == 4
    assert report.partitions["app|a"].requests == 4


def test_a_query_that_finds_nothing_costs_the_minimum_charged_to_the_key_it_named(
    ddb: Any, endpoint: str, table: str
) -> None:
    ddb.query(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
        ExpressionAttributeValues={":pk": {"S": "app|none"}, ":prefix": {"S": "worker#"}},
    )
    assert usage(endpoint).partitions["app|none"].read_units == 1


def test_get_and_batch_get_round_each_item_up_to_4_kb(ddb: Any, endpoint: str, table: str) -> None:
    ddb.put_item(TableName=table, Item=item("a", "big", 10 * KB))
    ddb.put_item(TableName=table, Item=item("b", "small", 1536))
    ddb.put_item(TableName=table, Item=item("b", "mid", 6656))
    usage(endpoint, reset=True)
    ddb.get_item(TableName=table, Key=key("a", "big"), ConsistentRead=True, ProjectionExpression="sk")  # 12 KB: 3
    ddb.get_item(TableName=table, Key=key("a", "missing"))  # nothing, eventually consistent: 0.5
    ddb.batch_get_item(
        RequestItems={table: {"Keys": [key("b", "small"), key("b", "mid")], "ConsistentRead": True}}
    )  # 4 KB + 8 KB: 3
    report = usage(endpoint)
    assert report.operations["GetItem"].read_units == 3.5
    assert report.operations["BatchGetItem"].read_units == 3
    assert report.partitions["a"].read_units == 3.5 and report.partitions["b"].read_units == 3
    assert report.partitions["b"].requests == 1


def test_batch_writes_and_transactions_charge_each_item_to_its_own_key(ddb: Any, endpoint: str, table: str) -> None:
    ddb.batch_write_item(
        RequestItems={
            table: [{"PutRequest": {"Item": item("a", "1", 1536)}}, {"PutRequest": {"Item": item("b", "1", 500)}}]
        }
    )
    ddb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": table, "Item": item("c", "1", 1536)}},  # 2 units, twice: 4
            {"Delete": {"TableName": table, "Key": key("a", "1")}},  # 1.5 KB deleted: 4
            {
                "ConditionCheck": {
                    "TableName": table,
                    "Key": key("b", "1"),
                    "ConditionExpression": "attribute_exists(pk)",
                }
            },
        ]
    )
    report = usage(endpoint)
    assert report.operations["BatchWriteItem"].write_units == 2 + 1
    assert report.operations["TransactWriteItems"].write_units == 4 + 4 + 2
    assert {k: (p.requests, p.write_units) for k, p in report.partitions.items()} == {
        "a": (2, 2 + 4),
        "b": (2, 1 + 2),
        "c": (1, 4),
    }


def test_a_scan_is_no_one_partition_key_and_delete_clears_usage_but_not_the_request_counts(
    ddb: Any, endpoint: str, table: str
) -> None:
    put_ten_1_kb_items(ddb, table, "app|a")
    ddb.put_item(TableName=table, Item=item("app|b", "x", 2 * KB))
    ddb.scan(TableName=table, ConsistentRead=True)  # 12 KB: 3 units
    requests_before = json.loads(urllib.request.urlopen(endpoint + REQUESTS_PATH).read())
    cleared = usage(endpoint, reset=True)
    assert cleared.operations["Scan"].read_units == 3 and cleared.partitions[SCAN_PARTITION].read_units == 3
    assert cleared.busiest_partition("write_units") == ("app|a", cleared.partitions["app|a"])
    assert usage(endpoint) == Usage()
    assert json.loads(urllib.request.urlopen(endpoint + REQUESTS_PATH).read()) == requests_before
