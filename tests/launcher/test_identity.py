"""Identity, table-driven: flags, then environment, then a JobSet pod's downward API, the StatefulSet pod
name, a JobSet host name; and its errors."""

from __future__ import annotations

from typing import Any

import pytest
from maskrcnn_launcher.contract import host_name, jobset_host_name, parse_jobset_host_name, parse_pod_name
from maskrcnn_launcher.errors import IdentityError
from maskrcnn_launcher.identity import Identity, IdentityInputs, resolve_identity
from maskrcnn_launcher.topology import Topology, load_topology

K8S = {"MASKRCNN_HEADLESS_SERVICE": "rel-headless", "POD_NAMESPACE": "vision"}
MASTER_DNS = "rel-master-0.rel-headless.vision.svc.cluster.local"
# A JobSet pod: what the chart's downward API gives (JobSet `rel`, subdomain `rel-headless`).
JOBSET_MASTER_DNS = "rel-master-0-0.rel-headless.vision.svc.cluster.local"


def jobset_pod(rjob: str, index: int, **extra: str) -> dict[str, str]:
    host = f"rel-{rjob}-0-{index}"
    return {
        "POD_NAME": f"{host}-x7k2p",  # the Job's pod name: host name + a random suffix, not a StatefulSet name
        "HOSTNAME": host,
        "MASKRCNN_JOBSET_NAME": "rel",
        "MASKRCNN_REPLICATED_JOB": rjob,
        "MASKRCNN_JOB_INDEX": "0",
        "MASKRCNN_COMPLETION_INDEX": str(index),
        **K8S,
        **extra,
    }


@pytest.fixture(scope="module")
def topology() -> Topology:
    return load_topology("three-machines")  # 2 workers, port 29500


# (id, flags, env, expected (role, index, master_addr, master_port, dns_name, source prefix))
CASES: list[tuple[str, IdentityInputs, dict[str, str], tuple[Any, ...]]] = [
    (
        "bare master: flags only",
        IdentityInputs(role="master"),
        {"HOSTNAME": "laptop"},
        ("master", 0, "127.0.0.1", 29500, None, "flags"),
    ),
    (
        "bare worker: flags",
        IdentityInputs(role="worker", index=1, master_addr="10.0.0.5", master_port=1234),
        {},
        ("worker", 1, "10.0.0.5", 1234, None, "flags"),
    ),
    (
        "bare worker: environment",
        IdentityInputs(),
        {"MASKRCNN_ROLE": "worker", "MASKRCNN_INDEX": "0", "MASTER_ADDR": "head", "MASTER_PORT": "4000"},
        ("worker", 0, "head", 4000, None, "flags"),
    ),
    (
        "flags beat environment",
        IdentityInputs(role="worker", index=1, master_addr="flag-host", master_port=5000),
        {"MASKRCNN_ROLE": "master", "MASKRCNN_INDEX": "0", "MASTER_ADDR": "env-host", "MASTER_PORT": "4000"},
        ("worker", 1, "flag-host", 5000, None, "flags"),
    ),
    (
        "explicit role beats the pod name",
        IdentityInputs(role="worker", index=0),
        {"POD_NAME": "rel-worker-1", **K8S},
        ("worker", 0, MASTER_DNS, 29500, "rel-worker-0.rel-headless.vision.svc.cluster.local", "flags"),
    ),
    (
        "k8s worker from POD_NAME",
        IdentityInputs(),
        {"POD_NAME": "rel-worker-1", "HOSTNAME": "ignored", **K8S},
        ("worker", 1, MASTER_DNS, 29500, "rel-worker-1.rel-headless.vision.svc.cluster.local", "POD_NAME=rel-worker-1"),
    ),
    (
        "k8s master from HOSTNAME",
        IdentityInputs(),
        {"HOSTNAME": "rel-master-0", **K8S},
        ("master", 0, MASTER_DNS, 29500, MASTER_DNS, "HOSTNAME=rel-master-0"),
    ),
    (
        "k8s custom cluster domain",
        IdentityInputs(),
        {"POD_NAME": "rel-worker-0", "MASKRCNN_CLUSTER_DOMAIN": "corp.internal", **K8S},
        (
            "worker",
            0,
            "rel-master-0.rel-headless.vision.svc.corp.internal",
            29500,
            "rel-worker-0.rel-headless.vision.svc.corp.internal",
            "POD_NAME",
        ),
    ),
    (
        "k8s with MASTER_ADDR/PORT override",
        IdentityInputs(),
        {"POD_NAME": "rel-worker-0", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "2000", **K8S},
        ("worker", 0, "10.1.2.3", 2000, "rel-worker-0.rel-headless.vision.svc.cluster.local", "POD_NAME"),
    ),
    (
        "release name containing -worker-",
        IdentityInputs(),
        {"POD_NAME": "a-worker-1-worker-0", **K8S},
        ("worker", 0, "a-worker-1-master-0.rel-headless.vision.svc.cluster.local", 29500, None, "POD_NAME"),
    ),
    (
        "k8s master without namespace still runs (it needs no address)",
        IdentityInputs(),
        {"POD_NAME": "rel-master-0"},
        ("master", 0, "127.0.0.1", 29500, None, "POD_NAME"),
    ),
    (
        "JobSet worker from the downward API",
        IdentityInputs(),
        jobset_pod("workers", 1),
        (
            "worker",
            1,
            JOBSET_MASTER_DNS,
            29500,
            "rel-workers-0-1.rel-headless.vision.svc.cluster.local",
            "MASKRCNN_REPLICATED_JOB=workers, MASKRCNN_COMPLETION_INDEX=1",
        ),
    ),
    (
        "JobSet master from the downward API",
        IdentityInputs(),
        jobset_pod("master", 0),
        ("master", 0, JOBSET_MASTER_DNS, 29500, JOBSET_MASTER_DNS, "MASKRCNN_REPLICATED_JOB=master"),
    ),
    (
        "JobSet downward API beats the host name",
        IdentityInputs(),
        jobset_pod("workers", 0, HOSTNAME="rel-workers-0-1", MASKRCNN_JOBSET_NAME="js"),
        ("worker", 0, "js-master-0-0.rel-headless.vision.svc.cluster.local", 29500, None, "MASKRCNN_REPLICATED_JOB"),
    ),
    (
        "JobSet name from the host name when its label is not there",
        IdentityInputs(),
        jobset_pod("workers", 1, MASKRCNN_JOBSET_NAME=""),
        ("worker", 1, JOBSET_MASTER_DNS, 29500, None, "MASKRCNN_REPLICATED_JOB"),
    ),
    (
        # The downward API gives "" for a label a pod does not have: the host name is the fallback.
        "JobSet worker from the host name",
        IdentityInputs(),
        {"POD_NAME": "rel-workers-0-1-x7k2p", "HOSTNAME": "rel-workers-0-1", "MASKRCNN_REPLICATED_JOB": "", **K8S},
        (
            "worker",
            1,
            JOBSET_MASTER_DNS,
            29500,
            "rel-workers-0-1.rel-headless.vision.svc.cluster.local",
            "HOSTNAME=rel-workers-0-1",
        ),
    ),
    (
        "JobSet named like a StatefulSet release",
        IdentityInputs(),
        {"HOSTNAME": "a-worker-1-workers-0-0", **K8S},
        ("worker", 0, "a-worker-1-master-0-0.rel-headless.vision.svc.cluster.local", 29500, None, "HOSTNAME"),
    ),
    (
        "JobSet worker with an explicit MASTER_ADDR",
        IdentityInputs(),
        jobset_pod("workers", 0, MASTER_ADDR="10.1.2.3"),
        ("worker", 0, "10.1.2.3", 29500, None, "MASKRCNN_REPLICATED_JOB"),
    ),
]


