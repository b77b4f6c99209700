"""The local stack's DynamoDB keeps DynamoDB's promise that lease fencing rests on: of several
conditional writes racing on one item, exactly one succeeds (moto alone lets two through at times)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

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
