"""What a store failure is, said plainly, and how long it is retried.

NOTE [ store failures ]
Every client the library drives (pyarrow's S3, delta-rs's object_store, s3fs, adlfs, gcsfs,
pyiceberg's FileIO) reports a failing store in its own words (and exception types): chains of
``↳`` lines with ANSI colour codes, raw XML error bodies, curl codes, HTTP statuses.
:func:`store_error` turns any of them into one :class:`~lakeckpt_tables.errors.StorageError`
that carries the URI and the *kind*, a word a platform engineer acts on
(:data:`~lakeckpt_tables.errors.STORE_KINDS`), and says what to do. The client's own words
follow, cleaned (no colour codes, the XML reduced to its code and message, credentials
redacted), so nothing is lost.

NOTE [ retry budget ]
A store that is throttled, answers 5xx, stalls or drops connections is retried with
exponential backoff (0.2 s doubling to 5 s, with jitter) for at most the *retry budget*,
in seconds: the storage option ``lakeckpt_retry_seconds`` (default
:data:`DEFAULT_RETRY_SECONDS`). When the budget is spent the error is
:class:`~lakeckpt_tables.errors.StoreUnavailableError` naming the root. Errors that waiting
does not cure (a missing bucket, denied access) are raised at once. delta-rs's own client is
given the same budget (``retry_timeout``), so a ledger commit gives up in the same time.
"""

from __future__ import annotations

import errno
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from lakeckpt_tables.errors import StorageError, StoreUnavailableError

__all__ = ["DEFAULT_RETRY_SECONDS", "RETRY_OPTION", "TRANSIENT", "classify", "clean",
           "client_failure",
           "gave_up", "retry_seconds", "retrying", "store_error", "unavailable"]

T = TypeVar("T")

RETRY_OPTION = "lakeckpt_retry_seconds"
"""The storage option holding the retry budget in seconds (NOTE [ retry budget ])."""

