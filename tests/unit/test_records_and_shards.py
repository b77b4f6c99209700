"""Positions, the shard graph, error translation, the Arrow table and batch descriptions."""

from __future__ import annotations

import types
from datetime import UTC, datetime

import aiohttp
import botocore.exceptions
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efo import errors
from efo.errors import (
    EXIT_CONFIG,
    EXIT_NOT_FOUND,
    EXIT_RUNTIME,
    AccessDenied,
    ConfigError,
    EfoError,
    EndpointUnreachable,
    InvalidRequest,
    KmsUnusable,
    ResourceNotFound,
    Retriable,
    translate,
)
from efo.kinesis.graph import Shard, ShardGraph
from efo.pipeline.records import MAX_SUB_SEQUENCE, Position, RecordChunk, Row, after
from sparkbridge.arrow import SCHEMA, to_table
from sparkbridge.batches import DeliveryWatermark, describe_batch
from sparkbridge.sinks import ShardRange

BIG = "49590338271490256608559692538361571095921575989136588898"


# ---- Position ---------------------------------------------------------------------------


def test_starting_position_of_latest_and_trim_horizon_is_only_the_type() -> None:
    assert Position("LATEST").starting_position() == {"Type": "LATEST"}
    assert Position("TRIM_HORIZON").starting_position() == {"Type": "TRIM_HORIZON"}


def test_starting_position_of_sequence_positions_carries_the_sequence_number_as_given() -> None:
    assert after(BIG).starting_position() == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": BIG}
    assert Position("AT_SEQUENCE_NUMBER", "7", 3).starting_position() == {
        "Type": "AT_SEQUENCE_NUMBER",
        "SequenceNumber": "7",
    }


def test_starting_position_of_at_timestamp_carries_the_timestamp() -> None:
    stamp = datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert Position("AT_TIMESTAMP", timestamp=stamp).starting_position() == {"Type": "AT_TIMESTAMP", "Timestamp": stamp}


def test_delivered_through_is_none_without_a_sequence_number() -> None:
    assert Position("LATEST").delivered_through() is None
    assert Position("TRIM_HORIZON").delivered_through() is None
    assert Position("AT_TIMESTAMP", timestamp=datetime(2026, 1, 1, tzinfo=UTC)).delivered_through() is None


def test_delivered_through_after_n_covers_all_of_record_n() -> None:
    assert after("10").delivered_through() == (10, MAX_SUB_SEQUENCE)
    assert after(BIG).delivered_through() == (int(BIG), MAX_SUB_SEQUENCE)


def test_delivered_through_at_n_covers_everything_before_record_n() -> None:
    assert Position("AT_SEQUENCE_NUMBER", "10").delivered_through() == (9, MAX_SUB_SEQUENCE)
    assert Position("AT_SEQUENCE_NUMBER", BIG).delivered_through() == (int(BIG) - 1, MAX_SUB_SEQUENCE)


def test_delivered_through_at_n_with_sub_sequence_k_covers_sub_records_up_to_k() -> None:
    assert Position("AT_SEQUENCE_NUMBER", "10", 4).delivered_through() == (10, 4)
    # ordering: sub-record 5 of record 10 is new, record 10 as a whole (MAX sub) too, record 9 is not
    mark = Position("AT_SEQUENCE_NUMBER", "10", 4).delivered_through()
    assert mark is not None
    assert mark < (10, 5) and mark >= (10, 4) and mark > (9, MAX_SUB_SEQUENCE)


def test_position_text_names_kind_sequence_and_sub_sequence() -> None:
    assert str(after("5")) == "AFTER_SEQUENCE_NUMBER:5"
    assert str(Position("AT_SEQUENCE_NUMBER", "5", 2)) == "AT_SEQUENCE_NUMBER:5/2"
    assert str(Position("LATEST")) == "LATEST"
    assert str(Position("AT_TIMESTAMP", timestamp=datetime(2026, 1, 31, tzinfo=UTC))) == (
        "AT_TIMESTAMP:2026-01-31T00:00:00+00:00"
    )


# ---- ShardGraph -------------------------------------------------------------------------


