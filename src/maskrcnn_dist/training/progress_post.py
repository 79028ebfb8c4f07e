"""Training progress, its ETA and the newest AP into the TrainJob's status (Kubeflow Trainer v2.2+).

Under Kubeflow Trainer with the TrainJobStatus feature gate, every trainer container gets three variables
(kubeflow/trainer v2.3.0 docs/user-guides/trainjob-progress.md; set by
pkg/runtime/framework/plugins/trainjobstatus):

- KUBEFLOW_TRAINER_SERVER_URL: an HTTPS endpoint, `.../apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/
  trainjobs/<name>/status`, to POST `{"trainerStatus": {...}}` to (pkg/statusserver/server.go: `POST`
  only, 200 with the parsed payload, a metav1.Status JSON on errors);
- KUBEFLOW_TRAINER_SERVER_CA_CERT: the *path* of the PEM CA the endpoint's certificate is signed by;
- KUBEFLOW_TRAINER_SERVER_TOKEN: the *path* of a projected service-account token (a JWT the kubelet rotates),
  sent as `Authorization: Bearer <token>` (the server splits the header on one space: no newline).

`trainerStatus` is the TrainJob CRD's `status.trainerStatus` (schemas/trainer.kubeflow.org_trainjobs-v2.3.0.yaml):
progressPercentage (int 0..100), estimatedRemainingSeconds (int >= 0), metrics (at most 256 of
`{"name", "value"}`, both strings of 1..64 characters) and lastUpdatedTime (RFC 3339, required).

The process that writes metrics (rank 0) posts: progress from the planned steps, the ETA from the step
rate it measured itself, loss, lr, images/s and the newest bbox_AP/segm_AP. At most once every
`PERIOD_S` and once at the end, over TLS with the given CA, reading the token file for every request.
Training never waits for it: the training thread hands the newest status to a daemon thread (a queue of
one, the newest wins) and goes on; only `close()` waits for the final post, a bounded time. A failure
to post is one warning, then at most one every `WARN_EVERY_S`. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import queue
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from maskrcnn_launcher.contract import TRAINER_SERVER_URL, TRAINER_SERVER_VARS

log = logging.getLogger(__name__)

PERIOD_S = 5.0  # at most one post per period (the controller's guidance), and one at the end
TIMEOUT_S = 5.0  # one request: connect, TLS, send, answer
WARN_EVERY_S = 300.0  # after the first failure's warning, at most one warning per this many seconds
# The metrics records' keys that go into trainerStatus.metrics, by record kind (metrics.py writes them).
METRIC_KEYS = {"train": ("loss", "lr", "images_per_s"), "eval": ("bbox_AP", "segm_AP")}
_INT32_MAX = 2**31 - 1


class PostError(Exception):
    """The endpoint answered, but not with a 2xx."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    ca_file: str
    token_file: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint | None:
        """The endpoint when all three variables are set; None when none is. One warning when only some are."""
        values = [env.get(name) or "" for name in TRAINER_SERVER_VARS]  # URL, CA path, token path
        if all(values):
            return cls(*values)
        if any(values):
            missing = [name for name, value in zip(TRAINER_SERVER_VARS, values, strict=True) if not value]
            log.warning("progress: %s not set: the TrainJob's status is not updated", ", ".join(missing))
        return None


def send_status(endpoint: Endpoint, body: dict[str, Any], timeout: float = TIMEOUT_S) -> None:
    """POST `body` to the endpoint over TLS verified against its CA, with the token as read now."""
    with open(endpoint.token_file, encoding="utf-8") as f:
        token = f.read().strip()
    context = ssl.create_default_context(cafile=endpoint.ca_file)
    url = urlsplit(endpoint.url)
    if url.scheme != "https" or not url.hostname:
        raise PostError(f"{TRAINER_SERVER_URL}={endpoint.url!r} is not an https:// URL")
    connection = http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=timeout, context=context)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        connection.request("POST", url.path or "/", json.dumps(body).encode(), headers)
        response = connection.getresponse()
        answer = response.read(4096)
        if not 200 <= response.status < 300:
            raise PostError(f"HTTP {response.status} {response.reason}: {_message(answer)}")
    finally:
        connection.close()