DEFAULT_RETRY_SECONDS = 60.0
"""The retry budget when the options give none: long enough to ride out a throttling burst or
a store restart, short enough that a job whose store is gone says so within a minute."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_XML = re.compile(r"<\?xml.*?\?>\s*<Error>(.*?)</Error>", re.S)
_XML_FIELD = re.compile(r"<(Code|Message)>(.*?)</\1>", re.S)

# (kind, patterns in the client's text), first match wins
_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("store full", ("No space left on device", "ENOSPC", "Disk quota exceeded",
                    "XMinioStorageFull", "InsufficientStorage", "Insufficient Storage",
                    "insufficientStorage", "quotaExceeded", "QuotaExceeded",
                    "AccountLimitExceeded", "storage quota", "HTTP status 507", "(507)",
                    "status 507", "507 Insufficient")),
    ("bucket missing", ("NoSuchBucket", "NO_SUCH_BUCKET", "bucket does not exist",
                        "specified bucket does not exist", "ContainerNotFound",
                        "container does not exist", "no bucket named")),
    ("access denied", ("AccessDenied", "ACCESS_DENIED", "InvalidAccessKeyId",
                       "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "UNRECOGNIZED_CLIENT",
                       "SignatureDoesNotMatch", "403 Forbidden", "HTTP status 403",
                       "ExpiredToken", "InvalidToken", "Access Denied", "AuthorizationHeader",
                       "PermissionError", "Unauthorized", "401 Unauthorized",
                       "IMDS", "NoCredentialsError", "Unable to locate credentials",
                       "AuthenticationFailed", "AuthorizationFailure",
                       "Server failed to authenticate", "Invalid Access Key",
                       "Invalid Credentials", "invalid_grant", "401 Invalid")),
    ("unavailable", ("ServiceUnavailable", "Service Unavailable", "SlowDown",
                     "SERVICE_UNAVAILABLE", "SLOW_DOWN", "THROTTLING", "INTERNAL_FAILURE",
                     "REQUEST_TIMEOUT", "REQUEST_TIME_TOO_SKEWED",
                     "reduce your request", "(503)", "status 503", "503 Service",
                     "HTTP status 500", "HTTP status 502", "HTTP status 504", "500 Internal",
                     "502 Bad", "504 Gateway", "InternalError", "Throttl", "RequestTimeout",
                     "timed out", "Timeout was reached", "TimeoutError", "ReadTimeout",
                     "ConnectTimeout", "Connection reset", "connection closed",
                     "Connection aborted", "IncompleteRead", "EOF occurred", "roken pipe",
                     "connection was closed", "UNKNOWN (HTTP status 5", "RemoteDisconnected",
                     "ResponseStreamingError", "error decoding response body", "ServerBusy",
                     "OperationTimedOut", "backendError", "ServerDisconnected",
                     "ClientPayloadError", "Server disconnected",
                     "curlCode: 28", "curlCode: 52", "curlCode: 56", "curlCode: 18")),
    ("unreachable", ("Connection refused", "Could not connect", "NETWORK_CONNECTION",
                     "Failed to connect", "tcp connect error", "dns error",
                     "Name or service not known", "nodename nor servname",
                     "Could not resolve", "curlCode: 6", "curlCode: 7",
                     "EndpointConnectionError", "No route to host")),
    ("not found", ("NoSuchKey", "NOT_FOUND", "Path does not exist", "404 Not Found",
                   "No such file", "not found")),
)

_WHAT_TO_DO = {
    "bucket missing": "the bucket (Azure: container) does not exist: create it, or fix the "
                      "bucket name in the URI (nothing creates buckets)",
    "access denied": "the store refused the credentials: check the credentials in the storage "
                     "options (access key and secret, session token; Azure account key or SAS "
                     "token; GCS service account key) and the bucket's policy",
    "unreachable": "no connection to the store: check the endpoint (storage option "
                   "AWS_ENDPOINT_URL or s3.endpoint, azure_storage_endpoint, the GCS key's "
                   "gcs_base_url), the network and TLS settings",
    "unavailable": "the store is throttling, failing or not answering: retry when it is back, "
                   f"or give a longer retry budget (storage option {RETRY_OPTION})",
    "not found": "no such file or directory under the root: check the URI",
    "store full": "the store is full (no space left on the disk, or a quota reached): free "
                  "space or raise the quota, then retry; nothing was committed by the write "
                  "that failed",
    "failed": "check that the store is reachable and the storage options (endpoint, "
              "credentials) are right, then retry",
}

_ERRNO_KINDS = {errno.EBUSY: "unavailable", errno.EAGAIN: "unavailable",
                errno.ETIMEDOUT: "unavailable", errno.ECONNRESET: "unavailable",
                errno.ECONNABORTED: "unavailable", errno.EPIPE: "unavailable",
                errno.ECONNREFUSED: "unreachable", errno.EHOSTUNREACH: "unreachable",
                errno.ENETUNREACH: "unreachable", errno.EACCES: "access denied",
                errno.ENOSPC: "store full", errno.EDQUOT: "store full"}

# HTTP statuses a store client carries (azure-core's status_code, gcsfs's code)
_STATUS_KINDS = {401: "access denied", 403: "access denied", 404: "not found",
                 429: "unavailable", 500: "unavailable", 502: "unavailable",
                 503: "unavailable", 504: "unavailable", 507: "store full"}

TRANSIENT = frozenset({"unavailable", "unreachable"})
"""Kinds that waiting may cure: retried within the budget."""


def clean(text: str) -> str:
    """A client's error text on one line: no colour codes or ``↳`` chains, XML bodies
    reduced to their code and message."""
    text = _ANSI.sub("", text)

    def _xml(match: re.Match[str]) -> str:
        fields = dict((k, v.strip()) for k, v in _XML_FIELD.findall(match.group(1)))
        return ": ".join(v for v in (fields.get("Code"), fields.get("Message")) if v)

    text = _XML.sub(_xml, text)
    text = text.replace("↳", "->")
    return " ".join(text.split())


def classify(exc: BaseException | str) -> str:
    """The kind of a store failure (:data:`~lakeckpt_tables.errors.STORE_KINDS`)."""
    if isinstance(exc, StorageError):
        return exc.kind
    if isinstance(exc, PermissionError):
        return "access denied"
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KINDS:  # s3fs's translations
        return _ERRNO_KINDS[exc.errno]
    if isinstance(exc, FileNotFoundError) and "bucket" in str(exc).lower():
        return "bucket missing"
    text = _ANSI.sub("", str(exc)) + " " + type(exc).__name__ if not isinstance(exc, str) else exc
    for kind, patterns in _KINDS:
        if any(p in text for p in patterns):
            if kind == "not found" and "restype=container" in text:
                return "bucket missing"  # a 404 for the container itself (delta-rs on Azure)
            return kind
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    if isinstance(status, int) and status in _STATUS_KINDS:
        return _STATUS_KINDS[status]
    if isinstance(exc, ConnectionError | TimeoutError):
        return "unavailable"
    return "failed"


_CLIENT_MODULES = ("azure.", "adlfs", "gcsfs", "google.", "aiohttp", "requests")


def client_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a store client's report of a failing request (an ``OSError`` or
    ``ValueError``, or an exception of adlfs / azure-core / gcsfs / google-auth / aiohttp,
    which raise their own types), as opposed to a bug."""
    if isinstance(exc, OSError | ValueError):
        return True
    if type(exc).__module__.startswith(_CLIENT_MODULES):
        return True
    # adlfs reports a failed block upload as a bare RuntimeError
    return isinstance(exc, RuntimeError) and str(exc).startswith("Failed to upload")