def _graph() -> ShardGraph:
    # 0 splits into 1 and 2; 1 and 2 merge into 3; 4's parent "gone" has expired from the stream.
    return ShardGraph.of(
        Shard.from_api(item)
        for item in [
            {"ShardId": "s-0", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"}},
            {"ShardId": "s-1", "ParentShardId": "s-0", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "49"}},
            {
                "ShardId": "s-2",
                "ParentShardId": "s-0",
                "HashKeyRange": {"StartingHashKey": "50", "EndingHashKey": "99"},
            },
            {"ShardId": "s-3", "ParentShardId": "s-1", "AdjacentParentShardId": "s-2"},
            {"ShardId": "s-4", "ParentShardId": "gone"},
        ]
    )


def test_shard_from_api_reads_parents_and_hash_range() -> None:
    graph = _graph()
    assert graph.shards["s-3"].parents == ("s-1", "s-2")
    assert graph.shards["s-0"].parents == ()
    assert (graph.shards["s-2"].starting_hash_key, graph.shards["s-2"].ending_hash_key) == (50, 99)


def test_a_shard_named_as_a_parent_is_closed_and_the_rest_are_open() -> None:
    graph = _graph()
    assert [sid for sid in sorted(graph.shards) if graph.is_closed(sid)] == ["s-0", "s-1", "s-2"]
    assert [sid for sid in sorted(graph.shards) if not graph.is_closed(sid)] == ["s-3", "s-4"]


def test_children_of_a_split_are_both_new_shards_and_of_merge_parents_the_merged_shard() -> None:
    graph = _graph()
    assert graph.children("s-0") == ["s-1", "s-2"]
    assert graph.children("s-1") == ["s-3"]
    assert graph.children("s-2") == ["s-3"]
    assert graph.children("s-3") == []


# ---- errors.translate -------------------------------------------------------------------


def _client_error(code: str, status: int = 400, message: str = "went wrong") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, "SomeCall"
    )


@pytest.mark.parametrize(
    ("code", "status", "kind", "exit_code", "retriable"),
    [
        ("ResourceNotFoundException", 400, ResourceNotFound, EXIT_NOT_FOUND, False),
        ("TableNotFoundException", 400, ResourceNotFound, EXIT_NOT_FOUND, False),
        ("AccessDeniedException", 400, AccessDenied, EXIT_RUNTIME, False),
        ("ExpiredTokenException", 400, AccessDenied, EXIT_RUNTIME, False),
        ("KMSDisabledException", 400, KmsUnusable, EXIT_RUNTIME, False),
        ("KMSNotFoundException", 400, KmsUnusable, EXIT_RUNTIME, False),
        ("InvalidArgumentException", 400, InvalidRequest, EXIT_RUNTIME, False),
        ("ValidationException", 400, InvalidRequest, EXIT_RUNTIME, False),
        ("ResourceInUseException", 400, Retriable, EXIT_RUNTIME, True),
        ("LimitExceededException", 400, Retriable, EXIT_RUNTIME, True),
        ("ProvisionedThroughputExceededException", 400, Retriable, EXIT_RUNTIME, True),
        ("InternalFailure", 500, Retriable, EXIT_RUNTIME, True),
        ("NeverHeardOfIt", 503, Retriable, EXIT_RUNTIME, True),
        ("NeverHeardOfIt", 400, EfoError, EXIT_RUNTIME, False),
    ],
)
def test_translate_maps_aws_error_codes_to_classes_and_exit_codes(
    code: str, status: int, kind: type[EfoError], exit_code: int, retriable: bool
) -> None:
    error = translate(_client_error(code, status), resource="stream 'orders'")
    assert type(error) is kind
    assert error.exit_code == exit_code
    assert error.retriable is retriable
    assert "stream 'orders'" in str(error)
    assert code in str(error)


def test_translated_message_names_the_resource_the_aws_message_and_the_hint() -> None:
    error = translate(
        _client_error("ResourceNotFoundException", message="Stream orders under account 1 not found."),
        resource="stream 'orders'",
        hint="create it first",
    )
    assert str(error) == (
        "stream 'orders' not found (ResourceNotFoundException: Stream orders under account 1 not found.); "
        "create it first"
    )


def test_translate_points_access_denied_at_credentials_and_iam_policy() -> None:
    error = translate(_client_error("AccessDeniedException"), resource="table 'app'")
    assert "access to table 'app' denied" in str(error)
    assert "IAM policy" in str(error)


