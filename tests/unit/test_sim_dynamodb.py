"""The simulated DynamoDB alone: the semantics the lease plane relies on, and the faults it injects."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import botocore.exceptions
import pytest

from efo.sim.clock import SimClock
from efo.sim.dynamodb import KEY_WRITE_UNITS, PAGE_BYTES, Behaviour, Fault, SimDynamoDB, SimDynamoDBClient
from efo.sim.loop import run

TABLE = "t"


def _db(**behaviour: Any) -> tuple[SimDynamoDB, SimDynamoDBClient]:
    db = SimDynamoDB(random.Random(1), Behaviour(**behaviour))
    db.create_table(TABLE)
    return db, db.client("w1", SimClock(), random.Random(2))


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response["Error"]["Code"])


def test_a_conditional_update_lands_only_while_its_condition_holds() -> None:
    async def scenario() -> None:
        _, client = _db()
        await client.put_item(TableName=TABLE, Item={**_key("p", "a"), "owner": {"S": "w1"}, "n": {"N": "1"}})
        update = {
            "TableName": TABLE,
            "Key": _key("p", "a"),
            "UpdateExpression": "SET owner = :me, n = n + :one REMOVE gone",
            "ConditionExpression": "n = :n AND owner = :owner",
            "ExpressionAttributeValues": {
                ":me": {"S": "w2"},
                ":one": {"N": "1"},
                ":n": {"N": "1"},
                ":owner": {"S": "w1"},
            },
            "ReturnValues": "ALL_NEW",
        }
        answer = await client.update_item(**update)
        assert answer["Attributes"]["owner"] == {"S": "w2"} and answer["Attributes"]["n"] == {"N": "2"}
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.update_item(**update)  # n is 2 now
        assert _code(refused.value) == "ConditionalCheckFailedException"
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.put_item(TableName=TABLE, Item=_key("p", "a"), ConditionExpression="attribute_not_exists(pk)")
        assert _code(refused.value) == "ConditionalCheckFailedException"

    run(scenario())


def test_an_update_asked_for_its_updated_new_values_answers_the_attributes_it_set_added_or_deleted() -> None:
    """As DynamoDB does (DynamoDB Local answers these very updates so): only the attributes the
    expression set, added to or deleted from, as they are after it (not the key, nor an attribute it
    left alone or removed, nor a set it emptied)."""

    async def scenario() -> None:
        _, client = _db()
        await client.put_item(
            TableName=TABLE,
            Item={**_key("p", "a"), "n": {"N": "1"}, "kept": {"S": "k"}, "gone": {"S": "g"}, "s": {"SS": ["a", "b"]}},
        )

        async def update(expression: str) -> Any:
            answer = await client.update_item(
                TableName=TABLE,
                Key=_key("p", "a"),
                UpdateExpression=expression,
                ExpressionAttributeValues={
                    ":one": {"N": "1"},
                    ":v": {"S": "v"},
                    ":a": {"SS": ["a"]},
                    ":b": {"SS": ["b"]},
                },
                ReturnValues="UPDATED_NEW",
            )
            return answer.get("Attributes")

        assert await update("SET who = :v, n = n + :one ADD c :one DELETE s :a REMOVE gone") == {
            "who": {"S": "v"},
            "n": {"N": "2"},
            "c": {"N": "1"},
            "s": {"SS": ["b"]},
        }
        assert await update("ADD n :one, t :a DELETE s :b") == {"n": {"N": "3"}, "t": {"SS": ["a"]}}, "s emptied"
        assert await update("DELETE t :b") == {"t": {"SS": ["a"]}}, "deleted from, though it held no b"
        assert await update("REMOVE who") is None, "nothing updated is left: no attributes"

    run(scenario())


def test_add_and_delete_of_a_string_set_are_a_union_and_a_difference_and_no_set_is_left_empty() -> None:
    async def scenario() -> None:
        db, client = _db()

        async def update(expression: str, names: list[str]) -> None:
            await client.update_item(
                TableName=TABLE,
                Key=_key("p", "v"),
                UpdateExpression=expression,
                ExpressionAttributeValues={":one": {"N": "1"}, ":names": {"SS": names}},
            )

        async def names() -> Any:
            item = (await client.get_item(TableName=TABLE, Key=_key("p", "v"), ConsistentRead=True))["Item"]
            return item.get("s", {}).get("SS"), item["n"]

        await update("ADD n :one, s :names", ["b", "a"])
        await update("ADD n :one, s :names", ["a", "c"])
        assert await names() == (["a", "b", "c"], {"N": "2"})
        await update("ADD n :one DELETE s :names", ["a", "x"])
        assert await names() == (["b", "c"], {"N": "3"})
        await update("ADD n :one DELETE s :names", ["b", "c"])
        assert await names() == (None, {"N": "4"})
        refused_updates = [
            ("DELETE n :one", {":one": {"N": "1"}}),  # DELETE takes a set
            ("DELETE n :names", {":names": {"SS": ["a"]}}),  # from a number
            ("ADD n :names", {":names": {"SS": ["a"]}}),  # a set to a number
            ("ADD s :names", {":names": {"SS": []}}),  # no empty set
            ("ADD s :names", {":names": {"SS": ["a", "a"]}}),  # nor duplicates
        ]
        for expression, values in refused_updates:
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                await client.update_item(
                    TableName=TABLE, Key=_key("p", "v"), UpdateExpression=expression, ExpressionAttributeValues=values
                )
            assert _code(refused.value) == "ValidationException", expression
        assert await names() == (None, {"N": "4"}), "a refused update changes nothing"
        assert db is not None

    run(scenario())


def test_an_expression_it_does_not_know_is_a_validation_error() -> None:
    async def scenario() -> None:
        _, client = _db()
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.update_item(
                TableName=TABLE,
                Key=_key("p", "a"),
                UpdateExpression="SET #n = :v",
                ExpressionAttributeValues={":v": {"S": "x"}},
            )
        assert _code(refused.value) == "ValidationException"

    run(scenario())


def test_a_query_reads_its_sort_key_range_in_pages_of_a_mebibyte() -> None:
    async def scenario() -> None:
        _, client = _db()
        blob = "x" * 100_000
        for i in range(25):
            await client.put_item(TableName=TABLE, Item={**_key("p", f"shard|{i:03d}"), "blob": {"S": blob}})
        await client.put_item(TableName=TABLE, Item={**_key("p", "version"), "p0": {"N": "1"}})
        request = {
            "TableName": TABLE,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": {"S": "p"}, ":prefix": {"S": "shard|"}},
            "ConsistentRead": True,
        }
        pages = [await client.query(**request)]
        while "LastEvaluatedKey" in pages[-1]:
            pages.append(await client.query(**request, ExclusiveStartKey=pages[-1]["LastEvaluatedKey"]))
        assert len(pages) == 3  # 2.5 MB of items
        assert all(sum(len(i["blob"]["S"]) for i in page["Items"]) <= PAGE_BYTES + 100_000 for page in pages)
        assert [i["sk"]["S"] for page in pages for i in page["Items"]] == [f"shard|{i:03d}" for i in range(25)]
        after = await client.query(
            TableName=TABLE,
            KeyConditionExpression="pk = :pk AND sk > :after",
            ExpressionAttributeValues={":pk": {"S": "p"}, ":after": {"S": "shard}"}},
            ConsistentRead=True,
        )
        assert [item["sk"]["S"] for item in after["Items"]] == ["version"]

    run(scenario())


async def _keys_put_some_deleted(client: Any, rng: random.Random, alphabet: list[str]) -> tuple[list[str], set[str]]:
    """About 120 random sort keys made of ``alphabet`` put under partition ``p``, then 10 of them
    deleted: the keys (sorted) and the deleted ones."""
    keys = sorted({rng.choice(alphabet) + str(rng.randrange(30)) * rng.randrange(2) for _ in range(120)})
    for sort_key in keys:
        await client.put_item(TableName=TABLE, Item=_key("p", sort_key))
    deleted = set(rng.sample(keys, k=10))
    for sort_key in deleted:
        await client.delete_item(TableName=TABLE, Key=_key("p", sort_key))
    return keys, deleted


async def _sort_keys_of_every_page(client: Any, request: dict[str, Any]) -> list[str]:
    """The sort keys ``request`` answers, page after page."""
    page = await client.query(**request)
    found = [item["sk"]["S"] for item in page["Items"]]
    while "LastEvaluatedKey" in page:
        page = await client.query(**request, ExclusiveStartKey=page["LastEvaluatedKey"])
        found += [item["sk"]["S"] for item in page["Items"]]
    return found


def test_a_begins_with_query_answers_the_keys_with_that_prefix_and_no_other() -> None:
    """The keys a begins_with matches are one run of the sorted keys, which the query reads alone:
    over random keys around the prefix (deleted ones too), a Limit and pages, what it answers is
    every live key that starts with the prefix, in order."""

    async def scenario() -> None:
        rng = random.Random(5)
        _, client = _db(stale_read_s=0.0)
        alphabet = ["s", "sh", "sha", "shard", "shard|", "shard}", "shardz", "a", "t", "shard|0", "shard|00"]
        keys, deleted = await _keys_put_some_deleted(client, rng, alphabet)
        for prefix in ("shard|", "shard", "sh", "s", "shard|0", "zz", ""):
            request: dict[str, Any] = {
                "TableName": TABLE,
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
                "ExpressionAttributeValues": {":pk": {"S": "p"}, ":prefix": {"S": prefix}},
                "ConsistentRead": True,
                "Limit": 7,
            }
            found = await _sort_keys_of_every_page(client, request)
            assert found == [k for k in keys if k.startswith(prefix) and k not in deleted], prefix

    run(scenario())


def test_a_comparison_on_the_sort_key_answers_the_keys_it_matches_and_no_other() -> None:
    """A comparison (``=``, ``<``, ``<=``, ``>``, ``>=``) or a BETWEEN on the sort key matches one run of
    the sorted keys too, which the query reads alone: over random keys (deleted ones too), a Limit and
    pages, what it answers is every live key the condition holds for, in order; a value that is not a
    string matches nothing, as the comparison of different types does."""

    async def scenario() -> None:
        rng = random.Random(6)
        _, client = _db(stale_read_s=0.0)
        alphabet = ["s", "sh", "shard", "shard|", "shard}", "a", "t", "shard|0"]
        keys, deleted = await _keys_put_some_deleted(client, rng, alphabet)
        live = [k for k in keys if k not in deleted]
        checks = {
            "sk = :a": lambda k, a, b: k == a,
            "sk < :a": lambda k, a, b: k < a,
            "sk <= :a": lambda k, a, b: k <= a,
            "sk > :a": lambda k, a, b: k > a,
            "sk >= :a": lambda k, a, b: k >= a,
            "sk BETWEEN :a AND :b": lambda k, a, b: a <= k <= b,
        }
        bounds = [*rng.sample(keys, k=4), "shard", "shard}", "", "zz"]
        for text, holds in checks.items():
            for low in bounds:
                high = rng.choice(bounds)
                request: dict[str, Any] = {
                    "TableName": TABLE,
                    "KeyConditionExpression": f"pk = :pk AND {text}",
                    "ExpressionAttributeValues": {":pk": {"S": "p"}, ":a": {"S": low}, ":b": {"S": high}},
                    "ConsistentRead": True,
                    "Limit": 7,
                }
                found = await _sort_keys_of_every_page(client, request)
                assert found == [k for k in live if holds(k, low, high)], (text, low, high)
        numeric = {":pk": {"S": "p"}, ":a": {"N": "1"}}
        page = await client.query(
            TableName=TABLE, KeyConditionExpression="pk = :pk AND sk > :a", ExpressionAttributeValues=numeric
        )
        assert page["Items"] == []

    run(scenario())


def test_an_eventually_consistent_read_may_see_the_table_up_to_its_staleness_ago() -> None:
    async def scenario() -> None:
        _, client = _db(stale_read_s=2.0)
        await client.put_item(TableName=TABLE, Item={**_key("p", "a"), "n": {"N": "1"}})
        await asyncio.sleep(5.0)
        await client.put_item(TableName=TABLE, Item={**_key("p", "a"), "n": {"N": "2"}})
        seen = set()
        for _ in range(50):
            item = (await client.get_item(TableName=TABLE, Key=_key("p", "a")))["Item"]
            seen.add(item["n"]["N"])
        assert seen == {"1", "2"}, "eventually consistent reads right after a write see either"
        strong = (await client.get_item(TableName=TABLE, Key=_key("p", "a"), ConsistentRead=True))["Item"]
        assert strong["n"] == {"N": "2"}
        await asyncio.sleep(2.5)
        later = {(await client.get_item(TableName=TABLE, Key=_key("p", "a")))["Item"]["n"]["N"] for _ in range(20)}
        assert later == {"2"}, "older than the staleness: only the newest"

    run(scenario())


def test_one_partition_key_serves_a_thousand_write_units_a_second_then_throttles() -> None:
    async def scenario() -> None:
        db, _ = _db()
        writers = [db.client(f"w{i}", SimClock(), random.Random(i)) for i in range(4)]
        throttled = 0

        async def write(client: SimDynamoDBClient, i: int) -> None:
            nonlocal throttled
            try:
                await client.put_item(TableName=TABLE, Item={**_key("hot", f"r{i}"), "v": {"S": "x"}})
            except botocore.exceptions.ClientError as exc:
                assert _code(exc) == "ProvisionedThroughputExceededException"
                throttled += 1

        await asyncio.gather(*(write(writers[i % 4], i) for i in range(int(KEY_WRITE_UNITS) + 400)))
        assert throttled > 0 and db.throttled["PutItem"] >= throttled
        assert db.usage.partitions["hot"].write_units <= KEY_WRITE_UNITS + 400

    run(scenario())


def test_faults_throttle_a_key_fail_every_request_and_slow_one_client() -> None:
    async def scenario() -> None:
        db, client = _db()
        db.faults.add(Fault("throttle", 0.0, 10.0, key="p"))
        await client.put_item(TableName=TABLE, Item=_key("p#0", "a"))  # the key only: not one it begins
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.put_item(TableName=TABLE, Item=_key("p", "a"))  # three attempts, all throttled
        assert _code(refused.value) == "ProvisionedThroughputExceededException" and client.calls["PutItem"] == 4
        db.faults.add(Fault("outage", 20.0, 30.0))
        await asyncio.sleep(20.0 - asyncio.get_running_loop().time())
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.get_item(TableName=TABLE, Key=_key("p#0", "a"))
        assert _code(refused.value) == "InternalServerError"
        db.faults.add(Fault("latency", 40.0, 50.0, client="w1", extra_s=3.0))
        await asyncio.sleep(40.0 - asyncio.get_running_loop().time())
        started = asyncio.get_running_loop().time()
        await client.get_item(TableName=TABLE, Key=_key("p#0", "a"))
        assert asyncio.get_running_loop().time() - started >= 3.0

    run(scenario())


def test_an_answer_later_than_the_read_timeout_may_have_landed() -> None:
    async def scenario() -> None:
        db, client = _db()
        client.read_timeout_s = 1.0
        db.faults.add(Fault("latency", 0.0, 100.0, extra_s=1.5))  # halfway: 0.75 s, in time to land
        with pytest.raises(botocore.exceptions.ReadTimeoutError):
            await client.put_item(TableName=TABLE, Item=_key("p", "a"))
        db.faults.active.clear()
        assert "Item" in await client.get_item(TableName=TABLE, Key=_key("p", "a"), ConsistentRead=True)

    run(scenario())
