"""Every exception a SubscribeToShard event stream can carry, each with what it does: retried
with a resubscribe, or the service stops with the error that names it."""

from __future__ import annotations

import pytest

from efo.errors import STREAM_EXCEPTIONS, AccessDenied, EfoError, KmsUnusable, ResourceNotFound
from efo.kinesis.decoder import _event_stream_shape, event_stream_error

from .test_subscription import FakeStream, event, harness, run, shard_end

IN_STREAM = {
    "ResourceNotFoundException": ResourceNotFound,
    "ResourceInUseException": None,
    "KMSDisabledException": KmsUnusable,
    "KMSInvalidStateException": KmsUnusable,
    "KMSAccessDeniedException": AccessDenied,
    "KMSNotFoundException": KmsUnusable,
    "KMSOptInRequired": KmsUnusable,
    "KMSThrottlingException": None,
    "InternalFailureException": None,
    "InternalFailure": None,  # not in the API's model, sent by some servers: retried
    "SomethingNewException": None,  # any other undocumented exception event: retried
}


def _exception_event(code: str) -> BaseException:
    return event_stream_error(
        {":message-type": "exception", ":exception-type": code, ":content-type": "application/json"},
        b'{"message": "from the stream"}',
    )


def test_every_exception_of_the_event_stream_is_modelled() -> None:
    shape = _event_stream_shape()
    documented = {name for name, member in shape.members.items() if member.metadata.get("exception")}
    assert documented == STREAM_EXCEPTIONS
    assert documented <= set(IN_STREAM)


@pytest.mark.parametrize(("code", "fatal"), list(IN_STREAM.items()), ids=list(IN_STREAM))
def test_each_exception_event_is_retried_or_stops_with_its_own_error(code: str, fatal: type[EfoError] | None) -> None:
    async def lease_check() -> bool:
        return True

    h = harness(
        [FakeStream([event("1", continuation="1")], error=_exception_event(code)), [shard_end()]],
        lease_check=lease_check,
    )
    if fatal is None:
        assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
        assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "1"}
    else:
        with pytest.raises(fatal) as info:
            run(h.subscription.run())
        assert info.value.code == code and "from the stream" in str(info.value)
        assert len(h.client.calls) == 1
