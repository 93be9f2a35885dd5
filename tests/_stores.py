"""Fixtures for Azure Blob and GCS tests: real emulators on loopback behind the S3 server's front.

Azurite and fake-gcs-server run for the module that uses them (``python -m
lakeckpt_tables.tools.emulators azure|gcs``, :mod:`lakeckpt_tables.tools.emulators`); tests
reach them over HTTP exactly as the real stores, and drive the front (request log, outage, lost
responses, latency, a full store) as with :class:`~_s3server.S3Server`, whose interface they
share: ``options()``, ``bucket()``, ``uri()``, ``iceberg_properties()``, ``requests()``,
``reset()``, ``faults()``, ``down()``. The hostile environment (:func:`hostile_env`) names an
unreachable store with other credentials under every variable the clients read: anything that
falls back to it fails.

A missing emulator fails the test that needs it (``.ci/run`` installs both), never skips it.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from _s3server import S3Server

from lakeckpt_tables.tools.emulators import AZURITE_ACCOUNT, AZURITE_KEY, spawn

__all__ = ["AzureServer", "GcsServer", "hostile_env", "server_of"]


class _Emulated(S3Server):
    """An emulator behind the front: the control methods are :class:`S3Server`'s."""

    def __init__(self) -> None:  # no S3Server.__init__: another server
        self.proc, self.port = spawn(self.kind)
        self.endpoint = f"http://127.0.0.1:{self.port}"


class AzureServer(_Emulated):
    """Azurite's Blob service (account ``devstoreaccount1``)."""

    kind = "azure"
    scheme = "az"
    key = AZURITE_KEY
    secret = AZURITE_KEY

    def options(self, **extra: str) -> dict[str, str]:
        """delta-rs style options: account, key and the emulator's endpoint."""
        return {"azure_storage_account_name": AZURITE_ACCOUNT,
                "azure_storage_account_key": AZURITE_KEY,
                "azure_storage_endpoint": f"{self.endpoint}/{AZURITE_ACCOUNT}",
                "azure_allow_http": "true", **extra}

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};")

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties: adlfs through the library's FileIO (pyiceberg's
        default for abfs, pyarrow's C++ client, can abort the process: NOTE [ backing ])."""
        return {"py-io-impl": "lakeckpt_tables.io.iceberg_fileio.FileIO",
                "adls.connection-string": self.connection_string(),
                "adls.account-name": AZURITE_ACCOUNT}

    def warehouse(self, bucket: str, path: str) -> str:
        """An Iceberg location (pyiceberg knows abfs[s]://, not az://)."""
        return f"abfs://{bucket}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{path}"

    def bucket(self, prefix: str = "b") -> str:
        """A new empty container."""
        from azure.storage.blob import BlobServiceClient

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        BlobServiceClient.from_connection_string(self.connection_string()).create_container(
            name)
        return name

    def uri(self, bucket: str, path: str = "") -> str:
        return f"az://{bucket}/{path}".rstrip("/")


class GcsServer(_Emulated):
    """fake-gcs-server, with a service account key of its own (``disable_oauth``: JWTs
    signed locally, as object_store and google-auth do for emulators)."""

    kind = "gcs"
    scheme = "gs"

    def __init__(self) -> None:
        super().__init__()
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = private.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        self.key_info = {"type": "service_account", "project_id": "lakeckpt",
                         "private_key_id": "k1", "private_key": pem,
                         "client_email": "trainer@lakeckpt.iam.gserviceaccount.com",
                         "client_id": "1", "token_uri": f"{self.endpoint}/token",
                         "gcs_base_url": self.endpoint, "disable_oauth": True}
        self.key = self.secret = pem.splitlines()[5]  # a line of the private key: a secret

    def options(self, **extra: str) -> dict[str, str]:
        """delta-rs style options: the service account key, which names the endpoint."""
        return {"google_service_account_key": json.dumps(self.key_info), **extra}

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties: gcsfs through the library's FileIO (pyiceberg's own
        waits 60 s per bucket on an emulator), anonymous (pyarrow's GCS client, pyiceberg's
        default, has no anonymous mode pyiceberg can ask for)."""
        return {"py-io-impl": "lakeckpt_tables.io.iceberg_fileio.FileIO",
                "gcs.service.host": self.endpoint, "gcs.oauth2.token": "anon",
                "gcs.project-id": "lakeckpt"}

    def bucket(self, prefix: str = "b") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=lakeckpt", method="POST",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        return name

    def uri(self, bucket: str, path: str = "") -> str:
        return f"gs://{bucket}/{path}".rstrip("/")

    def warehouse(self, bucket: str, path: str) -> str:
        return self.uri(bucket, path)


def server_of(kind: str) -> S3Server:
    """A new running server of ``kind`` (azure, gcs)."""
    return AzureServer() if kind == "azure" else GcsServer()


@pytest.fixture(scope="module", params=["azure", "gcs"])
def store(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    """Each emulator in turn, started once for the module."""
    server = server_of(request.param)
    yield server
    server.stop()


_UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture
def hostile_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable the Azure and GCS clients read names an unreachable store and other
    credentials: a client that falls back to the environment fails."""
    for name in [n for n in os.environ if n.startswith(("AZURE_", "GOOGLE_", "GCS"))]:
        monkeypatch.delenv(name)
    hostile = {
        "AZURE_STORAGE_ACCOUNT_NAME": "shadowacct", "AZURE_STORAGE_ACCOUNT_KEY": "c2hhZG93",
        "AZURE_STORAGE_CONNECTION_STRING": f"AccountName=shadowacct;AccountKey=c2hhZG93;"
        f"BlobEndpoint={_UNREACHABLE}/shadowacct;",
        "AZURE_STORAGE_ENDPOINT": _UNREACHABLE, "AZURE_STORAGE_USE_EMULATOR": "true",
        "AZURITE_BLOB_STORAGE_URL": _UNREACHABLE, "AZURE_STORAGE_SAS_TOKEN": "sv=shadow",
        "STORAGE_EMULATOR_HOST": _UNREACHABLE, "GOOGLE_CLOUD_PROJECT": "shadow",
        "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/shadow-key.json",
    }
    for name, value in hostile.items():
        monkeypatch.setenv(name, value)