def test_translate_passes_efo_errors_through_unchanged() -> None:
    original = ConfigError("bad")
    assert translate(original, resource="x") is original


def test_translate_makes_an_unreachable_endpoint_its_own_retriable_class() -> None:
    error = translate(botocore.exceptions.EndpointConnectionError(endpoint_url="https://kinesis.local"), resource="r")
    assert type(error) is EndpointUnreachable
    assert error.retriable
    assert "kinesis.local" in str(error)
    key = types.SimpleNamespace(host="kinesis.local", port=443, ssl=True)
    assert type(translate(aiohttp.ClientConnectorError(key, OSError(111, "refused")), resource="r")) is (
        EndpointUnreachable
    )


def test_translate_turns_missing_credentials_and_region_into_operator_advice() -> None:
    credentials = translate(botocore.exceptions.NoCredentialsError(), resource="stream 'orders'")
    assert type(credentials) is AccessDenied
    assert "AWS_PROFILE" in str(credentials)
    region = translate(botocore.exceptions.NoRegionError(), resource="stream 'orders'")
    assert type(region) is ConfigError
    assert region.exit_code == EXIT_CONFIG
    assert "EFO_REGION" in str(region)


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("read timed out"),
        ConnectionResetError(104, "reset by peer"),
        aiohttp.ClientConnectionError("connection closed"),
        aiohttp.ClientPayloadError("truncated"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="https://kinesis.local"),
    ],
    ids=["TimeoutError", "ConnectionResetError", "ClientConnectionError", "ClientPayloadError", "ReadTimeoutError"],
)
def test_translate_makes_network_failures_retriable(exc: BaseException) -> None:
    error = translate(exc, resource="shard s-0")
    assert type(error) is errors.Retriable
    assert error.retriable
    assert "shard s-0" in str(error)


def test_translate_wraps_an_unknown_exception_in_a_non_retriable_efo_error() -> None:
    error = translate(KeyError("boom"), resource="shard s-0")
    assert type(error) is EfoError
    assert not error.retriable


def test_error_code_reads_the_aws_code_or_none() -> None:
    assert errors.error_code(_client_error("LimitExceededException")) == "LimitExceededException"
    assert errors.error_code(TimeoutError()) is None


# ---- sparkbridge.arrow ------------------------------------------------------------------


def _chunk(shard: str, serial: int, seqs: list[str], *, epoch_ms: int = 1_700_000_000_123) -> RecordChunk:
    rows = [
        Row(
            seq,
            seq.encode(),
            f"pk-{seq}",
            epoch_ms + i,
            sub_sequence_number=i if i % 2 else None,
            explicit_hash_key="123" if i % 2 else None,
            error="invalid_json" if i == 2 else None,
        )
        for i, seq in enumerate(seqs)
    ]
    return RecordChunk.of_rows("orders", shard, serial, rows)


def test_to_table_has_exactly_the_public_schema() -> None:
    table = to_table([_chunk("s-0", 1, ["1", "2"])])
    assert table.schema.equals(SCHEMA)
    assert table.schema.names == [
        "stream",
        "shard_id",
        "sequence_number",
        "sub_sequence_number",
        "partition_key",
        "explicit_hash_key",
        "approximate_arrival_timestamp",
        "data",
        "error",
    ]
    assert table.schema.field("approximate_arrival_timestamp").type == pa.timestamp("ms", tz="UTC")
    assert not table.schema.field("sequence_number").nullable
    assert table.schema.field("sub_sequence_number").nullable


def test_to_table_keeps_row_order_across_chunks_and_repeats_stream_and_shard_per_row() -> None:
    chunks = [_chunk("s-1", 1, ["5", "6", "7"]), _chunk("s-0", 1, [BIG]), _chunk("s-1", 2, ["8"])]
    rows = to_table(chunks).to_pylist()
    assert [(r["shard_id"], r["sequence_number"]) for r in rows] == [
        ("s-1", "5"),
        ("s-1", "6"),
        ("s-1", "7"),
        ("s-0", BIG),
        ("s-1", "8"),
    ]
    assert {r["stream"] for r in rows} == {"orders"}
    assert [r["data"] for r in rows[:3]] == [b"5", b"6", b"7"]
    assert [r["sub_sequence_number"] for r in rows[:3]] == [None, 1, None]
    assert [r["explicit_hash_key"] for r in rows[:2]] == [None, "123"]
    assert [r["error"] for r in rows[:3]] == [None, None, "invalid_json"]
    assert [r["partition_key"] for r in rows[:2]] == ["pk-5", "pk-6"]


