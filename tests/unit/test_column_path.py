"""End to end, the column path against the old list path: the same rows from the wire to the batch table.

The column path is what runs in production: the event's JSON decoded into columns (decode_event: by
msgspec, or by orjson and pybase64; both are drawn), KPL expand under the delivery watermark, a
bounded run's cut (bound._truncate) and the bridge's table (to_table). The old path is rebuilt here record by record
with Python lists: each payload decoded on its own, each aggregate de-aggregated on its own, the
watermark and the cut applied per row, the table built from one list per column.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import orjson
import pyarrow as pa
import pybase64
from hypothesis import given, settings
from hypothesis import strategies as st

from efo.kinesis import decoder
from efo.kinesis.decoder import decode_event
from efo.kinesis.kpl import CORRUPT_AGGREGATE, SubRecord, expand, is_aggregate
from efo.pipeline.records import MAX_SUB_SEQUENCE, RecordChunk
from efo.worker.bound import _truncate
from sparkbridge.arrow import SCHEMA, to_table
from tests.unit.test_kpl import Event, events


def _old_path(
    event: Event, contents: list[list[SubRecord] | None], delivered: tuple[int, int] | None, policy: str, cut: int
) -> tuple[pa.Table, list[str]]:
    """Rows and dead letters as lists, record by record, then the table from those lists."""
    rows: list[tuple[Any, ...]] = []
    dead: list[str] = []
    encoded = [pybase64.b64encode(data).decode() for data in event.data]
    for i, subs in enumerate(contents):
        seq, pk, arrival = event.sequence_numbers[i], event.partition_keys[i], event.arrival_ms[i]
        data = pybase64.b64decode(encoded[i], validate=True)  # the old per-record decoding
        below_cut = cut >= 0 and int(seq) < cut
        if subs is None:
            if delivered is not None and (int(seq), MAX_SUB_SEQUENCE) <= delivered:
                continue
            corrupt = is_aggregate(data)  # framed as an aggregate, and no sub-records drawn: corrupt
            if corrupt and policy == "dead_letter":
                if below_cut:
                    dead.append(seq)
            elif below_cut:
                rows.append((seq, None, pk, None, arrival, data, CORRUPT_AGGREGATE if corrupt else None))
            continue
        for sub, record in enumerate(subs):
            if (delivered is None or (int(seq), sub) > delivered) and below_cut:
                rows.append((seq, sub, record.partition_key, record.explicit_hash_key, arrival, record.data, None))
    columns = list(zip(*rows, strict=True)) if rows else [()] * 7
    n = len(rows)
    table = pa.Table.from_arrays(
        [
            pa.array(["s"] * n, pa.string()),
            pa.array(["shard-0"] * n, pa.string()),
            pa.array(list(columns[0]), pa.string()),
            pa.array(list(columns[1]), pa.int64()),
            pa.array(list(columns[2]), pa.string()),
            pa.array(list(columns[3]), pa.string()),
            pa.array(list(columns[4]), pa.int64()).view(SCHEMA.field("approximate_arrival_timestamp").type),
            pa.array(list(columns[5]), pa.binary()),
            pa.array(list(columns[6]), pa.string()),
        ],
        schema=SCHEMA,
    )
    return table, dead


def _column_path(
    event: Event, delivered: tuple[int, int] | None, policy: str, cut: int, by_orjson: bool
) -> tuple[pa.Table, list[str], RecordChunk]:
    wire = [
        {
            "SequenceNumber": seq,
            "ApproximateArrivalTimestamp": arrival / 1000,
            "Data": pybase64.b64encode(data).decode(),
            "PartitionKey": pk,
        }
        for seq, pk, arrival, data in zip(
            event.sequence_numbers, event.partition_keys, event.arrival_ms, event.data, strict=True
        )
    ]
    # The drawn payloads are all small: with by_orjson, msgspec's limit is set below them.
    limit = -1 if by_orjson else decoder.TYPED_MAX_DATA_CHARS
    with (
        patch.object(decoder, "TYPED_MAX_DATA_CHARS", limit),
        patch.object(decoder, "_from_json", wraps=decoder._from_json) as parsed_by_orjson,
    ):
        decoded = decode_event(orjson.dumps({"Records": wire}))
    assert parsed_by_orjson.called == (by_orjson or not wire)  # an event without records has no "Data"
    assert decoded.arrival_ms == event.arrival_ms
    out = expand(
        decoded.sequence_numbers, decoded.partition_keys, decoded.arrival_ms, decoded.data, delivered, policy=policy
    )
    chunk = RecordChunk(
        "s",
        "shard-0",
        1,
        sequence_numbers=out.sequence_numbers,
        sub_sequence_numbers=out.sub_sequence_numbers,
        partition_keys=out.partition_keys,
        explicit_hash_keys=out.explicit_hash_keys,
        arrival_ms=out.arrival_ms,
        data=out.data,
        errors=out.errors,
        data_bytes=out.data_bytes,
        dead_letters=out.dead_letters,
    )
    _truncate(chunk, cut)
    return to_table([chunk]), [letter.sequence_number for letter in chunk.dead_letters], chunk


@settings(max_examples=200, deadline=None)
@given(
    events(),
    st.none() | st.tuples(st.integers(0, 30), st.integers(0, 7) | st.just(MAX_SUB_SEQUENCE)),
    st.sampled_from(["passthrough", "dead_letter"]),
    st.just(-1) | st.integers(0, 40),
    st.booleans(),
)
def test_the_column_path_gives_the_rows_the_list_path_gave(
    drawn: tuple[Event, list[list[SubRecord] | None]],
    delivered: tuple[int, int] | None,
    policy: str,
    cut: int,
    by_orjson: bool,
) -> None:
    event, contents = drawn
    want, want_dead = _old_path(event, contents, delivered, policy, cut)
    table, dead, chunk = _column_path(event, delivered, policy, cut, by_orjson)
    assert table.equals(want), (table.to_pylist(), want.to_pylist())
    assert dead == want_dead
    assert chunk.data_bytes == sum(map(len, want.column("data").to_pylist()))
