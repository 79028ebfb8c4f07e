"""One loop, two steps: the Trainer and the elastic Trainer (an elastic group of one, in-process) both take
each step's batch from the one source under the engine's device prefetch (`Engine.on_device`), and the
elastic form replaces the step, never the loop."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.data.loader import MicroBatch, StepBatch
from maskrcnn_dist.data.plan import MicroShare, RankShare
from maskrcnn_dist.lifetime.elastic import BoundaryDecision, ElasticGroup
from maskrcnn_dist.lifetime.membership import ElasticPolicy
from maskrcnn_dist.lifetime.stop import StopRequest
from maskrcnn_dist.training.elastic_loop import ElasticTrainer
from maskrcnn_dist.training.loop import Trainer, TrainerBase

from .stand_ins import CountingEngine

ITERS, EPOCHS = 3, 2


def loader(epoch: int, start: int) -> Iterator[StepBatch]:
    """(epoch, first global batch) -> one StepBatch per step: one micro-batch of two tiny images each."""
    for batch in range(start, ITERS):
        images = [torch.full((3, 4, 4), float(10 * epoch + batch)) for _ in range(2)]
        micro = MicroBatch(images=images, targets=[{}, {}], micro=0, weight=Fraction(1))
        share = RankShare((MicroShare(0, (2 * batch, 2 * batch + 1), Fraction(1)),))
        yield StepBatch(micro_batches=[micro], share=share)


class PrefetchingEngine(CountingEngine):
    """The counting engine whose `on_device` hands out copies, as a GPU prefetcher does: a step that did not
    take its batch from there trains on a batch it never handed out."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_out: list[StepBatch] = []
        self.trained_on: list[list[MicroBatch]] = []

    def on_device(self, batches: Iterable[StepBatch]) -> Iterator[StepBatch]:
        for batch in batches:
            self.handed_out.append(replace(batch, micro_batches=[replace(m) for m in batch.micro_batches]))
            yield self.handed_out[-1]

    def train_micro_batches(self, step, micro_batches):
        self.trained_on.append(micro_batches)
        return super().train_micro_batches(step, micro_batches)

    def assert_every_step_prefetched(self) -> None:
        assert len(self.trained_on) == ITERS * EPOCHS
        handed_out = [b.micro_batches for b in self.handed_out]
        assert all(any(m is h for h in handed_out) for m in self.trained_on), "a step bypassed on_device"


class ElasticPrefetchingEngine(PrefetchingEngine):
    """The same, in an elastic group: what ElasticTrainer asks of ElasticTorchEngine."""

    def __init__(self, group: ElasticGroup) -> None:
        super().__init__()
        self.group, self.decision = group, BoundaryDecision(stop_all=False, leaving=(), admit=False)

    def rejoin(self) -> None:
        self.data_rank, self.data_world_size = self.group.rank, self.group.size

    def release(self) -> None:
        pass

    def weights_digest(self) -> str:
        return str(self.steps.item())


class NoFiles:
    def save(self, state, step, again=False) -> Path:
        return Path(f"step{step}.pt")

    def trial(self, state) -> None:
        pass

    def publish_best(self, checkpoint: Path) -> Path:
        return checkpoint


def test_the_trainer_takes_every_batch_under_the_engines_prefetch() -> None:
    engine = PrefetchingEngine()
    trainer = Trainer(engine, loader, ITERS, ITERS * EPOCHS, NoFiles(), StopRequest(), {})
    assert trainer.fit().step == ITERS * EPOCHS
    engine.assert_every_step_prefetched()


@pytest.mark.timeout(60)
def test_the_elastic_step_prefetches_to_the_device_like_the_plain_one() -> None:
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    group = ElasticGroup("127.0.0.1", port, 0, 1, "gloo", ElasticPolicy(timeout_s=30))
    try:
        group.start()
        engine = ElasticPrefetchingEngine(group)
        trainer = ElasticTrainer(engine, loader, ITERS, ITERS * EPOCHS, NoFiles(), StopRequest(), {})
        assert trainer.fit().step == ITERS * EPOCHS
    finally:
        group.close(finished=True)
        del store
    engine.assert_every_step_prefetched()
    assert [m[0].images[0][0, 0, 0].item() for m in engine.trained_on] == [0, 1, 2, 10, 11, 12]


def test_the_elastic_trainer_replaces_the_step_never_the_loop() -> None:
    assert "train" not in vars(ElasticTrainer) and "fit" not in vars(ElasticTrainer)
    assert ElasticTrainer.train is TrainerBase.train
