"""The local DynamoDB's fault API (efo/devstack/dynamodb.py): rules answer the matching requests with
DynamoDB's own error shape, fire their count and are gone; everything else reaches the backend."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.test import Client

from efo.devstack.dynamodb import FAULTS_PATH, REQUESTS_PATH, Serialized


class Backend:
    """Stands in for moto: answers 200 and remembers which operations reached it."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        self.reached.append(str(environ.get("HTTP_X_AMZ_TARGET", "")).rsplit(".", 1)[-1])
        start_response("200 OK", [("Content-Type", "application/x-amz-json-1.0")])
        return [b"{}"]


def call(client: Client, operation: str) -> Any:
    return client.post("/", data=b'{"TableName": "t"}', headers={"X-Amz-Target": f"DynamoDB_20120810.{operation}"})


def setup() -> tuple[Client, Backend, Serialized]:
    backend = Backend()
    app = Serialized(backend)
    return Client(app), backend, app


def test_a_rule_answers_its_count_of_matching_requests_with_a_throttle_then_is_gone() -> None:
    client, backend, _ = setup()
    added = client.post(FAULTS_PATH, json={"operation": "UpdateItem", "action": "error", "count": 2})
    assert added.status_code == 200 and added.json["error_code"] == "ProvisionedThroughputExceededException"
    answers = [call(client, op) for op in ("UpdateItem", "Query", "UpdateItem", "UpdateItem")]
    assert [a.status_code for a in answers] == [400, 200, 400, 200]
    assert answers[0].headers["x-amzn-ErrorType"] == "ProvisionedThroughputExceededException"
    assert json.loads(answers[0].data)["__type"] == (
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
    )
    assert backend.reached == ["Query", "UpdateItem"], "a faulted request reached the backend"
    assert client.get(FAULTS_PATH).json == []
    assert client.get(REQUESTS_PATH).json == {"UpdateItem": 3, "Query": 1}, "faulted requests are counted"


def test_a_server_error_for_any_operation_and_clearing_the_rules() -> None:
    client, backend, _ = setup()
    client.post(
        FAULTS_PATH,
        json={"operation": "*", "action": "error", "status": 500, "error_code": "InternalServerError", "count": 9},
    )
    failed = call(client, "GetItem")
    assert failed.status_code == 500 and failed.headers["x-amzn-ErrorType"] == "InternalServerError"
    assert [rule["count"] for rule in client.get(FAULTS_PATH).json] == [8]
    assert client.delete(FAULTS_PATH).status_code == 200
    assert call(client, "GetItem").status_code == 200
    assert backend.reached == ["GetItem"]


def test_rules_that_mean_nothing_for_dynamodb_are_refused() -> None:
    client, _, app = setup()
    for rule in (
        {"operation": "UpdateItem", "action": "reset"},
        {"operation": "SubscribeToShard", "action": "stall"},
        {"operation": "UpdateItem", "action": "error", "shard_id": "shardId-000000000000"},
        {"operation": "UpdateItem", "action": "error", "count": 0},
        {"action": "error"},
        [],
    ):
        refused = client.post(FAULTS_PATH, json=rule)
        assert refused.status_code == 400 and refused.json["error"], rule
    assert client.post(FAULTS_PATH, data=b"{not json").status_code == 400
    assert app.faults.to_json() == []
    assert client.put(FAULTS_PATH).status_code == 405


def test_a_rule_with_a_resource_refuses_only_requests_on_that_table_as_a_role_without_the_action_would() -> None:
    client, backend, _ = setup()
    rule = {"operation": "PutItem", "action": "error", "error_code": "AccessDeniedException", "count": 5}
    assert client.post(FAULTS_PATH, json={**rule, "resource": "leases"}).status_code == 200
    other = client.post("/", data=b'{"TableName": "other"}', headers={"X-Amz-Target": "DynamoDB_20120810.PutItem"})
    refused = client.post("/", data=b'{"TableName": "leases"}', headers={"X-Amz-Target": "DynamoDB_20120810.PutItem"})
    assert other.status_code == 200 and refused.status_code == 400
    assert refused.headers["x-amzn-ErrorType"] == "AccessDeniedException"
    assert backend.reached == ["PutItem"]
    assert client.get(FAULTS_PATH).json[0]["count"] == 4  # the request on another table did not use it


def test_the_rules_own_resource_matching_names_every_resource_of_a_request() -> None:
    from efo.devstack.faults import FaultRules, request_resources

    rules = FaultRules()
    rules.add({"operation": "SubscribeToShard", "action": "error", "resource": "arn:c", "count": 3})
    assert rules.take("SubscribeToShard", None, request_resources({"ConsumerARN": "arn:other"})) is None
    assert rules.take("SubscribeToShard", None, request_resources({"ConsumerARN": "arn:c", "ShardId": "s"})) is not None
    assert request_resources({"StreamName": "orders", "StreamARN": "arn:s", "TableName": "t", "Limit": 1}) == {
        "orders",
        "arn:s",
        "t",
    }
