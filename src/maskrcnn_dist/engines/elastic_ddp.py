"""The ddp engine in an elastic group (--elastic, docs/elastic.md): its session and its step.

The session joins the elastic group (lifetime/elastic.py) through the job's TCPStore instead of opening
a fixed process group; each of the group's generations is torch's default process group, so DDP and the
engine's collectives run in it unchanged. The global batch stays the launch's (data/plan.py: the launch
world x --batch-size): a generation of `n` members takes rank r of n's share of each one, accumulating
its micro-batches' gradients, each loss weighted by its share of the global batch's images (x n, as DDP
averages over the members): the same step at any world size. The LR schedule and the epoch's length do
not move; every image of an epoch is trained on once, whatever members come and go.

A step, on every member: its micro-batches' forward and backward (DDP's all-reduce in the last one), one
all-reduce of the loss terms with the group's boundary flags, the commit point (lifetime/elastic.py:
every member or none goes on), then the optimizer step. Evaluation shards by the generation's ranks.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from maskrcnn_launcher.contract import MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE

from ..config import TrainConfig
from ..data.loader import MicroBatch
from ..errors import ConfigError, UserError
from ..lifetime.elastic import BoundaryDecision, ElasticGroup, GroupFailure, LeaderLost
from ..lifetime.membership import ElasticPolicy, admits_at
from ..lifetime.stop import RunOver, StopRequest
from .base import check_finite, checksum
from .torch_engine import TorchEngine, ddp_backend

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a collective on a group with a lost member raises, beside torch's DistError: gloo's transport
# errors arrive as a plain RuntimeError naming the peer's connection.
_LOST_PEER_WORDS = ("gloo", "connection", "socket", "peer", "nccl", "timed out", "timeout", "abort")


def is_group_failure(exc: BaseException) -> bool:
    """Whether `exc` is the group losing a member (recover and redo) rather than this process's own error.
    The leader's loss is neither: it ends the group (LeaderLost propagates)."""
    if isinstance(exc, LeaderLost):
        return False
    if isinstance(exc, (GroupFailure, dist.DistError)):
        return True
    return type(exc) is RuntimeError and any(word in str(exc).lower() for word in _LOST_PEER_WORDS)


@contextlib.contextmanager
def elastic_session(cfg: TrainConfig, env: dict[str, str] | None = None) -> Iterator[ElasticGroup]:
    """This process in the job's elastic group for the body: generation 0 at the launch, or, for a
    replacement of a lost process (the job is past generation 0), admission at the leader's next step
    boundary. RunOver when the leader's run ended before that. The group's timeout is --rpc-timeout."""
    env = dict(os.environ) if env is None else env
    backend = ddp_backend(cfg)
    if backend == "nccl":
        # NCCL's watchdog, at a collective's timeout, would end the process (torch's default, 3: tear down);
        # 2 aborts the communicator and raises in the waiting step, which the group recovers from.
        # Written for GPUs, not run here (docs/elastic.md, "NCCL").
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    peers, launch_world = cfg.peers, int(env[WORLD_SIZE])
    if peers.elastic_min_size > launch_world:
        raise ConfigError(
            f"--elastic-min-size {peers.elastic_min_size} is more than the job's {launch_world} ranks: "
            f"the group could never train; give at most {launch_world}"
        )
    policy = ElasticPolicy(timeout_s=peers.timeout, min_size=peers.elastic_min_size, min_wait_s=peers.elastic_min_wait)
    group = ElasticGroup(env[MASTER_ADDR], int(env[MASTER_PORT]), int(env[RANK]), launch_world, backend, policy)
    finished = False
    try:
        if group.start() is None:
            log.info("elastic: the job's run ended before this replacement was admitted: nothing to join")
            raise RunOver("the job's run ended before this replacement was admitted: nothing to join")
        log.info("elastic ddp: member %d, rank %d of %d (%s)", group.me, group.rank, group.size, backend)
        yield group
        finished = True
        with contextlib.suppress(RuntimeError):  # a member lost after the last step: the run is done anyway
            if group.generation is not None:
                dist.barrier()  # as process_group: nobody tears down while the leader still writes
    finally:
        group.close(finished=finished)