def test_to_table_timestamps_are_utc_milliseconds_since_the_epoch() -> None:
    table = to_table([_chunk("s-0", 1, ["1", "2"], epoch_ms=1_700_000_000_123)])
    column = table.column("approximate_arrival_timestamp")
    assert column.cast(pa.int64()).to_pylist() == [1_700_000_000_123, 1_700_000_000_124]
    first = column.to_pylist()[0]
    assert first == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert first.utcoffset() is not None and first.utcoffset().total_seconds() == 0


_ROWS = st.lists(
    st.builds(
        Row,
        st.integers(0, 10**40).map(str),
        st.binary(max_size=8),
        st.text(max_size=6),
        st.integers(0, 2**42),
        st.none() | st.integers(0, 2**63 - 1),
        st.none() | st.text(max_size=4),
        st.none() | st.sampled_from(["invalid_json", "corrupt_aggregate"]),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_ROWS, st.integers(0, 7), st.none() | st.integers(0, 7)), max_size=5))
def test_chunks_cut_with_rows_give_the_table_and_the_bytes_of_the_rows_they_kept(
    drawn: list[tuple[list[Row], int, int | None]],
) -> None:
    """RecordChunk.rows, as the watermark and a bounded run cut chunks."""
    cut = [
        RecordChunk.of_rows("orders", f"s-{i}", 1, rows).rows(start, stop)
        for i, (rows, start, stop) in enumerate(drawn)
    ]
    kept = [RecordChunk.of_rows("orders", f"s-{i}", 1, rows[start:stop]) for i, (rows, start, stop) in enumerate(drawn)]
    got = to_table(cut)
    assert got.schema.equals(SCHEMA)
    assert got.equals(to_table(kept)), (got.to_pylist(), to_table(kept).to_pylist())
    assert [chunk.data_bytes for chunk in cut] == [chunk.data_bytes for chunk in kept]


def test_to_table_fills_optional_columns_without_a_value_with_nulls() -> None:
    plain = RecordChunk.of_rows("orders", "s-0", 1, [Row("1", b"a", "k", 5), Row("2", b"b", "k", 6)])
    aggregated = RecordChunk.of_rows("orders", "s-1", 1, [Row("3", b"c", "k", 7, 0, "99")])
    rows = to_table([plain, aggregated]).to_pylist()
    assert [r["sub_sequence_number"] for r in rows] == [None, None, 0]
    assert [r["explicit_hash_key"] for r in rows] == [None, None, "99"]
    assert [r["error"] for r in rows] == [None, None, None]
    assert to_table([plain]).column("error").null_count == 2


def test_rows_cuts_every_column_and_keeps_the_chunk_s_claim_and_grant() -> None:
    chunk = RecordChunk.of_rows("orders", "s-0", 4, [Row(str(i), b"x" * i, f"k{i}", i) for i in range(5)], epoch=3)
    chunk.grant = grant = object()
    part = chunk.rows(1, 3)
    assert (part.stream, part.shard_id, part.serial, part.epoch, part.grant) == ("orders", "s-0", 4, 3, grant)
    assert part.sequence_numbers == ["1", "2"] and part.data == [b"x", b"xx"]
    assert part.data_bytes == 3 and part.arrival_ms == [1, 2]
    assert len(chunk) == 5, "the chunk itself is left whole"


@pytest.mark.parametrize("column", ["arrival_ms", "sequence_numbers", "partition_keys", "sub_sequence_numbers", "data"])
@pytest.mark.parametrize("change", ["longer", "shorter", "one longer, the next one shorter"])
@pytest.mark.parametrize("rows", [1, 3])
def test_to_table_refuses_a_chunk_whose_column_is_not_one_value_per_row(column: str, change: str, rows: int) -> None:
    """A column of one row (all null in the optional ones) or three (a value at the second)."""
    chunks = [_chunk("s-0", 1, ["7"]), _chunk("s-1", 1, [str(i) for i in range(rows)]), _chunk("s-2", 1, ["9"])]
    values = getattr(chunks[1], column)
    if change == "shorter":
        values.pop()
    else:
        values.append(values[0])
    if change == "one longer, the next one shorter":  # the same total
        getattr(chunks[2], column).pop()
    with pytest.raises((ValueError, pa.ArrowInvalid)):
        to_table(chunks)