def store_error(uri: str, action: str, exc: BaseException, *,
                redact: Callable[[str], str] = lambda t: t,
                kind: str | None = None) -> StorageError:
    """The named error for a failed store request: ``could not <action> <uri>: <kind>: what
    to do (the client's words)``."""
    if isinstance(exc, StorageError):
        return exc
    kind = kind or classify(exc)
    detail = redact(clean(str(exc))) or type(exc).__name__
    return StorageError(f"could not {action} {uri}: {kind}: {_WHAT_TO_DO[kind]} ({detail})",
                        uri=uri, kind=kind)


def retry_seconds(options: Mapping[str, str] | None) -> float:
    """The retry budget the options give (NOTE [ retry budget ]).

    Raises:
        StorageError: the option is not a number >= 0.
    """
    for key, value in (options or {}).items():
        if key.lower() == RETRY_OPTION:
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not seconds >= 0:
                raise StorageError(f"storage option {RETRY_OPTION} must be a number of seconds "
                                   ">= 0", kind="failed")
            return seconds
    return DEFAULT_RETRY_SECONDS


def retrying(call: Callable[[], T], *, budget: float, uri: str, action: str,
             redact: Callable[[str], str] = lambda t: t,
             transient: Callable[[BaseException], bool] | None = None) -> T:
    """``call()``, retried with backoff while it fails transiently, for at most ``budget``
    seconds.

    Raises:
        StoreUnavailableError: it kept failing transiently for the whole budget.
        Exception: whatever ``call`` raises that is not transient, unchanged.
    """
    is_transient = transient or (lambda e: classify(e) in TRANSIENT)
    deadline = time.monotonic() + budget
    delay = 0.2
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise unavailable(uri, action, exc, budget, redact=redact,
                                  tries=tries) from exc
            time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, 5.0)


def unavailable(uri: str, action: str, exc: BaseException, budget: float, *,
                redact: Callable[[str], str] = lambda t: t,
                tries: int | None = None) -> StoreUnavailableError:
    """The error for a store that failed transiently for the whole retry budget."""
    cause = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ else exc
    how = f", {tries} tries" if tries else ""
    return StoreUnavailableError(
        f"store unavailable: could not {action} {uri} ({classify(exc)}) for {budget:g} s"
        f"{how}; nothing was committed by this request. Retry when the store is back, or "
        f"give a longer retry budget (storage option {RETRY_OPTION}). Last error: "
        f"{redact(clean(str(cause)))}", uri=uri, kind="unavailable")


def gave_up(uri: str, action: str, exc: BaseException, budget: float, *,
            redact: Callable[[str], str] = lambda t: t) -> StorageError:
    """The named error of a client that retried for the budget itself (delta-rs): store
    unavailable when the failure was transient, else the store error of its kind."""
    if classify(exc) in TRANSIENT:
        return unavailable(uri, action, exc, budget, redact=redact)
    return store_error(uri, action, exc, redact=redact)
