"""The local stack's DynamoDB keeps DynamoDB's promise that lease fencing rests on: of several
conditional writes racing on one item, exactly one succeeds (moto alone lets two through at times);
the faults it injects look to the SDK like DynamoDB's own; and it keeps a client's connection open
between requests, as DynamoDB does."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import boto3
import pytest
from botocore.config import Config

from efo.devstack.faults import FaultClient
from efo.devstack.stack import LOOPBACK, StackEndpoints
from tests.conftest import DUMMY_CREDENTIALS

from .service import unique

pytestmark = pytest.mark.integration


def test_of_four_conditional_writes_racing_on_one_item_exactly_one_wins_every_time(dynamodb_client: Any) -> None:
    table = unique("race")
    dynamodb_client.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    several_won = 0
    for trial in range(100):
        key = {"pk": {"S": f"lease-{trial}"}}
        dynamodb_client.put_item(TableName=table, Item={**key, "counter": {"N": "0"}})
        winners: list[str] = []

        def take(worker: str, key: dict[str, Any] = key, winners: list[str] = winners) -> None:
            try:
                dynamodb_client.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression="SET #c = #c + :one, taken_by = :me",
                    ConditionExpression="#c = :zero",
                    ExpressionAttributeNames={"#c": "counter"},
                    ExpressionAttributeValues={":one": {"N": "1"}, ":zero": {"N": "0"}, ":me": {"S": worker}},
                )
                winners.append(worker)
            except dynamodb_client.exceptions.ConditionalCheckFailedException:
                pass

        threads = [threading.Thread(target=take, args=(f"w{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert winners, "no write won"
        several_won += len(winners) > 1
    assert several_won == 0, f"{several_won} of 100 races had more than one winner"


def test_injected_throttles_and_server_errors_reach_the_sdk_as_dynamodb_s_own(local_stack: StackEndpoints) -> None:
    faults = FaultClient(local_stack.dynamodb_endpoint)
    once = boto3.client(
        "dynamodb",
        endpoint_url=local_stack.dynamodb_endpoint,
        region_name=local_stack.region,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        **DUMMY_CREDENTIALS,
    )
    retrying = boto3.client(
        "dynamodb",
        endpoint_url=local_stack.dynamodb_endpoint,
        region_name=local_stack.region,
        config=Config(retries={"total_max_attempts": 3, "mode": "standard"}),
        **DUMMY_CREDENTIALS,
    )
    try:
        faults.add(operation="ListTables", action="error", count=1)
        with pytest.raises(once.exceptions.ProvisionedThroughputExceededException):
            once.list_tables()
        faults.add(operation="ListTables", action="error", status=500, error_code="InternalServerError", count=1)
        with pytest.raises(once.exceptions.InternalServerError):
            once.list_tables()
        faults.add(operation="ListTables", action="error", count=2)
        assert "TableNames" in retrying.list_tables(), "two throttles and the SDK's third attempt succeeds"
        assert faults.pending() == []
    finally:
        faults.clear()


def test_requests_on_one_connection_are_all_answered_on_it(local_stack: StackEndpoints) -> None:
    """werkzeug's development server (moto's own) closed every connection after its answer, so each
    call of the service opened a new one; DynamoDB keeps them open."""
    list_tables = {
        "X-Amz-Target": "DynamoDB_20120810.ListTables",
        "Content-Type": "application/x-amz-json-1.0",
        "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host, Signature=0",
    }
    connection = http.client.HTTPConnection(LOOPBACK, local_stack.dynamodb_port, timeout=10)
    try:
        sockets = []
        for _ in range(3):
            connection.request("POST", "/", body=b"{}", headers=list_tables)
            response = connection.getresponse()
            assert response.status == 200 and "TableNames" in json.loads(response.read())
            assert (response.getheader("Connection") or "").lower() != "close"
            assert connection.sock is not None, "the server closed the connection after its answer"
            sockets.append(connection.sock.getsockname())
        assert len(set(sockets)) == 1
    finally:
        connection.close()
