"""A stand-in for Kubeflow Trainer's status server: a real HTTPS server in a thread, with a CA and a server
certificate made for the test (the `openssl` command line), that records what reaches it.

Like pkg/statusserver/server.go (kubeflow/trainer v2.3.0): `POST <path>` only, the bearer token checked
(`Authorization` split on one space into exactly `Bearer` and the token), the JSON body parsed, 200 with
the body on success, a metav1.Status JSON with 403 or 422 otherwise.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pytest

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/vision/trainjobs/coco/status"
# What a server certificate needs to pass Python's default verification (the CA's keyUsage, the
# leaf's subjectAltName, key identifiers).
LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


class Authority(NamedTuple):  # a CA, and a server certificate it signed for localhost / 127.0.0.1
    ca: Path
    cert: Path
    key: Path


def make_authority(folder: Path, name: str) -> Authority:
    """A new CA and a server certificate (EC P-256, valid for a day) under `folder`."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the TLS tests make their certificates with the openssl command line, which is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    suffixes = (".ca.pem", ".ca.key", ".pem", ".key", ".csr", ".ext")
    ca, ca_key, cert, key, csr, ext = (folder / f"{name}{suffix}" for suffix in suffixes)
    ext.write_text(LEAF_EXTENSIONS)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_exts = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    steps = [
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", f"/CN={name} test CA", *ca_exts],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1"]
        + ["-extfile", ext],
    ]
    for args in steps:
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True, timeout=60)
    return Authority(ca, cert, key)


@dataclass
class Received:
    path: str
    authorization: str
    body: Any
    thread: str  # the server's handler thread (not the client's)
    at: float = field(default_factory=time.monotonic)


class StatusServer:
    """What reached the server, and what it accepts; `status_server()` runs one."""

    def __init__(self, authority: Authority, token: str, delay_s: float = 0.0) -> None:
        self.token = token  # the bearer token it accepts; a test may change it
        self.delay_s = delay_s  # seconds each answer waits (a slow server)
        self.received: list[Received] = []
        self.refused: list[Received] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(authority.cert, authority.key)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.url = f"https://localhost:{self._httpd.server_address[1]}{STATUS_PATH}"

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.received

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                got = Received(self.path, self.headers.get("Authorization", ""), body, threading.current_thread().name)
                time.sleep(server.delay_s)
                parts = got.authorization.split(" ")
                if self.path != STATUS_PATH or len(parts) != 2 or parts != ["Bearer", server.token]:
                    server.refused.append(got)
                    return self._answer(403, {"kind": "Status", "status": "Failure", "message": "Forbidden"})
                server.received.append(got)
                self._answer(200, body)

            def _answer(self, code: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        return Handler


@contextmanager
def status_server(authority: Authority, token: str, delay_s: float = 0.0) -> Iterator[StatusServer]:
    """`with status_server(authority, token="t") as server:` serves `server.url` until the block ends."""
    server = StatusServer(authority, token, delay_s)
    threading.Thread(target=server._httpd.serve_forever, name="status-server", daemon=True).start()
    try:
        yield server
    finally:
        server._httpd.shutdown()
        server._httpd.server_close()


class Blackhole:
    """A port that takes connections and never answers (a TLS handshake there hangs until the client's
    timeout): a status server that is down in the slowest way."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"https://localhost:{self._socket.getsockname()[1]}{STATUS_PATH}"

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()
