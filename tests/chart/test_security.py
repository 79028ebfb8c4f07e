"""Security of the rendered pods: non-root with a read-only root filesystem, no ServiceAccount token,
writable scratch space only in emptyDirs, and a NetworkPolicy that admits only the release's pods.
"""

from __future__ import annotations

import pytest
import yaml

from .conftest import CHART
from .objects import CASE_IDS, CASES, by_kind, one, pod_labels, pod_specs, pod_templates, selects, topology_of, trainer

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_pods_run_non_root_with_a_read_only_root_filesystem(render, scenario: str, jobset_api: bool) -> None:
    for spec in pod_specs(render(scenario, jobset_api=jobset_api)):
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert not ctx.get("privileged")


@pytest.mark.parametrize("jobset_api", [False, True])
def test_service_account_without_a_token(render, jobset_api: bool) -> None:
    objects = render("jobset", "workload=auto", jobset_api=jobset_api)
    account = one(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert (
        account["metadata"]["annotations"]
        == yaml.safe_load((CHART / "ci" / "jobset-values.yaml").read_text())["serviceAccount"]["annotations"]
    )
    for role, template in pod_templates(objects).items():
        assert template["spec"]["serviceAccountName"] == account["metadata"]["name"], role
    existing = pod_templates(render("cpu", "serviceAccount.name=trainers", jobset_api=jobset_api))
    assert {t["spec"]["serviceAccountName"] for t in existing.values()} == {"trainers"}
    assert not by_kind(render("cpu", "serviceAccount.name=trainers", jobset_api=jobset_api), "ServiceAccount")
    for template in pod_templates(render("cpu", jobset_api=jobset_api)).values():
        assert "serviceAccountName" not in template["spec"], "default: the namespace's default account"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_writable_scratch_space_is_emptydir(render, scenario: str, jobset_api: bool) -> None:
    # With a read-only root filesystem, /tmp and HOME (matplotlib, torch caches) must be mounted.
    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in trainer(template)["volumeMounts"]}
        for path in ("/tmp", "/home/maskrcnn"):
            assert "emptyDir" in mounts[path] and mounts[path]["emptyDir"]["sizeLimit"], f"{role}: {path}"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_network_policy_admits_only_this_release_on_the_training_ports(
    render, values, scenario: str, jobset_api: bool
) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    policy = one(objects, "NetworkPolicy")["spec"]
    topology = topology_of(objects)
    labels = pod_labels(objects)
    assert policy["policyTypes"] == ["Ingress"]
    # It protects the training pods (and not the short-lived test pod).
    assert selects(policy["podSelector"], labels["master"]) and selects(policy["podSelector"], labels["worker"])
    assert not selects(policy["podSelector"], labels["test"])
    rule, *extra = policy["ingress"]
    assert extra == (values(scenario)["networkPolicy"]["extraIngress"] or [])
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "same namespace only: no namespaceSelector / ipBlock"
    for role in ("master", "worker", "test"):
        assert selects(peer["podSelector"], labels[role]), role
    other_release = {**labels["worker"], "app.kubernetes.io/instance": "someone-else"}
    assert not selects(peer["podSelector"], other_release)
    assert not selects(peer["podSelector"], {})
    ports = [(p["protocol"], p["port"], p.get("endPort")) for p in rule["ports"]]
    peer_ports = values(scenario)["networkPolicy"]["peerPorts"]
    assert ports == [
        ("TCP", topology.network.master_port, None),
        ("TCP", peer_ports["from"], peer_ports["to"]),
    ]


def test_network_policy_can_be_disabled(render) -> None:
    assert not by_kind(render("default", "networkPolicy.enabled=false"), "NetworkPolicy")
