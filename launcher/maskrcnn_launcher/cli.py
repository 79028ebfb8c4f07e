"""`maskrcnn-launch`: plan, validate and status here; launch, local and wait-master in cli_run.py. Thin over the
library; every failure leaves through the error boundary (boundary.py): exit 2 on bad input (or a cluster that
cannot answer `status`), 3 on an unreachable master, 1 otherwise, one `error:` line each. Every command line is
parsed strictly (strict.py): an option given twice, or an unknown one, is refused."""

from __future__ import annotations

import os
from pathlib import Path

import click

from maskrcnn_launcher import contract
from maskrcnn_launcher.boundary import GuardedGroup
from maskrcnn_launcher.cli_options import DnsName, topology_option
from maskrcnn_launcher.cli_run import launch, local, wait_master
from maskrcnn_launcher.hostcheck import interface_problem
from maskrcnn_launcher.identity import Cluster
from maskrcnn_launcher.memory import DEFAULT_RANK_MEMORY, MemoryBudget, memory_warnings, quantity_bytes
from maskrcnn_launcher.plan import derive_job
from maskrcnn_launcher.render import plan_json, plan_table
from maskrcnn_launcher.topology import Topology, load_topology
from maskrcnn_launcher.trainjob import checked_torch_runtime, explain

__all__ = ["main", "wait_master"]


@click.group(cls=GuardedGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Topology + pod identity -> rank, MASTER_ADDR, placement, device maps; then start the trainer."""


def _interface_warning(topology: Topology) -> None:
    """`validate` and `plan` may run on another machine than the pods: an interface this one lacks is a
    warning here (`launch` and `local`, on the pods' host, refuse it)."""
    if problem := interface_problem(topology, pods_here=False):
        click.echo(f"warning: {problem}", err=True)


@main.command()
@topology_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print the job plan as JSON (each pod's `plan` is its MASKRCNN_POD_PLAN)."
)
@click.option(
    "--prefix",
    type=DnsName(),
    default="maskrcnn",
    show_default=True,
    help="StatefulSet name prefix, or the JobSet's name (the chart's: <release>-maskrcnn-dist).",
)
@click.option(
    "--workload",
    type=click.Choice(contract.WORKLOADS),
    default="statefulset",
    show_default=True,
    help="The pods' names: StatefulSet pods <prefix>-master-0, JobSet host names <prefix>-master-0-0, or a "
    "TrainJob's nodes <prefix>-node-0-<rank> (prefix: the TrainJob's name; also its subdomain).",
)
@click.option(
    "--service",
    type=DnsName(),
    default=None,
    help="Headless Service name (a JobSet's subdomain) [default: <prefix>-headless].",
)
@click.option("--namespace", type=DnsName(), default="default", show_default=True)
@click.option(
    "--cluster-domain", type=DnsName(subdomain=True), default=contract.DEFAULT_CLUSTER_DOMAIN, show_default=True
)
@click.option(
    "--pod-memory",
    default="16Gi",
    show_default=True,
    help="Each pod's memory limit (the chart's master/worker.resources.limits.memory).",
)
@click.option("--shm", default="2Gi", show_default=True, help="The pods' /dev/shm size (the chart's shmSize).")
@click.option(
    "--rank-memory",
    default=DEFAULT_RANK_MEMORY,
    show_default=True,
    help="What one rank and its DataLoader workers take together (PSS), as measured at the dataset's scale "
    "(benchmarks/bench_scale.py; the default: its figure at COCO 2017 train's scale). A pod whose ranks "
    "and /dev/shm would exceed --pod-memory is warned about.",
)
def plan(
    topology_ref: str | None,
    as_json: bool,
    prefix: str,
    workload: str,
    service: str | None,
    namespace: str,
    cluster_domain: str,
    pod_memory: str,
    shm: str,
    rank_memory: str,
) -> None:
    """Print one row per pod and the estimated bytes per link per step. Needs no cluster.

    Under Kubeflow Trainer's torch runtime (PET_* in the environment, as in a TrainJob's pod) the job's
    shape and its master come from those variables, checked against the topology, and the plan says
    what it took from each."""
    topology = load_topology(topology_ref)
    torch = checked_torch_runtime(os.environ, topology)
    if torch is not None:
        prefix, workload = torch.trainjob or prefix, "trainjob" if torch.trainjob else workload
    default_service = prefix if workload == "trainjob" else f"{prefix}-headless"
    cluster = Cluster(prefix, service or default_service, namespace, cluster_domain, workload)
    master = (torch.master_addr, torch.master_port) if torch else (cluster.dns_name("master", 0), None)
    job = derive_job(topology, master[0], master[1] or topology.network.master_port, cluster)
    derived = explain(torch, topology) if torch else []
    click.echo(plan_json(job, derived) if as_json else plan_table(job, derived), nl=False)
    budget = MemoryBudget(
        quantity_bytes(pod_memory, "--pod-memory"),
        quantity_bytes(shm, "--shm"),
        quantity_bytes(rank_memory, "--rank-memory"),
    )
    for line in memory_warnings(job, budget):
        click.echo(f"warning: {line}", err=True)
    _interface_warning(topology)


@main.command()
@topology_option
def validate(topology_ref: str | None) -> None:
    """Check a topology; print every problem and exit 2 if there is any. Under Kubeflow Trainer's torch
    runtime (PET_* set) also check those variables against it, and say what they give."""
    topology = load_topology(topology_ref)
    torch = checked_torch_runtime(os.environ, topology)
    click.echo(
        f"ok: {topology.source}: engine {topology.engine}, {topology.nnodes} pods, world size {topology.world_size}"
    )
    for line in explain(torch, topology) if torch else []:
        click.echo(line)
    _interface_warning(topology)


main.add_command(launch)
main.add_command(local)
main.add_command(wait_master)


@main.command()
@click.option("--release", default=None, help="Helm release name (the pods' app.kubernetes.io/instance label).")
@click.option(
    "--trainjob",
    default=None,
    metavar="NAME",
    help="A Kubeflow Trainer TrainJob instead: its state, the progress and AP in its status.trainerStatus, its pods.",
)
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="Namespace [default: the kubeconfig context's; in a pod, its own; else default].",
)
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path),
    default=None,
    help="Kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(
    release: str | None, trainjob: str | None, namespace: str | None, kubeconfig: Path | None, as_json: bool
) -> None:
    """Pods of a deployed release (role, rank, phase, restarts, node) and the master's latest progress;
    or, with --trainjob, a Kubeflow Trainer TrainJob's state, the progress, ETA, loss and AP its trainer
    posted, and its pods.

    Needs the kubernetes client (pip install 'maskrcnn-launcher[k8s]'); every request is bounded by
    a timeout and not retried, so an unreachable cluster is one error line within seconds.
    """
    if (release is None) == (trainjob is None):
        raise click.UsageError("give --release NAME or --trainjob NAME (one of them)")
    from maskrcnn_launcher.status import connect, release_status, render_status, render_trainjob, trainjob_status

    connection = connect(kubeconfig)
    try:
        if trainjob is not None:
            text = render_trainjob(
                trainjob_status(trainjob, namespace or connection.namespace, api=connection.api), as_json=as_json
            )
        else:
            text = render_status(
                release_status(release, namespace or connection.namespace, api=connection.api), as_json=as_json
            )
    finally:
        connection.close()
    click.echo(text)
