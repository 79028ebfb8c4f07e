"""A fake Kubernetes API server for `status`'s client tests: a real HTTP server that speaks the few
endpoints the command uses (list pods by label selector, read a pod's log, read a namespace, list
JobSets, get a TrainJob) with the API's own JSON shapes and Status errors, and a kubeconfig for it."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


def _matches(labels: dict[str, str], selector: str) -> bool:
    """The label selector subset the command sends: `k=v` and `k in (a,b)` terms, comma separated."""
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if match := re.fullmatch(r"(\S+) in \((.*)\)", term):
            if labels.get(match[1]) not in match[2].split(","):
                return False
        else:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
    return True


@dataclass
class FakeCluster:
    """What the fake API server serves; tests change it between requests."""

    namespaces: set[str] = field(default_factory=lambda: {"default", "ml"})
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # namespace -> pods
    logs: dict[str, str] = field(default_factory=dict)  # pod name -> log text
    forbidden: set[str] = field(default_factory=set)  # "list pods", "get namespace", "get log", "list jobsets"
    requests: list[str] = field(default_factory=list)
    jobsets: dict[str, list[dict[str, Any]]] | None = None  # namespace -> JobSets; None: the API is not served
    trainjobs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # namespace -> TrainJobs


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest's output clean
            pass

        def _send(self, code: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
            self._send(code, json.dumps({**body, "reason": reason, "code": code}))

        def _forbid(self, verb: str, resource: str, namespace: str) -> None:
            self._status(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "alice" cannot {verb} resource "{resource}" in API group "" '
                f'in the namespace "{namespace}"',
            )

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            url = urlparse(self.path)
            query = parse_qs(url.query)
            cluster.requests.append(self.path)
            if match := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path):
                namespace = match[1]
                if "list pods" in cluster.forbidden:
                    return self._forbid("list", "pods", namespace)
                selector = query.get("labelSelector", [""])[0]
                items = [p for p in cluster.pods.get(namespace, []) if _matches(p["metadata"]["labels"], selector)]
                return self._send(200, json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}))
            if match := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", url.path):
                namespace, name = match[1], match[2]
                if "get log" in cluster.forbidden:
                    return self._forbid("get", "pods/log", namespace)
                if name not in cluster.logs:
                    return self._status(404, "NotFound", f'pods "{name}" not found')
                lines = cluster.logs[name].splitlines(keepends=True)
                tail = int(query.get("tailLines", ["0"])[0]) or len(lines)
                return self._send(200, "".join(lines[-tail:]), "text/plain")
            if match := re.fullmatch(r"/apis/jobset.x-k8s.io/v1alpha2/namespaces/([^/]+)/jobsets", url.path):
                if cluster.jobsets is None:  # what an API server without the JobSet CRD answers
                    return self._status(404, "NotFound", "the server could not find the requested resource")
                if "list jobsets" in cluster.forbidden:
                    return self._forbid("list", "jobsets", match[1])
                selector = query.get("labelSelector", [""])[0]
                items = [j for j in cluster.jobsets.get(match[1], []) if _matches(j["metadata"]["labels"], selector)]
                body = {"kind": "JobSetList", "apiVersion": "jobset.x-k8s.io/v1alpha2", "items": items}
                return self._send(200, json.dumps(body))
            if match := re.fullmatch(
                r"/apis/trainer.kubeflow.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)", url.path
            ):
                if "get trainjobs" in cluster.forbidden:
                    return self._forbid("get", "trainjobs", match[1])
                found = [j for j in cluster.trainjobs.get(match[1], []) if j["metadata"]["name"] == match[2]]
                if not found:  # also what an API server without Trainer's CRDs answers
                    return self._status(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{match[2]}" not found')
                return self._send(200, json.dumps(found[0]))
            if match := re.fullmatch(r"/api/v1/namespaces/([^/]+)", url.path):
                if "get namespace" in cluster.forbidden:
                    return self._forbid("get", "namespaces", match[1])
                if match[1] not in cluster.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{match[1]}" not found')
                body = {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": match[1]}}
                return self._send(200, json.dumps(body))
            return self._status(404, "NotFound", "the server could not find the requested resource")

    return Handler


@contextmanager
def serve() -> Iterator[tuple[FakeCluster, str]]:
    """A fake API server on a random loopback port: (its state, its URL)."""
    state = FakeCluster()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    # A short poll interval: shutdown() waits for one poll.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(path: Path, server: str, namespace: str | None = "ml") -> Path:
    context = {"cluster": "fake", "user": "alice", **({"namespace": namespace} if namespace else {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "alice", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "fake", "context": context}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path