@pytest.mark.parametrize("flags,env,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_identity(topology: Topology, flags: IdentityInputs, env: dict[str, str], expected: tuple[Any, ...]) -> None:
    ident = resolve_identity(flags, env, topology)
    role, index, addr, port, dns, source = expected
    assert (ident.role, ident.index, ident.master_addr, ident.master_port) == (role, index, addr, port)
    if dns is not None:
        assert ident.dns_name == dns
    assert ident.source.startswith(source)


def test_pod_ip_is_recorded(topology: Topology) -> None:
    ident = resolve_identity(IdentityInputs(), {"POD_NAME": "rel-worker-0", "POD_IP": "10.9.8.7", **K8S}, topology)
    assert isinstance(ident, Identity) and ident.pod_ip == "10.9.8.7"


ERROR_CASES = [
    ("no identity at all", IdentityInputs(), {}, "no pod name"),
    ("hostname that is not a pod name", IdentityInputs(), {"HOSTNAME": "laptop"}, "HOSTNAME='laptop' is not"),
    (
        "pod name that does not parse",
        IdentityInputs(),
        {"POD_NAME": "rel-trainer-0"},
        "POD_NAME='rel-trainer-0' is not",
    ),
    ("worker ordinal out of range", IdentityInputs(), {"POD_NAME": "rel-worker-2", **K8S}, "worker 2 is out of range"),
    ("negative index", IdentityInputs(role="worker", index=-1, master_addr="h"), {}, "worker -1 is out of range"),
    ("master ordinal 1", IdentityInputs(), {"POD_NAME": "rel-master-1", **K8S}, "the master is index 0, got 1"),
    ("worker without index", IdentityInputs(role="worker", master_addr="h"), {}, "a worker needs --index"),
    ("index without role", IdentityInputs(index=1), {}, "given without --role"),
    ("unknown role", IdentityInputs(role="chief"), {}, "role: 'chief' is not one of master, worker"),
    ("bare worker without master address", IdentityInputs(role="worker", index=0), {}, "give --master-addr"),
    (
        "k8s worker without namespace",
        IdentityInputs(),
        {"POD_NAME": "rel-worker-0", "MASKRCNN_HEADLESS_SERVICE": "svc"},
        "POD_NAMESPACE is not set",
    ),
    (
        "k8s worker without service or namespace",
        IdentityInputs(),
        {"POD_NAME": "rel-worker-0"},
        "MASKRCNN_HEADLESS_SERVICE and POD_NAMESPACE are not set",
    ),
    ("port out of range", IdentityInputs(role="master", master_port=65536), {}, "master port: 65536 is out of range"),
    ("port not a number", IdentityInputs(role="master"), {"MASTER_PORT": "http"}, "MASTER_PORT: 'http' is not"),
    ("index not a number", IdentityInputs(), {"MASKRCNN_ROLE": "worker", "MASKRCNN_INDEX": "one"}, "MASKRCNN_INDEX"),
    (
        "JobSet: unknown replicated job",
        IdentityInputs(),
        jobset_pod("workers", 0, MASKRCNN_REPLICATED_JOB="launcher"),
        "MASKRCNN_REPLICATED_JOB=launcher: replicated job 'launcher' is not one of master, workers",
    ),
    (
        "JobSet: workers as several Jobs",
        IdentityInputs(),
        jobset_pod("workers", 0, MASKRCNN_JOB_INDEX="1"),
        "Job index 1: one Job per replicated job (replicas 1) is expected",
    ),
    (
        "JobSet: no completion index",
        IdentityInputs(),
        jobset_pod("workers", 0, MASKRCNN_COMPLETION_INDEX=""),
        "MASKRCNN_COMPLETION_INDEX: not set in a JobSet pod",
    ),
    # Python's int() also reads "0_1", " 1" and other digits than 0-9: an index is plain decimal digits.
    *[
        (
            f"JobSet: completion index {text!r}",
            IdentityInputs(),
            jobset_pod("workers", 0, MASKRCNN_COMPLETION_INDEX=text),
            f"MASKRCNN_COMPLETION_INDEX: {text!r} is not an integer",
        )
        for text in ("0_1", " 1", "+1", "\u0661", "1.0")
    ],
    (
        "index with an underscore",
        IdentityInputs(),
        {"MASKRCNN_ROLE": "worker", "MASKRCNN_INDEX": "0_1"},
        "'0_1' is not",
    ),
    ("JobSet: worker index out of range", IdentityInputs(), jobset_pod("workers", 2), "worker 2 is out of range"),
    ("JobSet: master index 1", IdentityInputs(), jobset_pod("master", 1), "the master is index 0, got 1"),
    (
        "JobSet: no JobSet name anywhere",
        IdentityInputs(),
        jobset_pod("workers", 0, MASKRCNN_JOBSET_NAME="", HOSTNAME="node-17"),
        "a JobSet pod needs MASKRCNN_JOBSET_NAME",
    ),
    (
        "JobSet host name with a Job index",
        IdentityInputs(),
        {"HOSTNAME": "rel-workers-1-0"},
        "HOSTNAME='rel-workers-1-0' is not",
    ),
]


@pytest.mark.parametrize("flags,env,message", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_identity_errors(topology: Topology, flags: IdentityInputs, env: dict[str, str], message: str) -> None:
    with pytest.raises(IdentityError) as info:
        resolve_identity(flags, env, topology)
    assert any(message in e for e in info.value.errors), info.value.errors


@pytest.mark.parametrize(
    "name,expected",
    [
        ("rel-master-0", ("rel", "master", 0)),
        ("my-release-worker-12", ("my-release", "worker", 12)),
        ("rel-worker-", None),
        ("Rel-worker-0", None),  # not a DNS-1123 label
        ("worker-0", None),  # no prefix
        ("rel-master-0.example", None),
    ],
)
def test_parse_pod_name(name: str, expected: tuple[str, str, int] | None) -> None:
    assert parse_pod_name(name) == expected


@pytest.mark.parametrize(
    "name,expected",
    [
        ("rel-master-0-0", ("rel", "master", 0)),
        ("my-release-maskrcnn-dist-workers-0-11", ("my-release-maskrcnn-dist", "worker", 11)),
        ("rel-workers-1-0", None),  # the chart runs one Job per replicated job
        ("rel-worker-0-0", None),  # `workers`, plural: never a StatefulSet's -worker-<i>
        ("rel-master-0", None),  # a StatefulSet pod name
        ("rel-workers-0-0-x7k2p", None),  # a Job's pod name, not its host name
    ],
)
def test_parse_jobset_host_name(name: str, expected: tuple[str, str, int] | None) -> None:
    assert parse_jobset_host_name(name) == expected
    assert parse_pod_name(name) is None or expected is None, "the two forms never both parse"
    if expected is not None:
        assert jobset_host_name(*expected) == name == host_name("jobset", *expected)
