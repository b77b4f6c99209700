"""Run in a private network namespace by test_dynamodb_local: the same requests against moto's
metered server and against DynamoDB Local behind its meter; prints what each metered, and what a
client saw of DynamoDB Local's answers, as one JSON object on standard output."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from efo.devstack.dynamodb_local import loopback_up
from efo.devstack.stack import free_port
from efo.devstack.units import usage

TABLE = "twins"


def start(module: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)], stdout=sys.stderr, stderr=sys.stderr
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{module} did not start") from None
            time.sleep(0.1)


def requests(client: Any) -> dict[str, Any]:
    """Every kind of request efo's lease table makes, plus a batch; what the client saw."""
    seen: dict[str, Any] = {}
    client.create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    )
    client.put_item(TableName=TABLE, Item={"pk": {"S": "a"}, "sk": {"S": "1"}, "v": {"S": "x" * 1500}})
    answer = client.update_item(
        TableName=TABLE,
        Key={"pk": {"S": "a"}, "sk": {"S": "1"}},
        UpdateExpression="SET c = :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
    )
    seen["update_consumed_capacity"] = "ConsumedCapacity" in answer
    try:
        client.update_item(
            TableName=TABLE,
            Key={"pk": {"S": "a"}, "sk": {"S": "1"}},
            UpdateExpression="SET c = :two",
            ConditionExpression="c = :zero",
            ExpressionAttributeValues={":two": {"N": "2"}, ":zero": {"N": "0"}},
        )
    except ClientError as exc:
        seen["refused"] = exc.response["Error"]["Code"]
        seen["refused_item"] = "Item" in exc.response
    for i in range(20):
        client.put_item(TableName=TABLE, Item={"pk": {"S": "b"}, "sk": {"S": f"{i:02}"}, "v": {"S": "y" * 1000}})
    query = {"TableName": TABLE, "KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": {"S": "b"}}}
    seen["query_count"] = client.query(**query, ConsistentRead=True)["Count"]
    asked = client.query(**query, ReturnConsumedCapacity="TOTAL")
    seen["asked_consumed_capacity"] = asked.get("ConsumedCapacity", {}).get("CapacityUnits")
    client.get_item(TableName=TABLE, Key={"pk": {"S": "none"}, "sk": {"S": "1"}}, ConsistentRead=True)
    client.delete_item(TableName=TABLE, Key={"pk": {"S": "b"}, "sk": {"S": "00"}})
    client.batch_write_item(
        RequestItems={
            TABLE: [{"PutRequest": {"Item": {"pk": {"S": p}, "sk": {"S": "z"}, "v": {"S": "w" * 600}}}} for p in "cd"]
        }
    )
    return seen


def main() -> None:
    loopback_up()
    moto, moto_endpoint = start("efo.devstack.dynamodb")
    jar, jar_endpoint = start("efo.devstack.dynamodb_local")
    try:
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
                "partitions": {k: [v.requests, v.read_units, v.write_units] for k, v in metered.partitions.items()},
            }
        print(json.dumps(report))
    finally:
        for process in (moto, jar):
            process.send_signal(signal.SIGTERM)
            process.wait(20)


if __name__ == "__main__":
    main()
