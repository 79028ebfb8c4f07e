"""Progress into the TrainJob's status: posts reach a real HTTPS server (its own CA, checked bearer token,
the body valid against the published TrainJob CRD's status.trainerStatus), at most one per 5 s and one at
the end, with the token re-read for every request, never on the training thread, and a server that is
down costs training nothing but one warning.

The contract is kubeflow/trainer v2.3.0's docs/user-guides/trainjob-progress.md (the three
KUBEFLOW_TRAINER_SERVER_* variables: a URL, and the paths of the CA and of the rotating token) and
pkg/statusserver/server.go (POST, `Authorization: Bearer <token>`, `{"trainerStatus": {...}}`).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from published_schemas import SCHEMAS, crd_schema

from maskrcnn_dist.config import TrainConfig
from maskrcnn_dist.trainer_parts import run_metrics
from maskrcnn_dist.training.metrics import read_metrics
from maskrcnn_dist.training.progress_post import Endpoint, ProgressPoster, send_status

from .status_server import Authority, Blackhole, make_authority, status_server

TRAINJOB_CRD = SCHEMAS / "trainer.kubeflow.org_trainjobs-v2.3.0.yaml"
LOGGER = "maskrcnn_dist.training.progress_post"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("tls"), "trainer")


@pytest.fixture(scope="module")
def trainer_status_schema() -> dict:
    status = crd_schema(TRAINJOB_CRD, "v1alpha1")["properties"]["status"]
    return status["properties"]["trainerStatus"]


def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")  # as the kubelet writes it may end with a newline: the header must not
    return path


def poster(url: str, ca: Path, token: Path, clock: FakeClock, total: int = 100, **kw) -> ProgressPoster:
    return ProgressPoster(Endpoint(url, str(ca), str(token)), total, clock=clock, **kw)


def train(p: ProgressPoster, clock: FakeClock, step: int, at: float, loss: float = 1.0) -> None:
    clock.t = 1000.0 + at
    p.record("train", step, {"loss": loss, "lr": 0.02, "images_per_s": 8.5, "loss_mask": 0.3, "epoch": 0})


@pytest.fixture(autouse=True)
def no_poster_thread_outlives_its_test():
    """Each test closes its posters, and close() ends the thread, its final post delivered or not (a process
    that trains again, a library caller's, keeps no thread per run): none is left once the post in flight
    is over, which its timeout bounds."""
    yield
    left = poster_threads_left()
    assert not left, f"{len(left)} progress thread(s) outlived the test"


def poster_threads_left(within_s: float = 30) -> list[threading.Thread]:
    """The progress threads still alive once they all ended or `within_s` passed."""
    deadline = time.monotonic() + within_s
    while (left := [t for t in threading.enumerate() if t.name == "trainjob-progress"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.slow
def test_posts_reach_the_server_over_tls_with_the_token_and_a_valid_body(
    authority: Authority, trainer_status_schema: dict, tmp_path: Path
) -> None:
    clock = FakeClock()
    with status_server(authority, token="jwt-1") as server:
        p = poster(server.url, authority.ca, token_file(tmp_path, "jwt-1"), clock)
        train(p, clock, 1, at=0.0, loss=2.5)
        assert p.drain(10)
        train(p, clock, 11, at=5.0, loss=1.25)  # 10 steps in 5 s: 2 steps/s, 89 steps left
        assert p.drain(10)
        p.record("eval", 11, {"bbox_AP": 0.3125, "segm_AP": 0.25, "images": 4})
        p.close()
        first, second, final = server.wait_for(3)
    assert not server.refused and p.posted == 3
    for got in (first, second, final):
        assert got.authorization == "Bearer jwt-1"
        assert set(got.body) == {"trainerStatus"}
        jsonschema.Draft7Validator(trainer_status_schema).validate(got.body["trainerStatus"])
        assert "lastUpdatedTime" in got.body["trainerStatus"]  # the CRD's x-kubernetes-validations rule
    assert first.body["trainerStatus"]["progressPercentage"] == 1
    assert "estimatedRemainingSeconds" not in first.body["trainerStatus"]  # no rate yet
    status = second.body["trainerStatus"]
    assert (status["progressPercentage"], status["estimatedRemainingSeconds"]) == (11, 45)
    assert status["metrics"] == [
        {"name": "loss", "value": "1.25"},
        {"name": "lr", "value": "0.02"},
        {"name": "images_per_s", "value": "8.5"},
    ]
    names = {m["name"]: m["value"] for m in final.body["trainerStatus"]["metrics"]}
    assert names == {"loss": "1.25", "lr": "0.02", "images_per_s": "8.5", "bbox_AP": "0.3125", "segm_AP": "0.25"}


@pytest.mark.slow
def test_the_server_certificate_is_checked_against_the_given_ca(
    authority: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = make_authority(tmp_path / "other", "stranger")
    clock = FakeClock()
    with status_server(authority, token="jwt") as server:
        p = poster(server.url, stranger.ca, token_file(tmp_path, "jwt"), clock)
        train(p, clock, 1, at=0.0)
        assert p.drain(10)
        p.close()
    assert server.received == [] and server.refused == [] and p.posted == 0
    (warning,) = warnings(caplog)
    assert "CERTIFICATE_VERIFY_FAILED" in warning and server.url in warning


def test_at_most_one_post_per_five_seconds_and_one_at_the_end(authority: Authority, tmp_path: Path) -> None:
    clock = FakeClock()
    with status_server(authority, token="jwt") as server:
        p = poster(server.url, authority.ca, token_file(tmp_path, "jwt"), clock, total=100)
        for step in range(1, 101):  # 100 steps, 0.1 s apart: 9.9 s
            train(p, clock, step, at=(step - 1) * 0.1)
            assert p.drain(10)
        assert len(server.received) == 2  # at 0 s and at 5 s
        p.close()
        server.wait_for(3)
    assert [r.body["trainerStatus"]["progressPercentage"] for r in server.received] == [1, 51, 100]
    assert server.received[-1].body["trainerStatus"]["estimatedRemainingSeconds"] == 0


def test_a_rotated_token_is_read_again_for_the_next_post(authority: Authority, tmp_path: Path) -> None:
    clock = FakeClock()
    path = token_file(tmp_path, "jwt-before")
    with status_server(authority, token="jwt-before") as server:
        p = poster(server.url, authority.ca, path, clock)
        train(p, clock, 1, at=0.0)
        assert p.drain(10)
        server.token = "jwt-after"  # the kubelet rotates the projected token; the old one expires
        token_file(tmp_path, "jwt-after")
        train(p, clock, 2, at=6.0)
        assert p.drain(10)
    assert [r.authorization for r in server.received] == ["Bearer jwt-before", "Bearer jwt-after"]
    assert server.refused == []
    p.close()  # the server is gone: the final post fails, and the thread ends all the same


def test_posting_never_runs_on_the_training_thread(authority: Authority, tmp_path: Path) -> None:
    clock = FakeClock()
    senders: list[str] = []

    def send(*args) -> None:
        senders.append(threading.current_thread().name)
        send_status(*args)

    with status_server(authority, token="jwt", delay_s=2.0) as server:  # a slow server: 2 s per answer
        p = poster(server.url, authority.ca, token_file(tmp_path, "jwt"), clock, send=send)
        started = time.perf_counter()
        for step in range(1, 31):
            train(p, clock, step, at=step * 1.0)  # 30 s of fake time: 6 posts wanted, the newest kept
        spent = time.perf_counter() - started
        p.close()
    # A training thread that waited would take 2 s per post, 12 s for the 6 wanted; 30 records take
    # milliseconds. 6 s fails only a wait, however busy the machine.
    assert spent < 6.0, f"30 records took {spent:.2f} s: the training thread waited for the server"
    assert senders and threading.current_thread().name not in senders and set(senders) == {"trainjob-progress"}
    assert server.received[-1].body["trainerStatus"]["progressPercentage"] == 30  # the final has the newest


def test_a_server_that_is_down_is_one_warning_then_rate_limited(
    authority: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture, free_port: int
) -> None:
    clock = FakeClock()
    url = f"https://localhost:{free_port}/status"  # nothing listens there
    p = poster(url, authority.ca, token_file(tmp_path, "jwt"), clock)
    for step in range(1, 21):  # one post every 5 s of fake time: 20 posts, 20 failures, 95 s
        train(p, clock, step, at=(step - 1) * 5.0)
        assert p.drain(10)
    assert p.posted == 0
    (warning,) = warnings(caplog)
    assert url in warning and "training goes on" in warning
    train(p, clock, 21, at=400.0)  # past WARN_EVERY_S (300 s): the still-failing post is said again
    assert p.drain(10)
    assert len(warnings(caplog)) == 2 and "(21 failed in a row)" in warnings(caplog)[1]
    p.close()


def test_the_endpoint_comes_from_the_three_variables(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    full = {
        "KUBEFLOW_TRAINER_SERVER_URL": "https://svc.ns.svc:8082/apis/x/status",
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": "/var/run/secrets/kubeflow/trainer/ca.crt",
        "KUBEFLOW_TRAINER_SERVER_TOKEN": "/var/run/secrets/kubeflow/trainer/token",
    }
    assert Endpoint.from_env(full) == Endpoint(*full.values())
    assert Endpoint.from_env({}) is None and not caplog.records
    assert Endpoint.from_env({**full, "KUBEFLOW_TRAINER_SERVER_TOKEN": ""}) is None
    assert "KUBEFLOW_TRAINER_SERVER_TOKEN not set" in warnings(caplog)[0]


def test_only_the_process_that_writes_metrics_posts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://localhost:1/status")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(tmp_path / "token"))
    cfg = TrainConfig(output_dir=tmp_path)
    rank0, other = run_metrics(cfg, True, 10), run_metrics(cfg, False, 10)
    assert [type(s).__name__ for s in rank0.sinks] == ["ProgressPoster"] and other.sinks == []
    rank0.close()
    other.close()


def test_closing_waits_for_the_final_post_a_bounded_time(authority: Authority, tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    with Blackhole() as down:
        p = poster(down.url, authority.ca, token_file(tmp_path, "jwt"), clock, timeout_s=0.5)
        train(p, clock, 1, at=0.0)
        started = time.monotonic()
        p.close()  # one post in flight (hangs 0.5 s), then the final (0.5 s): two timeouts, about 1 s
        spent = time.monotonic() - started
    assert spent < 30, spent  # bounded: unbounded, it would wait for the black hole forever
    assert p.posted == 0 and "cannot post" in warnings(caplog)[0]


def test_a_final_post_that_never_ends_leaves_no_thread_once_the_post_in_flight_does(tmp_path: Path, caplog) -> None:
    """A send that outlasts close()'s bound (as a server that trickles its answer would): close() returns
    after the bound with a warning, and the thread ends as soon as that send does, posting nothing more."""
    release, sends = threading.Event(), []

    def stuck(*args) -> None:
        sends.append(args)
        release.wait(60)

    clock = FakeClock()
    p = poster("https://localhost:1/status", tmp_path / "ca", tmp_path / "token", clock, timeout_s=0.2, send=stuck)
    train(p, clock, 1, at=0.0)
    p.close()  # bound: 2 x 0.2 + 1 s
    assert "the final status was not posted within 1 s" in warnings(caplog)[-1]
    release.set()  # the post in flight ends; the final status is dropped, not posted late
    left = poster_threads_left()
    assert not left and len(sends) == 1, (left, sends)


def step_overheads(out: Path) -> tuple[dict[int, float], list[float]]:
    """The run's losses by step, and per step the wall time between two train records beyond the step's
    own compute (batch of 2 / its images_per_s): loading the batch and writing the metrics, and a post
    if one ran on the training thread. Unlike whole-run times, it does not grow with a busy machine."""
    records = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    gaps = [b["time"] - a["time"] - 2 / b["images_per_s"] for a, b in zip(records, records[1:], strict=False)]
    return {r["step"]: r["loss"] for r in records}, gaps


@pytest.mark.slow
def test_training_with_the_server_down_trains_the_same_as_without(
    tiny_coco: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, authority
) -> None:
    """A real short run twice: without the endpoint, then with one that never answers (each TLS handshake
    hangs until the request's 5 s timeout). Same losses, nothing added between the steps, one warning."""
    from maskrcnn_dist.train import train as run

    from .conftest import fast_config

    data = tmp_path / "train_only"  # no val split: the runs compare training, not evaluation
    shutil.copytree(tiny_coco / "train", data / "train")
    run(fast_config(data, tmp_path / "plain", **{"max-steps": 6}))
    with Blackhole() as down:
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", down.url)
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(authority.ca))
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token_file(tmp_path, "jwt")))
        run(fast_config(data, tmp_path / "down", **{"max-steps": 6}))
    plain, plain_gaps = step_overheads(tmp_path / "plain")
    down_losses, down_gaps = step_overheads(tmp_path / "down")
    assert down_losses == plain and len(plain) == 6
    # The first post starts right after step 1's record: on the training thread it would add its 5 s.
    assert max(down_gaps) < max(2.0, 2 * max(plain_gaps) + 1.0), (plain_gaps, down_gaps)
    (warning,) = warnings(caplog)
    assert down.url in warning and "cannot post" in warning
