"""`maskrcnn-launch`: plan, validate, launch, local, wait-master, status. Thin over the library; every failure leaves
through the error boundary (boundary.py): exit 2 on bad input (or a cluster that cannot answer `status`),
3 on an unreachable master, 1 otherwise, one `error:` line each."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from maskrcnn_launcher import contract
from maskrcnn_launcher.boundary import EXIT_STOPPED, ExitWith, GuardedGroup
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.identity import Cluster, IdentityInputs, resolve_identity
from maskrcnn_launcher.launch import launch as run_launch
from maskrcnn_launcher.launch import must_wait, parse_trainer_cmd, trainer_command
from maskrcnn_launcher.memory import DEFAULT_RANK_MEMORY, MemoryBudget, memory_warnings, quantity_bytes
from maskrcnn_launcher.peers import WaitPolicy, free_port, wait_until_master_reachable
from maskrcnn_launcher.plan import derive_job, derive_pod
from maskrcnn_launcher.render import plan_json, plan_table
from maskrcnn_launcher.topology import builtin_topologies, load_topology
from maskrcnn_launcher.trainjob import checked_torch_runtime, explain

F = TypeVar("F", bound=Callable[..., Any])


class _Seconds(click.ParamType):
    """A finite number of seconds above 0 (click's FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} must be a finite number of seconds > 0", param, ctx)
        return seconds


SECONDS = _Seconds()


class _DnsName(click.ParamType):
    """A Kubernetes name that becomes part of a pod's DNS name: a DNS-1123 label (`labels=1`) or a
    subdomain of them (the cluster domain). The plan prints those DNS names; a wrong one would only
    show up as a worker that never finds its master."""

    _LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

    def __init__(self, subdomain: bool = False) -> None:
        self.subdomain = subdomain
        self.name = "dns-subdomain" if subdomain else "dns-label"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        labels = text.split(".") if self.subdomain else [text]
        if len(text) > (253 if self.subdomain else 63) or not all(
            len(label) <= 63 and self._LABEL.match(label) for label in labels
        ):
            what = "dot-separated labels of" if self.subdomain else "at most 63"
            self.fail(
                f"{text!r} is not a DNS name: {what} lower-case letters, digits and '-', starting and ending "
                "with a letter or digit",
                param,
                ctx,
            )
        return text


def _topology_option(func: F) -> F:
    return click.option(
        "--topology",
        "topology_ref",
        envvar=contract.TOPOLOGY,
        default=None,
        metavar="FILE|NAME",
        help=f"Topology YAML, or a packaged one by name ({', '.join(builtin_topologies())}); "
        f"default: ${contract.TOPOLOGY}, else three-machines.",
    )(func)


@click.group(cls=GuardedGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Topology + pod identity -> rank, MASTER_ADDR, placement, device maps; then start the trainer."""


@main.command()
@_topology_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print the job plan as JSON (each pod's `plan` is its MASKRCNN_POD_PLAN)."
)
@click.option(
    "--prefix",
    type=_DnsName(),
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
    type=_DnsName(),
    default=None,
    help="Headless Service name (a JobSet's subdomain) [default: <prefix>-headless].",
)
@click.option("--namespace", type=_DnsName(), default="default", show_default=True)
@click.option(
    "--cluster-domain", type=_DnsName(subdomain=True), default=contract.DEFAULT_CLUSTER_DOMAIN, show_default=True
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


@main.command()
@_topology_option
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


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--role", default=None, help=f"master or worker [env {contract.ROLE}; else the pod name].")
@click.option(
    "--index", type=click.IntRange(min=0), default=None, help=f"0-based worker ordinal [env {contract.INDEX}]."
)
@click.option("--master-addr", default=None, help=f"Master address [env {contract.MASTER_ADDR}; else its DNS name].")
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"[env {contract.MASTER_PORT}; else the topology's].",
)
@_topology_option
@click.option(
    "--trainer-cmd",
    default=None,
    help=f"Replace the trainer command (shell words; for ddp it runs under torchrun --no-python) "
    f"[env {contract.TRAINER_CMD}].",
)
@click.option(
    "--wait-timeout",
    type=SECONDS,
    default=None,
    help=f"Seconds to wait for the master's DNS name and port [env {contract.WAIT_TIMEOUT}; "
    f"default {contract.DEFAULT_WAIT_TIMEOUT_S:g}].",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the command and exported environment as JSON; do not wait or exec."
)
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def launch(
    role: str | None,
    index: int | None,
    master_addr: str | None,
    master_port: int | None,
    topology_ref: str | None,
    trainer_cmd: str | None,
    wait_timeout: float | None,
    dry_run: bool,
    trainer_args: tuple[str, ...],
) -> None:
    """Derive this pod's identity, wait for the master, export the environment and exec the trainer.

    Everything after `--` goes to the trainer. The trainer replaces this process (exec), so signals
    such as SIGTERM reach it directly.
    """
    env = dict(os.environ)
    topology = load_topology(topology_ref)
    identity = resolve_identity(IdentityInputs(role, index, master_addr, master_port), env, topology)
    pod = derive_pod(topology, identity)
    plan = pod.plan
    command = parse_trainer_cmd(trainer_cmd, env)
    if dry_run:
        doc = {
            "identity_source": identity.source,
            "torch_runtime": explain(identity.torch_runtime, topology) if identity.torch_runtime else None,
            "waits_for": f"{plan.master_addr}:{plan.master_port}" if must_wait(pod) else None,
            "argv": trainer_command(pod, trainer_args, command),
            "env": pod.exported_env(),
            "pod": pod.to_dict(),
        }
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    policy = WaitPolicy(timeout_s=_wait_timeout(wait_timeout, env))
    _log(f"maskrcnn-launch: {plan.role} {plan.index} ({identity.source}); master {plan.master_addr}:{plan.master_port}")
    run_launch(pod, trainer_args, command, policy, env, _log)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_topology_option
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Loopback port of the master [default: a free one, picked by binding port 0].",
)
@click.option(
    "--wait-timeout", type=SECONDS, default=120.0, show_default=True, help="Seconds each worker waits for the master."
)
@click.option(
    "--grace",
    type=SECONDS,
    default=60.0,
    show_default=True,
    help="After one pod fails, seconds the others get to stop on their own before being terminated "
    "(pods whose trainer has not started yet are stopped at once); after SIGTERM/SIGINT, seconds the pods "
    "get to stop at a step boundary and write their checkpoint.",
)
@click.option("--restart-workers", type=click.IntRange(0), default=0, help="ddp: start a lost worker pod again N times")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def local(
    topology_ref: str | None,
    master_port: int | None,
    wait_timeout: float,
    grace: float,
    restart_workers: int,
    trainer_args: tuple[str, ...],
) -> None:
    """Run every pod of the topology as a local process on loopback (the multi-machine job on one host).

    Each pod is a real `launch` with an explicit identity, as on bare nodes. Exits with the first
    failing pod's status; a lost ddp worker is reported and the others go on (docs/elastic.md), the
    job's status then the master's: a ddp job's trainers get --elastic unless given --no-elastic.
    Without --master-port the master gets a free loopback port (another program may take it before
    the master binds it: rare, and the group then stops)."""
    from maskrcnn_launcher.local import local_pods, run_local

    port = master_port if master_port is not None else free_port()
    pods = local_pods(topology_ref, port, trainer_args, wait_timeout, restart_workers)
    result = run_local(pods, grace, echo=lambda line: click.echo(line), restart_workers=restart_workers)
    if result.code == EXIT_STOPPED:  # every pod stopped on request: not a failure, no error line
        sys.exit(EXIT_STOPPED)
    if result.code:  # the pods' output went to stdout; stderr gets the one line that says why
        raise ExitWith(result.code, f"{result.pod}: {result.error or f'exited with {result.code}'}")


@main.command("wait-master")
@click.option("--master-addr", required=True, metavar="HOST", help="The master's address: its DNS name or IP.")
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=contract.DEFAULT_MASTER_PORT,
    show_default=True,
    help="The master's rendezvous port (the topology's network.master_port).",
)
@click.option(
    "--timeout",
    type=SECONDS,
    default=contract.DEFAULT_WAIT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the name to resolve and then the port to accept a connection.",
)
def wait_master(master_addr: str, master_port: int, timeout: float) -> None:
    """Wait until the master's name resolves and its port accepts a TCP connection, as a worker's
    `launch` does before it starts the trainer; print `master reachable at HOST:PORT`, or one error line
    and exit 3 after --timeout. The chart's `helm test` runs it (the port is open while training runs).
    """
    if not master_addr.strip():
        raise click.BadParameter("must not be empty", param_hint="'--master-addr'")
    wait_until_master_reachable(master_addr, master_port, WaitPolicy(timeout_s=timeout), _log)
    click.echo(f"master reachable at {master_addr}:{master_port}")


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


def _log(message: str) -> None:
    """The launcher's own progress lines go to stderr: stdout is the trainer's, or a command's answer."""
    click.echo(message, err=True)


def _wait_timeout(flag: float | None, env: dict[str, str]) -> float:
    if flag is not None:
        value: float = flag
    else:
        raw = env.get(contract.WAIT_TIMEOUT)
        try:
            value = float(raw) if raw else contract.DEFAULT_WAIT_TIMEOUT_S
        except ValueError:
            raise LauncherError(f"{contract.WAIT_TIMEOUT}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise LauncherError(f"wait timeout: {value:g} must be positive (--wait-timeout / {contract.WAIT_TIMEOUT})")
    return value
