"""The project's errors, and the one place where AWS error codes are translated.

Every error the service can stop on is an :class:`EfoError`. Its ``exit_code`` is what the process
exits with (0 success, 1 runtime failure, 2 usage or configuration, 3 a named resource not found;
75 is a bounded run stopped before its end, which the driver decides) and ``retriable`` says
whether a subscription or lease loop may try again.
"""

from __future__ import annotations

from typing import ClassVar

import aiohttp
import botocore.exceptions
import botocore.parsers

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_CONFIG = 2
EXIT_NOT_FOUND = 3
#: A bounded run (``efo run --until``) stopped before every shard reached its bound (SIGTERM): what
#: it read is checkpointed; run it again to finish (EX_TEMPFAIL of sysexits.h: "try again later").
EXIT_INCOMPLETE = 75


class EfoError(Exception):
    """Root of every error efo raises on purpose. ``str(error)`` is one line for an operator;
    ``code`` is the AWS error code it was translated from, if any."""

    exit_code: ClassVar[int] = EXIT_RUNTIME
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ConfigError(EfoError):
    exit_code = EXIT_CONFIG


class ResourceNotFound(EfoError):
    exit_code = EXIT_NOT_FOUND


class AccessDenied(EfoError):
    pass


class InvalidRequest(EfoError):
    """AWS rejected the arguments (InvalidArgument, ValidationException): a bug or a bad setting."""


class KmsUnusable(EfoError):
    """The stream's KMS key is disabled, missing or not accessible."""


class StreamRecreated(EfoError):
    """The table's checkpoints belong to an earlier stream of the same name."""

    exit_code = EXIT_CONFIG


class LayoutOutdated(EfoError):
    """The lease table holds an application's rows in an older layout: migrate it first."""

    exit_code = EXIT_CONFIG


class LeaseLost(EfoError):
    """A conditional write found another owner or a newer lease counter (fencing). It stops the one
    shard whose lease it was, never the process: the coordinator catches it wherever it arises."""


class ShardTimeout(EfoError):
    """A bounded run: a shard short of its bound received no event for ``run.shard_timeout_s``."""


class Retriable(EfoError):
    """Throttling, 5xx, a reset connection, a read timeout, a shard still in use: try again later."""

    retriable = True


class EndpointUnreachable(EfoError):
    """A connection could not be opened at all. Retriable inside a running subscription; fatal at start."""

    retriable = True


class SinkFailed(EfoError):
    pass


class SinkStalled(EfoError):
    """A batch made no progress for ``batch.stall_timeout_s``: the worker stops so its shards move."""


_RETRIABLE_CODES = frozenset(
    {
        "ResourceInUseException",
        "LimitExceededException",
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "InternalFailure",
        "InternalFailureException",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "KMSThrottlingException",
        "RequestExpired",
        "ExpiredIteratorException",
    }
)
#: Every exception a SubscribeToShard event stream can carry (the API's SubscribeToShardEventStream;
#: a test keeps this equal to botocore's model). Each is translated by its code below. An exception
#: event of a type not listed (the stream broke in a way the API does not document, such as the bare
#: ``InternalFailure`` some servers send) is retried like InternalFailureException.
STREAM_EXCEPTIONS = frozenset(
    {
        "ResourceNotFoundException",
        "ResourceInUseException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSAccessDeniedException",
        "KMSNotFoundException",
        "KMSOptInRequired",
        "KMSThrottlingException",
        "InternalFailureException",
    }
)
_NOT_FOUND_CODES = frozenset({"ResourceNotFoundException", "TableNotFoundException"})
_ACCESS_CODES = frozenset(
    {
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
        "KMSAccessDeniedException",
    }
)
_KMS_CODES = frozenset({"KMSDisabledException", "KMSInvalidStateException", "KMSNotFoundException", "KMSOptInRequired"})
#: What to do about a server error that outlasted the SDK's retries (said at start-up, where it ends the run).
_SERVER_FAILED = (
    "the service kept failing through the SDK's retries: try again, and if it persists check the endpoint and the "
    "region (EFO_KINESIS_ENDPOINT, EFO_DYNAMODB_ENDPOINT, EFO_REGION)"
)
_INVALID_CODES = frozenset({"InvalidArgumentException", "ValidationException", "SerializationException"})


def error_code(exc: BaseException) -> str | None:
    if isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def translate(exc: BaseException, *, resource: str, hint: str = "") -> EfoError:
    """Map a botocore / aiohttp / network error into an :class:`EfoError`.

    ``resource`` names what the call was about ("stream 'orders'", "table 'app'") so the
    message tells the operator which thing is missing or forbidden; ``hint`` says what to do.
    """
    if isinstance(exc, EfoError):
        return exc
    suffix = f"; {hint}" if hint else ""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = error_code(exc) or "Unknown"
        message = exc.response.get("Error", {}).get("Message") or str(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _NOT_FOUND_CODES:
            return ResourceNotFound(f"{resource} not found ({code}: {message}){suffix}", code=code)
        if code in _ACCESS_CODES:
            return AccessDenied(
                f"access to {resource} denied ({code}: {message}); "
                "check the credentials and the IAM policy in the README",
                code=code,
            )
        if code in _KMS_CODES:
            return KmsUnusable(f"the KMS key of {resource} cannot be used ({code}: {message})", code=code)
        in_stream_unknown = isinstance(exc, botocore.exceptions.EventStreamError) and code not in STREAM_EXCEPTIONS
        if code.isdigit():  # botocore's code for an answer that is not an AWS error: its HTTP status
            code = f"HTTP {code}"
        if isinstance(status, int) and status >= 500 and code not in _RETRIABLE_CODES:
            return Retriable(f"{code} on {resource}: {message}; {_SERVER_FAILED}", code=code)
        if code in _RETRIABLE_CODES or in_stream_unknown:
            return Retriable(f"{code} on {resource}: {message}", code=code)
        if code in _INVALID_CODES:
            return InvalidRequest(f"{resource}: {code}: {message}{suffix}", code=code)
        return EfoError(f"{resource}: {code}: {message}{suffix}", code=code)
    if isinstance(exc, botocore.exceptions.SSLError | aiohttp.ClientSSLError):
        return EndpointUnreachable(
            f"TLS with the endpoint for {resource} failed ({type(exc).__name__}: {exc}); an endpoint that speaks "
            "plain HTTP (a local stack) needs http:// in EFO_KINESIS_ENDPOINT or EFO_DYNAMODB_ENDPOINT; otherwise "
            "check its certificate (AWS_CA_BUNDLE)"
        )
    if isinstance(exc, botocore.exceptions.EndpointConnectionError | aiohttp.ClientConnectorError):
        return EndpointUnreachable(
            f"cannot connect to the endpoint for {resource}: {exc}; check the endpoint settings "
            "(EFO_KINESIS_ENDPOINT, EFO_DYNAMODB_ENDPOINT, EFO_REGION) and the network"
        )
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AccessDenied(
            f"no AWS credentials found for {resource}: set AWS_PROFILE, AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY or a web identity (IRSA)"
        )
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return ConfigError("no AWS region: set EFO_REGION (or AWS_DEFAULT_REGION, which the AWS CLI reads too)")
    if isinstance(
        exc,
        TimeoutError
        | ConnectionError
        | aiohttp.ClientError
        | botocore.exceptions.ConnectionError
        | botocore.exceptions.HTTPClientError
        | botocore.parsers.ResponseParserError
        | botocore.exceptions.ReadTimeoutError,
    ):
        return Retriable(f"{type(exc).__name__} on {resource}: {exc}")
    return EfoError(f"{type(exc).__name__} on {resource}: {exc}")
