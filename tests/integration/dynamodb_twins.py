"""Run in a private network namespace by test_dynamodb_local: the same requests against moto's
metered server and against DynamoDB Local behind its meter; prints what each metered, and what a
client saw of DynamoDB Local's answers, as one JSON object on standard output."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from efo.devstack.dynamodb_local import loopback_up
from efo.devstack.stack import die_with_parent_process, free_port, wait_listening
from efo.devstack.units import usage

TABLE = "twins"
INDEXED = "twins_indexed"


def start(module: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)],
        stdout=sys.stderr,
        stderr=sys.stderr,
        preexec_fn=die_with_parent_process,
    )
    if not wait_listening(port, process, 90):
        process.kill()
        raise RuntimeError(f"{module} did not start")
    return process, f"http://127.0.0.1:{port}"


def key(app: str, sort: str) -> dict[str, Any]:
    return {"app": {"S": app}, "sk": {"S": sort}}


def requests(client: Any) -> dict[str, Any]:
    """Every kind of request efo's lease table makes, and more: an index, a batch, a transaction,
    items over 1 KB; what the client saw. The HASH key is not called ``pk`` (the meters' fallback)."""
    seen: dict[str, Any] = {}
    attributes = [{"AttributeName": n, "AttributeType": "S"} for n in ("app", "sk")]
    schema = [{"AttributeName": "app", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
    client.create_table(
        TableName=TABLE, BillingMode="PAY_PER_REQUEST", AttributeDefinitions=attributes, KeySchema=schema
    )
    # An index's writes are billed with its table's on AWS, and by DynamoDB Local; moto's meter does not
    # count them (efo has no index), so the indexed table only serves the Query on its index.
    client.create_table(
        TableName=INDEXED,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[*attributes, {"AttributeName": "owner", "AttributeType": "S"}],
        KeySchema=schema,
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_owner",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    for i in range(12):
        client.put_item(TableName=INDEXED, Item={**key("i", f"{i:02}"), "owner": {"S": "w2"}, "v": {"S": "o" * 900}})
    client.put_item(TableName=TABLE, Item={**key("a", "1"), "v": {"S": "x" * 1500}})
    answer = client.update_item(
        TableName=TABLE,
        Key=key("a", "1"),
        UpdateExpression="SET c = :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
    )
    seen["update_consumed_capacity"] = "ConsumedCapacity" in answer
    refused = {
        "TableName": TABLE,
        "Key": key("a", "1"),
        "UpdateExpression": "SET c = :two",
        "ConditionExpression": "c = :zero",
        "ExpressionAttributeValues": {":two": {"N": "2"}, ":zero": {"N": "0"}},
    }
    for asked in (None, "NONE", "ALL_OLD"):  # refused writes: priced by the stored item (1.5 KB: 2 units)
        try:
            client.update_item(**refused, **({"ReturnValuesOnConditionCheckFailure": asked} if asked else {}))
        except ClientError as exc:
            seen[f"refused_{asked}"] = [exc.response["Error"]["Code"], "Item" in exc.response]
    for i in range(20):
        client.put_item(TableName=TABLE, Item={**key("b", f"{i:02}"), "v": {"S": "y" * 1000}})
    query = {"TableName": TABLE, "KeyConditionExpression": "app = :p", "ExpressionAttributeValues": {":p": {"S": "b"}}}
    seen["query_count"] = client.query(**query, ConsistentRead=True)["Count"]
    asked = client.query(**query, ReturnConsumedCapacity="TOTAL")
    seen["asked_consumed_capacity"] = asked.get("ConsumedCapacity", {}).get("CapacityUnits")
    by_owner = client.query(
        TableName=INDEXED,
        IndexName="by_owner",
        KeyConditionExpression="#o = :o",
        ExpressionAttributeNames={"#o": "owner"},
        ExpressionAttributeValues={":o": {"S": "w2"}},
    )
    seen["index_count"] = by_owner["Count"]
    client.get_item(TableName=TABLE, Key=key("none", "1"), ConsistentRead=True)
    client.get_item(TableName=TABLE, Key=key("a", "1"))
    client.put_item(TableName=TABLE, Item={**key("big", "1"), "v": {"S": "z" * 3000}})
    client.put_item(TableName=TABLE, Item={**key("big", "1"), "v": {"S": "z" * 10}})  # smaller over larger: 3 units
    client.put_item(TableName=TABLE, Item={**key("big", "2"), "v": {"S": "z" * 2500}})
    client.delete_item(TableName=TABLE, Key=key("big", "2"))  # a 2.5 KB item deleted: 3 units
    client.batch_write_item(
        RequestItems={TABLE: [{"PutRequest": {"Item": {**key(p, "z"), "v": {"S": "w" * 600}}}} for p in "cd"]}
    )
    client.batch_get_item(RequestItems={TABLE: {"Keys": [key("c", "z"), key("d", "z")], "ConsistentRead": True}})
    client.transact_write_items(
        TransactItems=[{"Put": {"TableName": TABLE, "Item": {**key(p, "t"), "v": {"S": "t" * 300}}}} for p in "ef"]
    )
    return seen


def main() -> None:
    loopback_up()
    servers: list[subprocess.Popen[bytes]] = []
    try:
        moto, moto_endpoint = start("efo.devstack.dynamodb")
        servers.append(moto)
        jar, jar_endpoint = start("efo.devstack.dynamodb_local")
        servers.append(jar)
        report = {}
        for name, endpoint in (("moto", moto_endpoint), ("jar", jar_endpoint)):
            client = boto3.client(
                "dynamodb",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="twins",
                aws_secret_access_key="twins",
                config=Config(retries={"max_attempts": 1}),
            )
            seen = requests(client)
            metered = usage(endpoint)
            report[name] = {
                "seen": seen,
                "operations": {k: [v.requests, v.read_units, v.write_units] for k, v in metered.operations.items()},
                "bytes": {k: v.bytes for k, v in metered.operations.items()},
                "partitions": {k: [v.requests, v.read_units, v.write_units] for k, v in metered.partitions.items()},
            }
        print(json.dumps(report))
    finally:
        for process in servers:
            process.send_signal(signal.SIGTERM)
        for process in servers:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
