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

import json
import os
from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.errors import StorageOptionsError
from lakeckpt_tables.io.failures import RETRY_OPTION

__all__ = ["OPTIONS_ENV", "parse_storage_options", "s3_settings"]

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

# delta-rs / object_store option names -> the fsspec implementation's keyword (gcsfs, adlfs);
# fsspec keywords given as they are pass through.
_GCS_NAMES = {"google_service_account": "token", "google_service_account_path": "token",
              "service_account": "token", "service_account_path": "token",
              "google_application_credentials": "token", "google_service_account_key": "token",
              "service_account_key": "token", "google_project_id": "project"}
_AZURE_NAMES = {"azure_storage_account_name": "account_name",
                "azure_storage_account_key": "account_key",
                "azure_storage_access_key": "account_key", "access_key": "account_key",
                "azure_storage_sas_token": "sas_token",
                "azure_storage_sas_key": "sas_token", "azure_client_id": "client_id",
                "azure_storage_client_id": "client_id", "azure_client_secret": "client_secret",
                "azure_storage_client_secret": "client_secret", "azure_tenant_id": "tenant_id",
                "azure_storage_tenant_id": "tenant_id"}
_FSSPEC_NAMES = {"gs": _GCS_NAMES, "gcs": _GCS_NAMES, "abfs": _AZURE_NAMES,
                 "abfss": _AZURE_NAMES, "az": _AZURE_NAMES}
# fsspec keywords that take a bool: options are strings ("false" would be truthy)
_FSSPEC_BOOLS = frozenset({"anon", "requester_pays", "version_aware", "use_ssl"})

# pyiceberg FileIO properties of GCS and ADLS -> the gcsfs / adlfs keyword pyiceberg's own
# fsspec FileIO gives them (pyiceberg/io/fsspec.py, _gs and _adls)
_ICEBERG_GCS = {"gcs.project-id": "project", "gcs.oauth2.token": "token",
                "gcs.service.host": "endpoint_url", "gcs.access": "access",
                "gcs.requester-pays": "requester_pays", "gcs.version-aware": "version_aware"}
_ICEBERG_ADLS = {"adls.account-name": "account_name", "adls.account-key": "account_key",
                 "adls.sas-token": "sas_token", "adls.tenant-id": "tenant_id",
                 "adls.client-id": "client_id", "adls.client-secret": "client_secret",
                 "adls.connection-string": "connection_string",
                 "adls.account-host": "account_host", "adls.anon": "anon"}
_ICEBERG_NAMES = {"gs": _ICEBERG_GCS, "gcs": _ICEBERG_GCS, "abfs": _ICEBERG_ADLS,
                  "abfss": _ICEBERG_ADLS, "az": _ICEBERG_ADLS}


def _fsspec_names(options: Mapping[str, str], names: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = names.get(key.lower(), key)
        if name == "token" and value.lstrip().startswith("{"):
            out[name] = json.loads(value)  # a service account key given inline
        elif name in _FSSPEC_BOOLS and value.lower() in ("true", "false"):
            out[name] = value.lower() == "true"
        else:
            out[name] = value
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


def iceberg_properties(scheme: str, options: Mapping[str, str]) -> dict[str, str]:
    """The options as pyiceberg FileIO properties (``s3.*`` for S3; others as given)."""
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


def fsspec_kwargs(scheme: str, options: Mapping[str, str] | None) -> dict[str, Any]:
    """The options as fsspec keyword arguments (s3fs for S3, as given for other stores)."""
    if options is None:
        return {}
    options = without_own(options)
    if scheme in _FSSPEC_NAMES:
        return _fsspec_names(options, _FSSPEC_NAMES[scheme])
    if scheme not in ("s3", "s3a"):
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
                 retry_seconds: float) -> dict[str, str] | None:
    """The options for delta-rs, with every setting explicit (no environment fallback).

    A commit on S3 needs an atomic "create if absent": S3's conditional PUT is used unless
    the options choose another way (a locking provider, or unsafe renames). delta-rs's client
    retries for the same budget as the library (NOTE [ retry budget ]).
    """
    if options is None:
        return None
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


def secrets(scheme: str, options: Mapping[str, str] | None) -> list[str]:
    """The credential values among the options (to redact from any text)."""
    if not options:
        return []
    s3 = s3_settings(options) if scheme in ("s3", "s3a") else {}
    values = [s3[k] for k in _SECRET_SETTINGS if k in s3]
    values += [v for k, v in options.items()
               if any(w in k.lower() for w in ("secret", "token", "key", "password",
                                               "credential", "sas", "connection"))
               and not k.lower().endswith(("region", "endpoint"))]
    return [v for v in values if len(v) >= 4]


def iceberg_store_options(scheme: str, properties: Mapping[str, str]) -> dict[str, str] | None:
    """Storage options from an Iceberg table's FileIO properties: ``s3.*`` ones for S3, the
    gcsfs / adlfs keywords pyiceberg's fsspec FileIO gives ``gcs.*`` and ``adls.*`` ones
    (pyiceberg/io/fsspec.py, _gs and _adls); None when there are none."""
    if scheme in ("s3", "s3a"):
        s3 = {k: str(v) for k, v in properties.items() if k.startswith("s3.")}
        return s3 or None
    names = _ICEBERG_NAMES.get(scheme, {})
    given = {names[k]: str(v) for k, v in properties.items() if k in names}
    return given or None