class StatusTracker:
    """What trainerStatus says, from the metrics records. `clock` is monotonic seconds (the step rate's)."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = max(1, total_steps)
        self.step = 0
        self.metrics: dict[str, float] = {}
        self._anchor: tuple[int, float] | None = None  # (step, time) of this process's first train record
        self._last: tuple[int, float] | None = None

    def observe(self, kind: str, step: int, values: Mapping[str, Any], now: float) -> None:
        for key in METRIC_KEYS.get(kind, ()):
            if isinstance(values.get(key), (int, float)):
                self.metrics[key] = float(values[key])
        if kind == "train":
            self.step = step
            self._anchor = self._anchor or (step, now)
            self._last = (step, now)

    def remaining_seconds(self) -> int | None:
        """Steps left over the rate measured from this process's first train record to its last one."""
        if self._anchor is None or self._last is None or self._last[0] <= self._anchor[0]:
            return None
        rate = (self._last[0] - self._anchor[0]) / max(self._last[1] - self._anchor[1], 1e-9)
        return min(_INT32_MAX, math.ceil(max(0, self.total_steps - self.step) / rate))

    def status(self, wall: datetime) -> dict[str, Any]:
        """The request body: `{"trainerStatus": ...}` as the status server takes it."""
        status: dict[str, Any] = {"progressPercentage": min(100, 100 * self.step // self.total_steps)}
        remaining = 0 if self.step >= self.total_steps else self.remaining_seconds()
        if remaining is not None:
            status["estimatedRemainingSeconds"] = remaining
        status["metrics"] = [{"name": k, "value": f"{v:.6g}"} for k, v in self.metrics.items()]
        status["lastUpdatedTime"] = wall.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"trainerStatus": status}


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class ProgressPoster:
    """A metrics sink (metrics.MetricsSink): each record updates the status; at most one post per
    `period_s` of `clock` leaves the training thread as a dict for the daemon poster thread."""

    def __init__(
        self,
        endpoint: Endpoint,
        total_steps: int,
        *,
        period_s: float = PERIOD_S,
        timeout_s: float = TIMEOUT_S,
        warn_every_s: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utcnow,
        send: Callable[[Endpoint, dict[str, Any], float], None] = send_status,
    ) -> None:
        self.endpoint = endpoint
        self.period_s, self.timeout_s, self.warn_every_s = period_s, timeout_s, warn_every_s
        self._clock, self._wall, self._send = clock, wall, send
        self.tracker = StatusTracker(total_steps)
        self._pending: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._last_submit: float | None = None
        self._failures = 0
        self._last_warning: float | None = None
        self.posted = 0  # statuses the endpoint took

    def record(self, kind: str, step: int, values: Mapping[str, Any]) -> None:
        now = self._clock()
        self.tracker.observe(kind, step, values, now)
        if self._last_submit is None or now - self._last_submit >= self.period_s:
            self._last_submit = now
            self._submit(self.tracker.status(self._wall()))

    def drain(self, timeout: float) -> bool:
        """Wait until every handed-over status is posted (or failed), at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._pending.all_tasks_done:
            while self._pending.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._pending.all_tasks_done.wait(remaining)
        return True

    def close(self) -> None:
        """Post the final status and wait for it: at most two request timeouts (one post in flight, then
        the final) and a second for the rest."""
        self._submit(self.tracker.status(self._wall()))
        bound = 2 * self.timeout_s + 1.0
        if not self.drain(bound):
            log.warning("progress: the final status was not posted within %.0f s; training is done", bound)
            self._take_pending()  # not posted, now never: the thread ends after the post in flight
        # The thread ends: a process that trains again (a library caller, a test) keeps no thread per run.
        self._pending.put_nowait(None)

    def _take_pending(self) -> None:
        try:
            self._pending.get_nowait()
            self._pending.task_done()
        except queue.Empty:
            pass

    def _submit(self, body: dict[str, Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainjob-progress", daemon=True)
            self._thread.start()
        self._take_pending()  # the newest status replaces one not posted yet
        self._pending.put_nowait(body)

    def _run(self) -> None:
        while (body := self._pending.get()) is not None:
            try:
                self._send(self.endpoint, body, self.timeout_s)
            except (OSError, http.client.HTTPException, PostError, ValueError) as exc:
                self._failed(exc)
            else:
                self.posted += 1
                if self._failures:
                    log.info("progress: posting to %s works again", self.endpoint.url)
                self._failures = 0
            finally:
                self._pending.task_done()

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        now = self._clock()
        if self._last_warning is not None and now - self._last_warning < self.warn_every_s:
            return
        self._last_warning = now
        again = f" ({self._failures} failed in a row)" if self._failures > 1 else ""
        log.warning(
            "progress: cannot post the TrainJob's status to %s: %s%s; training goes on, the next failure is "
            "reported in %.0f s at the earliest",
            self.endpoint.url,
            _reason(exc),
            again,
            self.warn_every_s,
        )


def poster_from_env(env: Mapping[str, str], total_steps: int) -> ProgressPoster | None:
    """A poster when the TrainJob's status endpoint is configured (KUBEFLOW_TRAINER_SERVER_*), else None."""
    endpoint = Endpoint.from_env(env)
    return ProgressPoster(endpoint, total_steps) if endpoint else None


def _reason(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, PostError) else text


def _message(answer: bytes) -> str:
    """The Status object's message of an error answer, else its first characters."""
    try:
        message = json.loads(answer).get("message")
    except (ValueError, AttributeError):
        message = None
    return message or answer[:200].decode("utf-8", errors="replace").strip() or "no body"
