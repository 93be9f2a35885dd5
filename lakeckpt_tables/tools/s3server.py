"""A local S3 server for tests and benches: moto's server behind a counting, faulty front.

moto (the ``moto[server]`` dev dependency) serves the S3 API in memory. The front counts every
request (so a bench can report requests per row group read and a test can prove a server was
never contacted) and injects faults a real object store shows: an outage (503 to everything),
a lost response (the request lands, the client gets a dropped connection) and latency.
Run it as ``python -m lakeckpt_tables.tools.s3server --port N``; control it over HTTP under
``/_lakeckpt/`` (see :class:`Front`).

NOTE [ ranged reads ]
moto answers a ranged GET by copying the whole object out of its buffer under the object's
lock, then slicing: a 2 MB row group of a 70 MB file cost a 70 MB copy, and reads of one file
ran one at a time (measured: 124 row group reads of 4 files took 30 s, 1 s each at 4 in
flight). A real store serves a range in time of its length, concurrently. The front serves a
single-range GET itself, copying only the range (under the lock only for the seek and read);
everything else (errors, multi-range, versions) is still moto's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RAW_HEADERS", "S3_ANSWERS", "Front", "main", "serve", "spawn"]

_CONTROL = "/_lakeckpt/"
RAW_HEADERS = "lakeckpt.raw_headers"
"""The environ key of the request's headers as sent (WSGI's ``HTTP_*`` names lose ``_``)."""

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _s3_error(code: str, message: str) -> bytes:
    return (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>"
            f"{message}</Message></Error>").encode()


S3_ANSWERS = {
    "down": ("503 Service Unavailable", "application/xml",
             _s3_error("ServiceUnavailable", "injected outage")),
    "deny": ("403 Forbidden", "application/xml",
             _s3_error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not "
                       "exist in our records.")),
    "full": ("507 Insufficient Storage", "application/xml",  # MinIO's answer
             _s3_error("XMinioStorageFull", "Storage backend has reached its minimum free "
                       "drive threshold. Please delete a few objects to proceed.")),
}
"""The front's answer to a request under each fault (``down``, ``deny``, ``full``): status,
content type and body, as S3 (MinIO for a full store) gives them."""


class _Dropped(ConnectionResetError):
    """Raised to make the server close the connection without a response (werkzeug treats a
    ConnectionError as a dropped connection and writes nothing)."""


class Front:
    """WSGI middleware in front of moto.

    Control endpoints (JSON):
        ``GET /_lakeckpt/requests``: the requests seen, ``[[method, path, range], ...]``, and
        ``peak``, the most requests served at once, and ``spans``, each request's
        ``[start, end]`` in seconds since the log was last cleared (end: its response ready).
        ``DELETE /_lakeckpt/requests``: forget them (and the peak).
        ``PUT /_lakeckpt/faults``: ``{"down": bool, "deny": bool, "full": bool, "latency_ms":
        int, "lose": [{"method": "PUT", "path": regex, "times": n}]}``: ``down`` answers 503 to
        every request, ``deny`` refuses the credentials of every request, ``full`` answers
        every write (PUT, POST) as a full store does; a lost request reaches moto, its
        response is dropped.
    """

    def __init__(self, app: WsgiApp, *, ranged: Callable[..., Iterable[bytes] | None] | None
                 = None, answers: dict[str, tuple[str, str, bytes]] | None = None) -> None:
        self.app = app
        self._ranged = ranged  # serves a single-range GET itself (NOTE [ ranged reads ])
        self._answers = answers or S3_ANSWERS
        self.requests: list[tuple[str, str, str]] = []
        self.spans: list[list[float]] = []
        self._since = time.monotonic()
        self.faults: dict[str, Any] = {"down": False, "latency_ms": 0, "lose": []}
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_CONTROL):
            return self._control(environ, start, path[len(_CONTROL):])
        method = environ["REQUEST_METHOD"]
        with self._lock:
            self.requests.append((method, path, environ.get("HTTP_RANGE", "")))
            span = [time.monotonic() - self._since, -1.0]
            self.spans.append(span)
            faults = dict(self.faults)
            lose = self._take_lose(method, path)
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            return self._serve(environ, start, method, path, faults, lose)
        finally:
            with self._lock:
                self.active -= 1
                span[1] = time.monotonic() - self._since

    def _serve(self, environ: dict[str, Any], start: StartResponse, method: str, path: str,
               faults: dict[str, Any], lose: bool) -> Iterable[bytes]:
        if faults["latency_ms"]:
            time.sleep(faults["latency_ms"] / 1000)
        fault = ("down" if faults["down"] else "deny" if faults.get("deny")
                 else "full" if faults.get("full") and method in ("PUT", "POST") else None)
        if fault:
            status, kind, body = self._answers[fault]
            start(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
            return [body]
        if lose:
            result = self.app(environ, lambda *a, **k: None)
            for _ in result:  # the request lands: let moto finish it
                pass
            raise _Dropped(f"{method} {path}")
        if self._ranged is not None and method == "GET" and environ.get("HTTP_RANGE") \
                and not environ.get("QUERY_STRING"):
            ranged = self._ranged(path, environ["HTTP_RANGE"], start)
            if ranged is not None:
                return ranged
        return self.app(environ, start)

    def _take_lose(self, method: str, path: str) -> bool:
        for rule in self.faults["lose"]:
            if rule.get("times", 1) > 0 and rule.get("method", method) == method and \
                    re.search(rule.get("path", ""), path):
                rule["times"] = rule.get("times", 1) - 1
                return True
        return False

    def _control(self, environ: dict[str, Any], start: StartResponse,
                 what: str) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = json.loads(environ["wsgi.input"].read(length) or b"null") if length else None
        with self._lock:
            if what == "requests" and method == "DELETE":
                self.requests = []
                self.spans = []
                self._since = time.monotonic()
                self.peak = 0
            elif what == "faults" and method == "PUT":
                self.faults = {"down": False, "latency_ms": 0, "lose": [], **(body or {})}
            out = json.dumps({"requests": self.requests, "faults": self.faults,
                              "peak": self.peak, "spans": self.spans}).encode()
        start("200 OK", [("Content-Type", "application/json"),
                         ("Content-Length", str(len(out)))])
        return [out]


def _ranged_get(path: str, header: str, start: StartResponse) -> Iterable[bytes] | None:
    """A path-style GET of one byte range served from moto's store (NOTE [ ranged reads ]);
    None when moto should answer (no such object, a range it must judge)."""
    from moto.s3.models import FakeKey, s3_backends

    bucket, _, name = path.lstrip("/").partition("/")
    unit, _, spec = header.partition("=")
    first, dash, last = spec.partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec or not first.strip().isdigit() \
            or not (last.strip().isdigit() or not last.strip()):
        return None
    try:
        partition, account = s3_backends.bucket_accounts[bucket]
        key = s3_backends[account][partition].get_object(bucket, name)
    except Exception:  # moto's own answer (an error) is wanted then
        return None
    if not isinstance(key, FakeKey):  # a multipart upload's key holds its whole value too
        return None
    begin = int(first)
    end = min(int(last), key.size - 1) if last.strip() else key.size - 1
    if begin > end:
        return None
    with key.lock:
        key._value_buffer.seek(begin)
        body = key._value_buffer.read(end - begin + 1)
    start("206 Partial Content", [
        ("Content-Type", key.metadata.get("Content-Type", "binary/octet-stream")),
        ("Content-Length", str(len(body))), ("Content-Range", f"bytes {begin}-{end}/{key.size}"),
        ("Accept-Ranges", "bytes"), ("ETag", key.etag),
        ("Last-Modified", key.last_modified_RFC1123)])
    return [body]


def spawn() -> tuple[subprocess.Popen[str], int]:
    """Start this server in a process of its own on a free port of 127.0.0.1.

    Returns:
        The process (kill it to stop the server) and the port it listens on.

    Raises:
        RuntimeError: the server did not start (``moto[server]`` missing, say).
    """
    proc = subprocess.Popen([sys.executable, "-m", __name__, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"the local S3 server did not start: {line!r}")
    return proc, int(line.split()[1])


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; prints ``ready <port>`` once listening."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    front = Front(DomainDispatcherApplication(create_backend_app), ranged=_ranged_get)
    serve(front, args.host, args.port, MotoRequestHandler)


def serve(front: Front, host: str, port: int, handler: type | None = None) -> None:
    """Serve ``front`` on ``host:port`` (threaded) until killed; prints ``ready <port>``."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class Handler(handler or WSGIRequestHandler):  # type: ignore[misc]
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

        def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
            self.close_connection = True

        def run_wsgi(self) -> None:
            # no interim "100 Continue": Azure's C++ client (pyarrow's) takes it for the answer
            del self.headers["Expect"]
            super().run_wsgi()

        def make_environ(self) -> dict[str, Any]:
            environ: dict[str, Any] = super().make_environ()
            environ[RAW_HEADERS] = list(self.headers.items())  # names as sent ('_' kept)
            return environ

    server = make_server(host, port, front, threaded=True, request_handler=Handler)
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