def test_to_table_of_no_chunks_is_an_empty_table_with_the_schema() -> None:
    table = to_table([])
    assert table.num_rows == 0
    assert table.schema.equals(SCHEMA)


# ---- describe_batch ---------------------------------------------------------------------


def test_describe_batch_gives_per_shard_first_and_last_sequence_and_counts() -> None:
    chunks = [
        _chunk("s-0", 1, ["9", "10"]),
        _chunk("s-1", 1, [BIG]),
        _chunk("s-0", 2, ["11", "12", "13"]),
    ]
    info = describe_batch("batch-1", chunks, attempt=2)
    assert info.batch_id == "batch-1"
    assert info.attempt == 2
    assert info.records == 6
    assert info.bytes == sum(c.data_bytes for c in chunks)
    assert info.shards == {
        ("orders", "s-0"): ShardRange("9", "13", 5),
        ("orders", "s-1"): ShardRange(BIG, BIG, 1),
    }


def test_describe_batch_keeps_the_same_shard_id_of_two_streams_apart() -> None:
    payments = _chunk("s-0", 1, ["20"])
    payments.stream = "payments"
    info = describe_batch("batch-1", [_chunk("s-0", 1, ["9", "10"]), payments])
    assert info.shards == {("orders", "s-0"): ShardRange("9", "10", 2), ("payments", "s-0"): ShardRange("20", "20", 1)}


def test_describe_batch_defaults_to_the_first_attempt() -> None:
    assert describe_batch("b", [_chunk("s-0", 1, ["1"])]).attempt == 1


def test_the_delivery_watermark_of_a_shard_id_does_not_drop_another_streams_rows() -> None:
    watermark = DeliveryWatermark()
    kept, dropped = watermark.filter(_chunk("s-0", 1, ["50", "51"]))
    assert (len(kept), dropped) == (2, 0)
    payments = _chunk("s-0", 1, ["7", "8"])  # below orders' mark of the same shard id
    payments.stream = "payments"
    kept, dropped = watermark.filter(payments)
    assert (len(kept), dropped) == (2, 0)
    kept, dropped = watermark.filter(_chunk("s-0", 2, ["50", "52"]))  # orders' own overlap is still dropped
    assert (len(kept), dropped) == (1, 1)


def test_tls_to_an_endpoint_that_speaks_plain_http_says_to_use_http() -> None:
    raw = botocore.exceptions.SSLError(
        endpoint_url="https://127.0.0.1:4567/",
        error="Cannot connect to host 127.0.0.1:4567 ssl:default [[SSL: WRONG_VERSION_NUMBER] wrong version number]",
    )
    error = translate(raw, resource="stream 'orders'")
    assert type(error) is EndpointUnreachable
    message = str(error)
    assert message.startswith("TLS with the endpoint for stream 'orders' failed (SSLError: ")
    assert "WRONG_VERSION_NUMBER" in message
    assert "plain HTTP" in message and "http://" in message and "EFO_KINESIS_ENDPOINT" in message


def test_a_server_error_without_an_aws_code_is_named_by_its_http_status_and_says_what_to_do() -> None:
    # botocore's code for a 5xx whose body is not an AWS error is the status itself (moto's 500 page).
    error = translate(_client_error("500", 500, "Internal Server Error"), resource="DynamoDB table 'app'")
    assert type(error) is Retriable
    assert str(error) == (
        "HTTP 500 on DynamoDB table 'app': Internal Server Error; the service kept failing through the SDK's "
        "retries: try again, and if it persists check the endpoint and the region (EFO_KINESIS_ENDPOINT, "
        "EFO_DYNAMODB_ENDPOINT, EFO_REGION)"
    )


def test_no_region_names_the_variables_botocore_reads() -> None:
    error = translate(botocore.exceptions.NoRegionError(), resource="stream 'orders'")
    assert "EFO_REGION" in str(error) and "AWS_DEFAULT_REGION" in str(error)
    assert "(or AWS_REGION)" not in str(error)