def leader_once(group: ElasticGroup, key: str, compute: Callable[[], T]) -> T:
    """`compute()` on the leader only, its result kept in the job's store under `key`, so that every
    member, a replacement that comes later included, gets the same value (the data check's verdicts). A
    user error on the leader is raised on every member. The store is the job's TCPStore: keep it small."""
    name = f"once/{key}"
    if group.is_leader:
        try:
            payload: tuple[bool, Any] = (True, compute())
        except UserError as exc:
            payload = (False, exc)
        group.store.set(name, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    else:
        if not group.wait_for_leader(name):
            log.info("elastic: the job's run ended before the leader's data check reached this member")
            raise RunOver("the job's run ended before the leader's data check reached this member")
        payload = pickle.loads(group.store.get(name))
    ok, value = payload
    if not ok:
        raise value
    return value


class ElasticTorchEngine(TorchEngine):
    """The ddp engine whose process group is the elastic group's current generation. `data_rank` and
    `data_world_size` are the generation's: its share of each global batch, and evaluation's shards.
    Between generations the DDP wrapper is dropped (`release`) and made again (`rejoin`)."""

    def __init__(
        self, cfg: TrainConfig, num_classes: int, iters_per_epoch: int, group: ElasticGroup, stop: StopRequest
    ) -> None:
        self.group = group
        super().__init__(cfg, num_classes, iters_per_epoch, distributed=True, stop=stop)
        self.total_steps = cfg.total_steps(iters_per_epoch)  # the policy admits no newcomer after the last
        self.wrapped_in = group._generation().number  # the generation DDP's constructor ran in
        self.decision = BoundaryDecision(stop_all=False, leaving=(), admit=False)

    @property
    def distributed(self) -> bool:
        return True  # between generations too: its collectives always go to the group

    def release(self) -> None:
        """Drop the DDP wrapper before the group ends: it holds the old process group and its sockets."""
        self.trained = self.model
        gc.collect()

    def rejoin(self) -> None:
        """In a new generation: this member's rank and the group's size, and the model wrapped again (DDP's
        constructor broadcasts the leader's weights: a collective every member reaches here)."""
        self.data_rank, self.data_world_size = self.group.rank, self.group.size
        number = self.group._generation().number
        if self.wrapped_in != number:  # a newcomer's constructor wrapped it in this generation already
            self.wrap()
            self.wrapped_in = number

    # -- the step -------------------------------------------------------------------------------

    def train_micro_batches(self, step: int, micro_batches: Sequence[MicroBatch]) -> dict[str, float]:
        """One optimizer step over this member's share of the global batch (data/plan.py's rank_share for
        its rank of the generation), committed on every member of the generation or on none (StepAborted,
        or the failed collective's error: recover, then redo it)."""
        weighted = self.accumulate(step, micro_batches)  # each loss x its weight x the generation's size
        names = sorted(weighted)
        asked = self.stop is not None and self.stop.requested
        admit = admits_at(step + 1, self.total_steps)
        flags = self.group.boundary_flags(leave=asked, stop=asked, admit=admit).to(self.device)
        terms = torch.stack([weighted[n].detach().float() for n in names])
        values = self.all_reduce_sum(torch.cat([terms, flags]))
        self.decision = self.group.read_boundary(values[len(names) :].cpu())
        self.agreed(self.decision.stop_all)
        logged = dict(zip(names, (values[: len(names)] / self.data_world_size).tolist()))  # the global batch's
        check_finite(step, logged)
        self.group.commit(step)  # nothing changed the weights before: every member steps, or none
        self.apply_gradients()
        return logged

    def stop_after_step(self) -> bool:
        return self.decision.stop_all  # a follower asked to stop leaves alone (a drain): decision.leaving

    def agree_to_stop(self) -> bool:
        """Outside a step only the leader's request stops everyone; a follower's waits for the next step
        boundary, where it leaves alone."""
        asked = torch.tensor([1.0 if self.group.is_leader and self.stop is not None and self.stop.requested else 0.0])
        return self.agreed(bool(self.all_reduce_sum(asked).item() > 0))

    def weights_digest(self) -> str:
        """A digest of the model's parameters, bit for bit. Not its buffers: BatchNorm's running statistics
        follow each rank's own batches after DDP's broadcast of the leader's at every forward."""
        return checksum(self.model.parameters())


class ElasticEngines:
    """The engine factory of an elastic session (engines.EngineFactory), and its way of running the data
    check once for every member (`on_rank0`, the fixed group's broadcast being no use to a replacement)."""

    def __init__(self, cfg: TrainConfig, group: ElasticGroup, stop: StopRequest) -> None:
        self.cfg, self.group, self.stop = cfg, group, stop

    def __call__(self, num_classes: int, iters_per_epoch: int) -> ElasticTorchEngine:
        return ElasticTorchEngine(self.cfg, num_classes, iters_per_epoch, self.group, self.stop)

    def on_rank0(self, compute: Callable[[], T]) -> T:
        return leader_once(self.group, "data-check", compute)
