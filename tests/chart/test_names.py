"""Object and host names: any release name gives names the API server and the JobSet webhook accept,
names that are not DNS-1035 labels are refused at render time, and what the helm test hook and the
notes tell the user name the right objects.
"""

from __future__ import annotations

import pytest

from .conftest import CHART, RELEASE, SCENARIOS, values_args
from .objects import CASE_IDS, CASES, SCENARIO_NAMES, by_kind, helm_test_pod, one, topology_of, workload
from .validate import DNS_1035_LABEL, jobset_name_problems

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize("release", ["a", "r" * 53, "maskrcnn-dist", "x-maskrcnn-dist-y", "a" * 39 + "-b"])
def test_any_release_name_gives_names_the_api_and_the_jobset_webhook_accept(render, release: str) -> None:
    """The longest names there can be (a 53-character release, the most ddp workers) still fit: the
    Services are DNS-1035 labels, and so are the JobSet's subdomain, Job names and pod names."""
    objects = render("default", "engine=ddp", "ddp.workers=1024", "workload=jobset", release=release)
    assert not jobset_name_problems(one(objects, "JobSet"))
    for service in by_kind(objects, "Service"):
        assert DNS_1035_LABEL.match(service["metadata"]["name"]), service["metadata"]["name"]


# (release, --set, what the message must name): object names start with the fullname, and a Service's
# name, a JobSet's Jobs and host names are DNS-1035 labels, which start with a letter.
BAD_NAMES = [
    ("1run", (), 'the release name 1run gives object names starting with "1run-maskrcnn-dist"'),
    ("my.run", (), 'the release name my.run gives object names starting with "my.run-maskrcnn-dist"'),
    ("2-maskrcnn-dist", ("workload=jobset",), 'the release name 2-maskrcnn-dist gives object names starting with "2-'),
    ("t", ("fullnameOverride=9lives",), "'/fullnameOverride'"),
    ("t", ("fullnameOverride=a.b",), "'/fullnameOverride'"),
]


@pytest.mark.parametrize(("release", "sets", "message"), BAD_NAMES)
def test_names_that_are_not_dns_1035_labels_are_rejected(run_helm, release: str, sets, message: str) -> None:
    proc = run_helm("template", release, str(CHART), *values_args(None, sets))
    assert proc.returncode != 0, f"release {release} {sets} was accepted"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_helm_test_hook_checks_the_master_port(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    pod = helm_test_pod(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    flags = dict(zip(container["command"][2::2], container["command"][3::2]))
    assert container["command"][0] == "maskrcnn-launch" and container["command"][1] == "wait-master"
    host, port = flags["--master-addr"], flags["--master-port"]
    master = (
        f"{RELEASE}-maskrcnn-dist-master-0-0" if workload(objects) == "jobset" else f"{RELEASE}-maskrcnn-dist-master-0"
    )
    assert host == f"{master}.{service}.default.svc.cluster.local"
    assert int(port) == topology.network.master_port


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("workload_value", ["statefulset", "jobset"])
def test_notes_tell_how_to_follow_progress(run_helm, scenario: str, workload_value: str) -> None:
    # `helm template` skips NOTES.txt; a client-side dry-run install renders it without a cluster.
    args = values_args(SCENARIOS[scenario], (f"workload={workload_value}",))
    proc = run_helm("install", RELEASE, str(CHART), "--dry-run=client", *args)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    if workload_value == "jobset":
        assert f"kubectl logs -f -n default job/{RELEASE}-maskrcnn-dist-master-0" in notes
        assert f"kubectl get jobset -n default {RELEASE}-maskrcnn-dist" in notes
    else:
        assert f"kubectl logs -f -n default {RELEASE}-maskrcnn-dist-master-0" in notes
    assert f"maskrcnn-dist status --release {RELEASE}" in notes
    assert f"/data/runs/{RELEASE}/metrics.jsonl" in notes
