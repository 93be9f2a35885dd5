"""Fixtures for the object storage tests: real S3 servers (moto's server mode) on loopback.

A server runs in its own process (``python -m lakeckpt_tables.tools.s3server``) on a free port of
127.0.0.1 for the whole session; tests talk to it over HTTP exactly as to S3, and control its
front (request log, outage, lost responses, latency) over HTTP too. Nothing inside the library
is mocked. A second, "shadow" server holds different data under the same names: tests point
the environment's ``AWS_*`` variables at it and prove it never sees a request.

Test modules import the fixtures they use: ``from _s3server import s3, shadow_s3, S3Server``.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from lakeckpt_tables.tools.s3server import spawn

__all__ = ["S3Server", "s3", "shadow_env", "shadow_s3"]


class S3Server:
    """One running server: its endpoint, options for the library, and its front's controls."""

    kind = "s3"
    scheme = "s3"

    def __init__(self, key: str, secret: str) -> None:
        self.key, self.secret = key, secret
        self.proc, self.port = spawn()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def uri(self, bucket: str, path: str = "") -> str:
        """The URI of ``path`` in ``bucket``."""
        return f"s3://{bucket}/{path}".rstrip("/")

    def options(self, **extra: str) -> dict[str, str]:
        """delta-rs style storage options naming this server and its credentials."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true", **extra}

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties naming this server."""
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": self.key,
                "s3.secret-access-key": self.secret, "s3.region": "us-east-1"}

    def bucket(self, prefix: str = "b") -> str:
        """A new empty bucket."""
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                     aws_secret_access_key=self.secret, region_name="us-east-1"
                     ).create_bucket(Bucket=name)
        return name

    def _control(self, what: str, method: str = "GET", body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.endpoint}/_lakeckpt/{what}", data=data,
                                         method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            out: dict[str, Any] = json.loads(response.read())
            return out

    def requests(self) -> list[tuple[str, str, str]]:
        """Requests seen since the last :meth:`reset`: (method, path, range header)."""
        return [tuple(r) for r in self._control("requests")["requests"]]  # type: ignore[misc]

    def peak(self) -> int:
        """The most requests the server served at once since the last :meth:`reset`."""
        return int(self._control("requests")["peak"])

    def reset(self) -> None:
        self._control("requests", "DELETE")

    def faults(self, **faults: Any) -> None:
        """Set the front's faults (``down``, ``latency_ms``, ``lose``); none when empty."""
        self._control("faults", "PUT", faults)

    @contextmanager
    def down(self) -> Iterator[None]:
        """The server answers 503 to every request inside the block."""
        self.faults(down=True)
        try:
            yield
        finally:
            self.faults()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    server = S3Server("lakeckpt-test-key", "lakeckpt-test-secret-5f2c9a")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def shadow_s3() -> Iterator[S3Server]:
    server = S3Server("shadow-key", "shadow-secret")
    yield server
    server.stop()


@pytest.fixture
def shadow_env(shadow_s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The environment names the shadow server, with credentials it accepts: anything that
    falls back to ``AWS_*`` variables reaches it (and the test sees its request log)."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", shadow_s3.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", shadow_s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", shadow_s3.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", shadow_s3.secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    shadow_s3.reset()
    return shadow_s3
