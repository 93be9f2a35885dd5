"""Storage options: what a user hands the library, turned into each client's settings.

NOTE [ storage options ]
Options are what the user hands a source, a ``CheckpointManager`` or the command line
(``--storage-options``): delta-rs / object_store keys (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ... in any case) or pyiceberg FileIO keys (``s3.access-key-id``,
``s3.endpoint``, ...), plus the library's own ``lakeckpt_retry_seconds`` (NOTE [ retry budget ]
in :mod:`lakeckpt_tables.io.failures`). When options are given they are the whole
configuration: every client is built from them explicitly, a missing endpoint becomes AWS's
regional one and missing credentials mean anonymous access, so an ``AWS_*`` variable of the
environment (another account, another endpoint) is never read. Without options (None) the
store is configured the usual way, from the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from lakeckpt_tables.errors import StorageOptionsError
from lakeckpt_tables.io.failures import RETRY_OPTION

__all__ = ["OPTIONS_ENV", "azure_settings", "gcs_settings", "parse_storage_options",
           "s3_settings"]

OPTIONS_ENV = "LAKECKPT_STORAGE_OPTIONS"
"""The environment variable :func:`parse_storage_options` reads when no text is given."""

# canonical S3 setting -> the option names that give it (lower-cased)
_S3_KEYS: dict[str, tuple[str, ...]] = {
    "key": ("aws_access_key_id", "access_key_id", "s3.access-key-id", "key"),
    "secret": ("aws_secret_access_key", "secret_access_key", "s3.secret-access-key", "secret"),
    "token": ("aws_session_token", "session_token", "aws_token", "token", "s3.session-token"),
    "region": ("aws_region", "region", "aws_default_region", "s3.region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint",
                 "aws_endpoint_url_s3", "s3.endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "connect_timeout": ("connect_timeout", "s3.connect-timeout"),
    "request_timeout": ("request_timeout", "timeout", "s3.request-timeout"),
    "max_attempts": ("max_attempts", "max_retries", "s3.max-attempts"),
}
_SECRET_SETTINGS = ("key", "secret", "token")

# canonical Azure setting -> the option names that give it (lower-cased): delta-rs /
# object_store, adlfs (fsspec) and pyiceberg FileIO (adls.*) names
_AZURE_KEYS: dict[str, tuple[str, ...]] = {
    "account": ("azure_storage_account_name", "azure_account_name", "account_name",
                "adls.account-name"),
    "key": ("azure_storage_account_key", "azure_storage_access_key", "azure_storage_master_key",
            "azure_account_key", "access_key", "account_key", "master_key", "adls.account-key"),
    "sas": ("azure_storage_sas_token", "azure_storage_sas_key", "sas_token", "sas_key",
            "adls.sas-token"),
    "token": ("azure_storage_token", "bearer_token", "adls.token"),
    "client_id": ("azure_storage_client_id", "azure_client_id", "client_id", "adls.client-id"),
    "client_secret": ("azure_storage_client_secret", "azure_client_secret", "client_secret",
                      "adls.client-secret"),
    "tenant_id": ("azure_storage_tenant_id", "azure_tenant_id", "tenant_id",
                  "azure_storage_authority_id", "azure_authority_id", "authority_id",
                  "adls.tenant-id"),
    "endpoint": ("azure_storage_endpoint", "azure_endpoint", "endpoint", "endpoint_url",
                 "account_url"),
    "account_host": ("account_host", "adls.account-host"),
    "blob_authority": ("adls.blob-storage-authority",),
    "blob_scheme": ("adls.blob-storage-scheme",),
    "allow_http": ("azure_allow_http", "allow_http"),
    "connection_string": ("azure_storage_connection_string", "connection_string",
                          "adls.connection-string"),
    "anon": ("azure_skip_signature", "skip_signature", "anon", "adls.anon"),
    "emulator": ("azure_storage_use_emulator", "azure_use_emulator", "use_emulator"),
}
_AZURE_SECRETS = ("key", "sas", "token", "client_secret", "connection_string")
_EMULATOR_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                 "KBHBeksoGMGw==")  # Azurite's well-known development key, as object_store's

# canonical GCS setting -> option names: delta-rs / object_store, gcsfs and pyiceberg (gcs.*)
_GCS_KEYS: dict[str, tuple[str, ...]] = {
    "key": ("google_service_account_key", "service_account_key"),
    "key_path": ("google_service_account", "google_service_account_path", "service_account",
                 "service_account_path", "google_application_credentials"),
    "token": ("token", "gcs.oauth2.token", "google_bearer_token"),
    "endpoint": ("google_base_url", "gcs_base_url", "endpoint_url", "endpoint",
                 "gcs.service.host"),
    "project": ("google_project_id", "project", "project_id", "gcs.project-id"),
    "anon": ("google_skip_signature", "skip_signature", "anon"),
    "requester_pays": ("requester_pays", "gcs.requester-pays"),
}
_GCS_SECRETS = ("key", "token")
GCS_DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"

AZURE_SCHEMES = ("az", "abfs", "abfss", "adl", "azure")
GCS_SCHEMES = ("gs", "gcs")
S3_SCHEMES = ("s3", "s3a")


def _canonical(options: Mapping[str, str], keys: Mapping[str, tuple[str, ...]]
               ) -> dict[str, str]:
    lowered = {k.lower(): str(v) for k, v in options.items()}
    out: dict[str, str] = {}
    for name, aliases in keys.items():
        for alias in aliases:
            if alias in lowered:
                out[name] = lowered[alias]
                break
    return out


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


def _connection_fields(text: str) -> dict[str, str]:
    fields = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields


def azure_settings(options: Mapping[str, str], uri: str = "") -> dict[str, str]:
    """The Azure settings in ``options`` under canonical names, every one resolved: the
    account (from the options, a connection string, or the host of an
    ``abfs[s]://container@account.dfs.core.windows.net`` URI), the Blob endpoint (given,
    from a connection string, Azurite's when ``azure_storage_use_emulator``, else
    ``https://<account>.blob.core.windows.net``), and the credentials given (none: anonymous).
    """
    out = _canonical(options, _AZURE_KEYS)
    if "connection_string" in out:
        fields = _connection_fields(out["connection_string"])
        for name, field in (("account", "accountname"), ("key", "accountkey"),
                            ("sas", "sharedaccesssignature"), ("endpoint", "blobendpoint")):
            if field in fields:
                out.setdefault(name, fields[field])
    host = urlparse(uri).netloc
    if "@" in host:
        out.setdefault("account", host.split("@", 1)[1].split(".", 1)[0])
    if _true(out.get("emulator")):
        out.setdefault("account", "devstoreaccount1")
        out.setdefault("endpoint", f"http://127.0.0.1:10000/{out['account']}")
        if not out.keys() & {"sas", "token", "client_secret", "anon"}:
            out.setdefault("key", _EMULATOR_KEY)
    if "endpoint" not in out and "blob_authority" in out:  # pyiceberg's pyarrow FileIO's
        authority = out["blob_authority"]
        out["endpoint"] = f"{out.get('blob_scheme', 'https')}://{authority}"
        if authority.startswith(("127.", "localhost")) and "account" in out:
            out["endpoint"] += f"/{out['account']}"  # an emulator: the account in the path
    if "endpoint" not in out:
        if "account" not in out:
            raise StorageOptionsError(
                "Azure storage options name no account: give azure_storage_account_name (or "
                "a URI abfss://container@ACCOUNT.dfs.core.windows.net/path)")
        host_name = out.get("account_host") or f"{out['account']}.blob.core.windows.net"
        out["endpoint"] = host_name if "://" in host_name else f"https://{host_name}"
    if "://" not in out["endpoint"]:
        scheme = "http" if _true(out.get("allow_http")) else "https"
        out["endpoint"] = f"{scheme}://{out['endpoint']}"
    out["endpoint"] = out["endpoint"].rstrip("/")
    out.setdefault("account", urlparse(out["endpoint"]).netloc.split(".", 1)[0])
    if out["endpoint"].startswith("http://"):
        out["allow_http"] = "true"
    return out


def gcs_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The GCS settings in ``options`` under canonical names; the endpoint resolved (given,
    the ``gcs_base_url`` of a service account key, else Google's)."""
    out = _canonical(options, _GCS_KEYS)
    if "key" in out:  # the key's own endpoint (an emulator's) and project
        try:
            info = json.loads(out["key"])
        except ValueError:
            info = None
        if isinstance(info, dict):
            if info.get("gcs_base_url"):
                out.setdefault("endpoint", str(info["gcs_base_url"]))
            if info.get("project_id"):
                out.setdefault("project", str(info["project_id"]))
    endpoint = out.get("endpoint", GCS_DEFAULT_ENDPOINT).rstrip("/")
    out["endpoint"] = endpoint if "://" in endpoint else f"https://{endpoint}"
    return out


def _azure_connection_string(az: Mapping[str, str]) -> str:
    """A connection string holding every Azure setting adlfs needs: given to adlfs, it wins
    over any ``AZURE_STORAGE_*`` variable of the environment."""
    scheme = urlparse(az["endpoint"]).scheme
    parts = [f"DefaultEndpointsProtocol={scheme}", f"AccountName={az['account']}"]
    if "key" in az:
        parts.append(f"AccountKey={az['key']}")
    elif "sas" in az:
        parts.append(f"SharedAccessSignature={az['sas'].lstrip('?')}")
    parts.append(f"BlobEndpoint={az['endpoint']}")
    return ";".join(parts) + ";"


def _adlfs_kwargs(az: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"account_name": az["account"]}
    if "client_secret" in az or "token" in az:
        # a credential object: adlfs takes no endpoint with it but a host
        out.update(account_host=urlparse(az["endpoint"]).netloc)
        if "token" in az:
            out["credential"] = _StaticToken(az["token"])
        else:
            out.update(client_id=az.get("client_id"), client_secret=az["client_secret"],
                       tenant_id=az.get("tenant_id"))
        return out
    out["connection_string"] = _azure_connection_string(az)
    if not az.keys() & {"key", "sas"}:
        out["anon"] = True
    return out


class _StaticToken:
    """An Azure bearer token given as an option, as the async credential adlfs takes."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __repr__(self) -> str:
        return "_StaticToken(***)"

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        import time

        from azure.core.credentials import AccessToken

        return AccessToken(self._token, int(time.time()) + 3600)

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> _StaticToken:
        return self

    async def __aexit__(self, *args: Any) -> None:
        pass


def gcs_credentials(gcs: Mapping[str, str]) -> Any:
    """What gcsfs takes as ``token`` for the settings: google-auth credentials built from a
    service account key (inline or a file; a key with ``disable_oauth``, as object_store
    reads it for emulators, signs its own JWTs instead of asking Google for a token), a raw
    OAuth2 token, or ``"anon"``.

    Raises:
        StorageOptionsError: the key cannot be read or is no credentials file (its text is
            never repeated).
    """
    if _true(gcs.get("anon")):
        return "anon"
    if "key" not in gcs and "key_path" not in gcs:
        return gcs.get("token", "anon")
    name = "google_service_account_key" if "key" in gcs else "google_service_account_path"
    try:
        if "key" in gcs:
            info = json.loads(gcs["key"])
        else:
            with open(os.path.expanduser(gcs["key_path"]), encoding="utf-8") as handle:
                info = json.load(handle)
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        if info.get("type") == "authorized_user":
            from google.oauth2.credentials import Credentials

            return Credentials.from_authorized_user_info(  # type: ignore[no-untyped-call]
                info, scopes=[_GCS_SCOPE])
        from google.oauth2 import service_account

        credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=[_GCS_SCOPE])
        if _true(str(info.get("disable_oauth", ""))):
            credentials = credentials.with_always_use_jwt_access(True)
        return credentials
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
            f"missing field {exc}" if isinstance(exc, KeyError) else type(exc).__name__)
        raise StorageOptionsError(
            f"storage option {name} is not a usable service account key ({what}): give the "
            "JSON key file of a service account (type, client_email, private_key, token_uri)"
            ) from None


def gcsfs_kwargs(gcs: Mapping[str, str]) -> dict[str, Any]:
    """gcsfs keyword arguments for the settings, every one explicit: the endpoint (so
    ``STORAGE_EMULATOR_HOST`` is never read) and the credentials (anonymous when none)."""
    out: dict[str, Any] = {"endpoint_url": gcs["endpoint"], "token": gcs_credentials(gcs),
                           "project": gcs.get("project", "")}
    if "requester_pays" in gcs:
        out["requester_pays"] = _true(gcs["requester_pays"])
    if not isinstance(out["token"], str):
        out["skip_instance_cache"] = True  # credentials objects do not tokenize
    return out


def s3_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The S3 settings in ``options`` under canonical names (key, secret, token, region,
    endpoint, allow_http, connect_timeout, request_timeout, max_attempts)."""
    lowered = {k.lower(): str(v) for k, v in options.items()}
    out: dict[str, str] = {}
    for name, aliases in _S3_KEYS.items():
        for alias in aliases:
            if alias in lowered:
                out[name] = lowered[alias]
                break
    region = out.setdefault("region", "us-east-1")
    out.setdefault("endpoint", f"https://s3.{region}.amazonaws.com")
    if "://" not in out["endpoint"]:
        scheme = "http" if out.get("allow_http", "").lower() == "true" else "https"
        out["endpoint"] = f"{scheme}://{out['endpoint']}"
    return out


def parse_storage_options(text: str | None = None) -> dict[str, str] | None:
    """Storage options from the command line: a JSON object, or ``@path`` of a file holding
    one; with no text, the :data:`OPTIONS_ENV` variable (the same forms); None when neither.

    Values are kept as strings (JSON numbers and booleans become their JSON text).

    Raises:
        StorageOptionsError: the text is not a JSON object of scalars, or the file cannot be
            read (the message never repeats a value: options hold credentials).
    """
    where = "--storage-options"
    if text is None:
        text = os.environ.get(OPTIONS_ENV)
        where = f"${OPTIONS_ENV}"
        if text is None or not text.strip():
            return None
    text = text.strip()
    if text.startswith("@"):
        path = os.path.expanduser(text[1:])
        where = f"{where} file {path}"
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise StorageOptionsError(
                f"{where} cannot be read ({exc.strerror or type(exc).__name__}): give "
                "@path of a readable JSON file") from None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        at = (f" at line {exc.lineno}, column {exc.colno}"
              if isinstance(exc, json.JSONDecodeError) else "")
        raise StorageOptionsError(f"{where} is not valid JSON{at}: give a JSON object or "
                                  "@path of a file holding one") from None
    if not isinstance(parsed, dict):
        raise StorageOptionsError(f"{where} must be a JSON object of option names to values, "
                                  f'e.g. {{"AWS_ENDPOINT_URL": "http://host:9000"}}')
    out: dict[str, str] = {}
    for key, value in parsed.items():
        if isinstance(value, dict | list) or value is None:
            raise StorageOptionsError(f"{where}: option {key!r} must be a string, number or "
                                      "boolean")
        out[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return out


def without_own(options: Mapping[str, str]) -> dict[str, str]:
    """The options minus the library's own (which no client knows)."""
    return {k: v for k, v in options.items() if k.lower() != RETRY_OPTION}


def iceberg_properties(scheme: str, options: Mapping[str, str], uri: str = ""
                       ) -> dict[str, str]:
    """The options as pyiceberg FileIO properties: ``s3.*``, ``adls.*`` or ``gcs.*``, every
    setting explicit; others as given."""
    if scheme in AZURE_SCHEMES:
        az = azure_settings(without_own(options), uri)
        endpoint = urlparse(az["endpoint"])
        # pyiceberg's fsspec FileIO (adlfs, as model files): its default for abfs, pyarrow's
        # C++ Azure client, aborts the process on an answer it cannot parse (filesystems.py)
        props = {"py-io-impl": "lakeckpt_tables.io.iceberg_fileio.FileIO",
                 "adls.account-name": az["account"],
                 "adls.connection-string": _azure_connection_string(az),  # fsspec FileIO
                 "adls.blob-storage-authority": endpoint.netloc,  # pyarrow FileIO
                 "adls.blob-storage-scheme": endpoint.scheme,
                 "adls.dfs-storage-authority": endpoint.netloc.replace(".blob.", ".dfs.", 1),
                 "adls.dfs-storage-scheme": endpoint.scheme}
        for name, prop in (("key", "adls.account-key"), ("sas", "adls.sas-token"),
                           ("client_id", "adls.client-id"), ("tenant_id", "adls.tenant-id"),
                           ("client_secret", "adls.client-secret")):
            if name in az:
                props[prop] = az[name]
        if not az.keys() & {"key", "sas", "client_secret"}:
            props["adls.anon"] = "true"
        return props
    if scheme in GCS_SCHEMES:
        gcs = gcs_settings(without_own(options))
        token = gcs_credentials(gcs)
        if not isinstance(token, str):  # pyiceberg takes a key's path or a raw token only
            if "key_path" in gcs:
                token = gcs["key_path"]
            elif _true(str(json.loads(gcs["key"]).get("disable_oauth", ""))):
                token = "anon"  # an emulator's key: nothing is checked
            else:
                raise StorageOptionsError(
                    "an Iceberg table on gs:// takes the service account key as a file: give "
                    "google_service_account_path (pyiceberg's gcs.oauth2.token takes a path or "
                    "an OAuth2 token, not the key's text)")
        # gcsfs (pyiceberg's fsspec FileIO) reads a key file; pyarrow's GCS client cannot
        return {"py-io-impl": "lakeckpt_tables.io.iceberg_fileio.FileIO",
                "gcs.service.host": gcs["endpoint"], "gcs.project-id": gcs.get("project", ""),
                "gcs.oauth2.token": token}
    if scheme not in ("s3", "s3a"):
        return without_own(options)
    s3 = s3_settings(options)
    out = {"s3.endpoint": s3["endpoint"], "s3.region": s3["region"]}
    for name, prop in (("key", "s3.access-key-id"), ("secret", "s3.secret-access-key"),
                       ("token", "s3.session-token")):
        if name in s3:
            out[prop] = s3[name]
    if "key" not in s3:
        out["s3.anonymous"] = "true"
    return out


def fsspec_kwargs(scheme: str, options: Mapping[str, str] | None, uri: str = ""
                  ) -> dict[str, Any]:
    """The options as fsspec keyword arguments: s3fs for S3, adlfs for Azure, gcsfs for GCS,
    every setting explicit (NOTE [ storage options ]); as given for other stores."""
    if options is None:
        return {}
    options = without_own(options)
    if scheme in AZURE_SCHEMES:
        return _adlfs_kwargs(azure_settings(options, uri))
    if scheme in GCS_SCHEMES:
        return gcsfs_kwargs(gcs_settings(options))
    if scheme not in S3_SCHEMES:
        return dict(options)
    s3 = s3_settings(options)
    config: dict[str, Any] = {"connect_timeout": float(s3.get("connect_timeout", 5)),
                              "read_timeout": float(s3.get("request_timeout", 30))}
    if "max_attempts" in s3:
        config["retries"] = {"max_attempts": int(s3["max_attempts"]), "mode": "standard"}
    out: dict[str, Any] = {"endpoint_url": s3["endpoint"], "config_kwargs": config,
                           "client_kwargs": {"region_name": s3["region"]}}
    if "key" in s3:
        out.update(key=s3["key"], secret=s3.get("secret"), token=s3.get("token"))
    else:
        out["anon"] = True
    return out


def delta_kwargs(scheme: str, options: Mapping[str, str] | None,
                 retry_seconds: float, uri: str = "") -> dict[str, str] | None:
    """The options for delta-rs, with every setting explicit (no environment fallback).

    A commit on S3 needs an atomic "create if absent": S3's conditional PUT is used unless
    the options choose another way (a locking provider, or unsafe renames). delta-rs's client
    retries for the same budget as the library (NOTE [ retry budget ]).
    """
    if options is None:
        return None
    if scheme in AZURE_SCHEMES:
        return _delta_azure(azure_settings(without_own(options), uri), options, retry_seconds)
    if scheme in GCS_SCHEMES:
        return _delta_gcs(gcs_settings(without_own(options)), options, retry_seconds)
    if scheme not in ("s3", "s3a"):
        return without_own(options)
    s3 = s3_settings(options)
    aliases = {a for names in _S3_KEYS.values() for a in names} | {RETRY_OPTION}
    out = {k: v for k, v in options.items() if k.lower() not in aliases}
    # delta-rs prefers an AWS_ENDPOINT_URL_S3 of the environment to AWS_ENDPOINT_URL
    out.update(AWS_REGION=s3["region"], AWS_ENDPOINT_URL=s3["endpoint"],
               AWS_ENDPOINT_URL_S3=s3["endpoint"])
    if s3["endpoint"].startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    if "key" in s3:
        out.update(AWS_ACCESS_KEY_ID=s3["key"], AWS_SECRET_ACCESS_KEY=s3.get("secret", ""))
        if "token" in s3:
            out["AWS_SESSION_TOKEN"] = s3["token"]
    else:
        out["AWS_SKIP_SIGNATURE"] = "true"
    lowered = {k.lower() for k in out}
    if not lowered & {"aws_s3_locking_provider", "aws_s3_allow_unsafe_rename",
                      "conditional_put", "aws_conditional_put"}:
        out["conditional_put"] = "etag"
    if "retry_timeout" not in lowered:
        out["retry_timeout"] = f"{max(retry_seconds, 0.001):g}s"
    for name, key in (("connect_timeout", "connect_timeout"), ("request_timeout", "timeout")):
        if name in s3 and key not in lowered:  # a stalled request fails (and is retried)
            out[key] = f"{float(s3[name]):g}s"
    return out


def _others(options: Mapping[str, str], keys: Mapping[str, tuple[str, ...]]
            ) -> dict[str, str]:
    """The options no canonical setting of ``keys`` names (client settings passed on)."""
    aliases = {a for names in keys.values() for a in names} | {RETRY_OPTION}
    return {k: v for k, v in options.items() if k.lower() not in aliases
            and not k.lower().startswith(("adls.", "gcs."))}


def _with_retry(out: dict[str, str], retry_seconds: float) -> dict[str, str]:
    if "retry_timeout" not in {k.lower() for k in out}:
        out["retry_timeout"] = f"{max(retry_seconds, 0.001):g}s"
    return out


def _delta_azure(az: Mapping[str, str], options: Mapping[str, str], retry_seconds: float
                 ) -> dict[str, str]:
    """delta-rs's Azure options: account, endpoint and credentials explicit (an
    ``AZURE_STORAGE_*`` variable of the environment would fill any key left out)."""
    out = _others(options, _AZURE_KEYS)
    out.update(azure_storage_account_name=az["account"], azure_storage_endpoint=az["endpoint"],
               azure_storage_use_emulator="false")
    if az.get("allow_http") == "true":
        out["azure_allow_http"] = "true"
    if "key" in az:
        out["azure_storage_account_key"] = az["key"]
    elif "sas" in az:
        out["azure_storage_sas_key"] = az["sas"]
    elif "token" in az:
        out["azure_storage_token"] = az["token"]
    elif "client_secret" in az:
        out.update(azure_storage_client_id=az.get("client_id", ""),
                   azure_storage_client_secret=az["client_secret"],
                   azure_storage_tenant_id=az.get("tenant_id", ""))
    else:
        out["azure_skip_signature"] = "true"
    return _with_retry(out, retry_seconds)


def _delta_gcs(gcs: Mapping[str, str], options: Mapping[str, str], retry_seconds: float
               ) -> dict[str, str]:
    """delta-rs's GCS options: the endpoint and the credentials explicit."""
    out = _others(options, _GCS_KEYS)
    out["google_base_url"] = gcs["endpoint"]
    # delta-rs fills a key the options leave out from GOOGLE_* variables: a key path there
    # beside a key here (or the reverse) fails every request, so say which variable
    given = "key" if "key" in gcs else "key_path" if "key_path" in gcs else None
    clashing = {"key": ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"),
                "key_path": ("GOOGLE_SERVICE_ACCOUNT_KEY",)}.get(given or "", ())
    found = [name for name in clashing if os.environ.get(name)]
    if found:
        raise StorageOptionsError(
            f"the environment variable {found[0]} names other GCS credentials than the storage "
            "options, and delta-rs reads it even when options are given (its requests would "
            f"fail): unset {found[0]} for this process")
    if "key" in gcs:
        out["google_service_account_key"] = gcs["key"]
    elif "key_path" in gcs:
        out["google_service_account"] = gcs["key_path"]
    elif "token" in gcs and not _true(gcs.get("anon")):
        raise StorageOptionsError(
            "delta-rs reads GCS with a service account key, not an OAuth2 token: give "
            "google_service_account_key or google_service_account_path for a Delta table or "
            "ledger on gs://")
    else:
        out["google_skip_signature"] = "true"
    return _with_retry(out, retry_seconds)


def secrets(scheme: str, options: Mapping[str, str] | None) -> list[str]:
    """The credential values among the options (to redact from any text)."""
    if not options:
        return []
    values: list[str] = []
    if scheme in S3_SCHEMES:
        s3 = s3_settings(options)
        values += [s3[k] for k in _SECRET_SETTINGS if k in s3]
    elif scheme in AZURE_SCHEMES:
        az = _canonical(options, _AZURE_KEYS)
        values += [az[k] for k in _AZURE_SECRETS if k in az]
        if "connection_string" in az:
            fields = _connection_fields(az["connection_string"])
            values += [fields[f] for f in ("accountkey", "sharedaccesssignature")
                       if f in fields]
    elif scheme in GCS_SCHEMES:
        gcs = _canonical(options, _GCS_KEYS)
        values += [gcs[k] for k in _GCS_SECRETS if k in gcs]
        with contextlib.suppress(ValueError, AttributeError):
            values.append(str(json.loads(gcs.get("key", "")).get("private_key", "")))
    values += [v for k, v in options.items()
               if any(w in k.lower() for w in ("secret", "token", "key", "password",
                                               "credential", "sas", "connection"))
               and not k.lower().endswith(("region", "endpoint"))]
    return [v for v in values if len(v) >= 4]


def iceberg_store_options(scheme: str, properties: Mapping[str, str]) -> dict[str, str] | None:
    """Storage options from an Iceberg table's FileIO properties: its ``s3.*``, ``adls.*`` or
    ``gcs.*`` ones (each store's settings read those names); None when there are none."""
    prefix = ("s3." if scheme in S3_SCHEMES else "adls." if scheme in AZURE_SCHEMES
              else "gcs." if scheme in GCS_SCHEMES else None)
    if prefix is None:
        return None
    given = {k: str(v) for k, v in properties.items() if k.startswith(prefix)}
    return given or None
