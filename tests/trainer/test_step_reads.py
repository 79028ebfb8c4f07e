"""A training step reads nothing back from the device: the kit's own host reads per step are counted on
the CPU (every call that turns a tensor into a Python value), beyond what the model itself reads; the
model's own waits (reads and data-dependent shapes, modeling/waits.py) are a few a step whatever the
batch with the batched heads; and a non-finite loss stops the run where the losses are read, naming its
step."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.errors import TrainingError
from maskrcnn_dist.modeling.perf import autocast_context
from maskrcnn_dist.modeling.waits import HostWaits
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import FEWER_ROIS, fast_config

# What makes a tensor a Python value: on a GPU each is a device-to-host copy the host waits for.
READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu"}


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's value into Python, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def model_reads(engine: TorchEngine, step: int, images, targets) -> int:
    """The model's own reads in a training forward and backward (torchvision's samplers, NMS, ...)."""
    engine.seeder.at(step, micro=engine.data_rank)
    engine.model.train()
    with HostReads() as reads:
        with autocast_context(engine.device, engine.cfg.amp, engine.cfg.amp_dtype):
            loss = sum(engine.model(images, targets).values())
        loss.backward()
    engine.optimizer.zero_grad(set_to_none=True)
    return len(reads.calls)


def kit_reads(engine: TorchEngine, step: int, images, targets) -> list[str]:
    with HostReads() as reads:
        engine.train_step(step, images, targets)
    return reads.calls


@pytest.fixture(scope="module")
def setup(tiny_coco, tmp_path_factory):
    cfg = fast_config(tiny_coco, tmp_path_factory.mktemp("reads"), **{"clip-grad-norm": 10.0}, **FEWER_ROIS)
    train_set, _ = load_datasets(cfg)
    # One image and fewer RoIs: a read the kit adds is there at any batch size and RoI count, and under --amp
    # a CPU without bf16 units (AVX2 only) takes ~12 s a step of one image at the model's 128 RoIs.
    image, target = train_set[0]
    return cfg, train_set.num_classes, [image], [target]


@pytest.mark.slow
@pytest.mark.parametrize("amp", [False, True])
def test_the_local_step_reads_nothing_beyond_the_model(setup, amp):
    cfg, num_classes, images, targets = setup
    cfg.amp = amp
    engine = TorchEngine(cfg, num_classes, iters_per_epoch=10)
    engine.train_step(0, images, targets)  # the optimizer's state exists from here on
    own = model_reads(engine, 1, images, targets)
    calls = kit_reads(engine, 1, images, targets)
    assert len(calls) - own == 0, calls


@pytest.mark.slow
def test_the_ddp_step_reads_once_for_the_stop_agreement(setup, free_port):
    cfg, num_classes, images, targets = setup
    cfg.amp = False
    store = dist.TCPStore("127.0.0.1", free_port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        engine = TorchEngine(cfg, num_classes, iters_per_epoch=10, distributed=True)
        engine.train_step(0, images, targets)
        own = model_reads(engine, 1, images, targets)
        calls = kit_reads(engine, 1, images, targets)
        assert len(calls) - own == 1, calls
    finally:
        dist.destroy_process_group()


# At most this many waits in a step of 8 images (issue 53's goal: torchvision's heads wait ~15 times an
# image). The batched heads wait to check the boxes, to settle the NMS and to size the heads' rows: 3
# reads, each counted as the read and the scalar under it.
WAIT_BUDGET = 12


def step_waits(tiny_coco, out, heads: str, batch: int) -> HostWaits:
    # 64 px: the waits are per image and per level, not per pixel
    cfg = fast_config(tiny_coco, out, **{"heads": heads, "batch-size": batch, "min-size": 64, "max-size": 64})
    train_set, _ = load_datasets(cfg)
    images, targets = (list(x) for x in zip(*(train_set[i] for i in range(batch))))
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=10)
    engine.train_step(0, images, targets)  # the first step also sets up the poolers' scales
    with HostWaits() as waits:
        engine.train_step(1, images, targets)
    return waits


@pytest.mark.slow  # eight training steps, four of them of eight images
def test_a_step_waits_a_few_times_whatever_the_batch(tiny_coco, tmp_path):
    batched = {batch: step_waits(tiny_coco, tmp_path / f"b{batch}", "batched", batch) for batch in (2, 8)}
    assert batched[8].total <= WAIT_BUDGET, batched[8].counts
    assert batched[8].total <= 1.5 * batched[2].total, (batched[2].counts, batched[8].counts)
    # The same count sees torchvision's heads wait image by image.
    reference = {batch: step_waits(tiny_coco, tmp_path / f"tv{batch}", "torchvision", batch) for batch in (2, 8)}
    assert reference[8].total > 2 * reference[2].total > 4 * batched[2].total, (
        reference[2].counts,
        reference[8].counts,
    )


@pytest.mark.slow
def test_a_non_finite_loss_stops_the_run_where_the_losses_are_read(tiny_coco, tmp_path):
    """The loss turns NaN at step 3; records print every 2 steps: step 2's record is written, the run stops
    at the read after step 4 naming step 3, writes no record of steps 3 and 4, and no checkpoint."""
    cfg = fast_config(tiny_coco, tmp_path, **{"max-steps": 6, "print-freq": 2, "checkpoint-period": 0})
    train_set, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    step = engine.train_micro_batches  # what the loop calls

    def poisoned(at: int, micro_batches):
        if at == 2:  # the third step (records count from 1)
            engine.model.roi_heads.box_predictor.cls_score.bias.data.fill_(float("nan"))
        return step(at, micro_batches)

    engine.train_micro_batches = poisoned
    with closing(run_metrics(cfg, True, cfg.total_steps(6))) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, 6, metrics)
        with pytest.raises(
            TrainingError, match=r"non-finite loss at step 3: .*loss_classifier=nan; .*stopped at step 4"
        ):
            trainer.fit()
    steps = [r["step"] for r in read_metrics(cfg.output_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2]
    assert not (cfg.output_dir / "checkpoints").exists() or not any((cfg.output_dir / "checkpoints").iterdir())
