"""`launch`: plan this pod, wait for the master, export the environment, exec the trainer.

The trainer replaces the launcher (`os.execvpe`): same PID, so SIGTERM from Kubernetes or
`docker stop` reaches the trainer directly and its exit status is the container's. Nothing of
the launcher stays behind to forward signals or to hold memory.

pipeline: one process per pod, `python -m maskrcnn_dist.cli train --engine pipeline <args>` with the
launcher's own interpreter (so a virtual environment that is not on PATH still works).
ddp: `python -m maskrcnn_dist.torchrun --nnodes N --node-rank R --nproc-per-node P --master-addr A
--master-port PORT -m maskrcnn_dist.cli train --engine ddp <args>`: torch's own spawner (torchrun, whose
exit status the trainer's wrapper keeps at 2 for a user error) starts one process per device (one on
CPU) and sets RANK, LOCAL_RANK, WORLD_SIZE for each; the launcher never imports torch.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from maskrcnn_launcher import contract
from maskrcnn_launcher.boundary import EXIT_STOPPED
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.fieldcheck import suggest
from maskrcnn_launcher.peers import WaitPolicy, wait_for_master
from maskrcnn_launcher.plan import PodLaunch
from maskrcnn_launcher.topology import ENGINES

PIPELINE_TRAINER_MODULE = ("-m", "maskrcnn_dist.cli", "train", "--engine", "pipeline")
# torchrun's arguments, but a worker's exit 2 (a user error) stays the pod's exit 2: a JobSet fails at once.
TORCHRUN_MODULE = "maskrcnn_dist.torchrun"
DDP_TRAINER_MODULE = ("-m", "maskrcnn_dist.cli", "train", "--engine", "ddp")

# The trainer's engine that no topology runs: one process, started without the launcher.
ONE_PROCESS_ENGINE = "local"

# Printed just before the launcher hands its process to the trainer (`local` watches for it).
EXEC_MARK = " exec: "


def check_engine_args(engine: str, args: Sequence[str]) -> None:
    """The topology decides the engine, and the launcher passes it to the trainer: an `--engine` among the
    trainer's arguments that says another one would win (click takes the last) and train something the
    plan does not show. LauncherError (one line, exit 2) unless it agrees."""
    given = [a.split("=", 1)[1] for a in args if a.startswith("--engine=")]
    given += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--engine"]
    if not (other := [value for value in given if value != engine]):
        return
    value = other[0]
    if value == ONE_PROCESS_ENGINE:
        way = (
            f"--engine {value} trains in one process on one machine, without the launcher: run "
            f"`maskrcnn-dist train --engine {value} ...` itself, or drop --engine here"
        )
    elif value in ENGINES:
        way = f"drop --engine, or use a topology with engine: {value}"
    else:
        raise LauncherError(
            f"trainer argument --engine{suggest(value, ENGINES)} is not an engine a topology runs ("
            f"{', '.join(ENGINES)}): the topology's, {engine}, is passed to the trainer; drop --engine"
        )
    raise LauncherError(
        f"trainer argument --engine {value} contradicts the topology's engine {engine}: the topology decides it "
        f"(`maskrcnn-launch plan` shows it); {way}"
    )


def trainer_command(
    pod: PodLaunch, args: Sequence[str], trainer_cmd: Sequence[str] | None = None, python: str = sys.executable
) -> list[str]:
    """The argv to exec. `trainer_cmd` replaces the trainer (not torchrun) for tests and custom images."""
    plan = pod.plan
    check_engine_args(plan.engine, args)
    if plan.engine == "pipeline":
        return [*(trainer_cmd or (python, *PIPELINE_TRAINER_MODULE)), *args]
    torchrun = [
        python,
        "-m",
        TORCHRUN_MODULE,
        "--nnodes",
        str(pod.nnodes),
        "--node-rank",
        str(pod.node_rank),
        "--nproc-per-node",
        str(pod.nproc_per_node),
        "--master-addr",
        plan.master_addr,
        "--master-port",
        str(plan.master_port),
    ]
    if trainer_cmd:
        # torchrun runs an arbitrary executable with --no-python.
        return [*torchrun, "--no-python", *trainer_cmd, *args]
    return [*torchrun, *DDP_TRAINER_MODULE, *args]


def trainer_environment(pod: PodLaunch, base: Mapping[str, str]) -> dict[str, str]:
    """`base` (the launcher's own environment) plus what the launcher exports for this pod."""
    env = dict(base)
    env.update(pod.exported_env())
    return env


def parse_trainer_cmd(flag: str | None, env: Mapping[str, str]) -> list[str] | None:
    """The trainer command as words (--trainer-cmd, else its environment variable), or None for the default."""
    text = flag or env.get(contract.TRAINER_CMD)
    if not text:
        return None
    source = "--trainer-cmd" if flag else contract.TRAINER_CMD
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unclosed quote: the user's text, so say whose
        raise LauncherError(f"{source} {text!r}: {exc} (it is split into shell words)") from None
    if not words:
        raise LauncherError(f"{source} {text!r}: no command in it")
    return words


def must_wait(pod: PodLaunch) -> bool:
    """Workers wait for the master's name and port; the master opens that port itself."""
    return pod.plan.role != "master"


@contextmanager
def _stop_while_waiting() -> Iterator[None]:
    """SIGTERM/SIGINT before the trainer starts: nothing to save, so exit EXIT_STOPPED at once, as a
    trainer stopped before its first step does (a pod deleted while its peers were still coming)."""

    def stop(signum: int, _frame: object) -> None:
        line = f"maskrcnn-launch: {signal.Signals(signum).name} while waiting for the master: the trainer had not "
        os.write(2, f"{line}started, nothing to save; exit {EXIT_STOPPED}\n".encode())
        sys.exit(EXIT_STOPPED)

    with contract.signal_handlers(dict.fromkeys(contract.STOP_SIGNALS, stop)):
        yield


def launch(
    pod: PodLaunch,
    args: Sequence[str],
    trainer_cmd: Sequence[str] | None,
    policy: WaitPolicy,
    base_env: Mapping[str, str],
    log: Callable[[str], None],
    execvpe: Callable[[str, list[str], dict[str, str]], object] = os.execvpe,
) -> None:
    """Wait for the master (workers only), then replace this process by the trainer."""
    plan = pod.plan
    if must_wait(pod):
        with _stop_while_waiting():
            wait_for_master(plan.master_addr, plan.master_port, policy, log)
    argv = trainer_command(pod, args, trainer_cmd)
    env = trainer_environment(pod, base_env)
    log(f"maskrcnn-launch: {plan.rpc_name} (rank {plan.rank}/{plan.world_size}){EXEC_MARK}{shlex.join(argv)}")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        execvpe(argv[0], argv, env)
    except OSError as exc:  # a wrong --trainer-cmd is the user's mistake: say which, no traceback
        raise LauncherError(f"cannot start the trainer {argv[0]!r}: {exc.strerror}") from exc
