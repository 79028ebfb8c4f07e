"""The commands that start pods or wait for them: `launch` (this pod), `local` (every pod of a topology on
this host) and `wait-master` (the chart's helm test). `launch` and `local` take the trainer's arguments
after `--` only (strict.PassThroughCommand): their own options are parsed strictly before it."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence

import click

from maskrcnn_launcher import contract
from maskrcnn_launcher.boundary import EXIT_STOPPED, ExitWith
from maskrcnn_launcher.cli_options import SECONDS, log, topology_option
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.hostcheck import cpu_fallback_warning, interface_problem, visible_gpus
from maskrcnn_launcher.identity import IdentityInputs, resolve_identity
from maskrcnn_launcher.launch import launch as run_launch
from maskrcnn_launcher.launch import must_wait, parse_trainer_cmd, trainer_command
from maskrcnn_launcher.peers import WaitPolicy, free_port, wait_until_master_reachable
from maskrcnn_launcher.plan import derive_pod
from maskrcnn_launcher.strict import PassThroughCommand, StrictCommand, refuse_own_options_passed_on
from maskrcnn_launcher.topology import Topology, load_topology
from maskrcnn_launcher.trainjob import explain

HOST_CHECKED = "--host-checked"  # `local` checked this host once for all its pods: they do not again


@click.command(cls=PassThroughCommand)
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
@topology_option
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
@click.option(HOST_CHECKED, "host_checked", is_flag=True, hidden=True)
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
    host_checked: bool,
    trainer_args: tuple[str, ...],
) -> None:
    """Derive this pod's identity, wait for the master, export the environment and exec the trainer.

    The trainer's arguments go after `--`; before it, only the options below (anything else is refused).
    The trainer replaces this process (exec), so signals such as SIGTERM reach it directly.
    """
    env = dict(os.environ)
    command = parse_trainer_cmd(trainer_cmd, env)
    if command is None:  # the kit's trainer: none of this command's options is one of its
        refuse_own_options_passed_on(click.get_current_context(), trainer_args, "the trainer")
    topology = load_topology(topology_ref)
    identity = resolve_identity(IdentityInputs(role, index, master_addr, master_port), env, topology)
    pod = derive_pod(topology, identity)
    plan = pod.plan
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
    if not host_checked:
        check_host(topology, [pod.node_rank], env)
    policy = WaitPolicy(timeout_s=_wait_timeout(wait_timeout, env))
    log(f"maskrcnn-launch: {plan.role} {plan.index} ({identity.source}); master {plan.master_addr}:{plan.master_port}")
    run_launch(pod, trainer_args, command, policy, env, log)


@click.command(cls=PassThroughCommand)
@topology_option
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
    help="After one pod fails, or the master ends, seconds the others get to stop on their own before they are "
    "ended (pods whose trainer has not started yet are stopped at once); after SIGTERM/SIGINT, seconds the pods "
    "get to stop at a step boundary and write their checkpoint.",
)
@click.option(
    "--restart-workers",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    metavar="N",
    help="ddp: start crashed worker pods again, N times in all: one budget shared by every worker, as the "
    "chart's jobset.elastic.workerReplacements (the workers' Job's backoffLimit). A drained pod (exit 75) "
    "is not started again, nor any pod once the master has ended.",
)
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

    Each pod is a real `launch` with an explicit identity, as on bare nodes; the trainer's arguments go
    after `--`. Exits with the first failing pod's status; a lost ddp worker is reported and the others go
    on (docs/elastic.md), the job's status then the master's: a ddp job's trainers get --elastic unless
    given --no-elastic. Once the master has ended, a pod still running after --grace (lost, frozen or
    hung) is ended, with a line naming it. Without --master-port the master gets a free loopback port
    (another program may take it before the master binds it: rare, and the group then stops)."""
    from maskrcnn_launcher.local import local_pods, run_local

    if parse_trainer_cmd(None, os.environ) is None:  # the kit's trainer
        refuse_own_options_passed_on(click.get_current_context(), trainer_args, "the trainer")
    port = master_port if master_port is not None else free_port()
    pods = local_pods(topology_ref, port, trainer_args, wait_timeout, restart_workers, (HOST_CHECKED,))
    topology = load_topology(topology_ref)
    check_host(topology, range(topology.nnodes), os.environ)  # once for every pod: all run here
    result = run_local(pods, grace, echo=lambda line: click.echo(line), restart_workers=restart_workers)
    if result.code == EXIT_STOPPED:  # every pod stopped on request: not a failure, no error line
        sys.exit(EXIT_STOPPED)
    if result.code:  # the pods' output went to stdout; stderr gets the one line that says why
        raise ExitWith(result.code, f"{result.pod}: {result.error or f'exited with {result.code}'}")


@click.command("wait-master", cls=StrictCommand)
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
    wait_until_master_reachable(master_addr, master_port, WaitPolicy(timeout_s=timeout), log)
    click.echo(f"master reachable at {master_addr}:{master_port}")


def check_host(topology: Topology, pods_here: Sequence[int], env: Mapping[str, str]) -> None:
    """On the host the pods run on, before any starts: a network interface it lacks is refused (one line),
    and GPUs it lacks are warned about once (hostcheck.py)."""
    if problem := interface_problem(topology):
        raise LauncherError(problem)
    if warning := cpu_fallback_warning(topology, list(pods_here), visible_gpus(env)):
        click.echo(f"warning: {warning}", err=True)


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
