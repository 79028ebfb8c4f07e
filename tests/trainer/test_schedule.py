"""--lr-scheduler and --norm-weight-decay: the references' meaning, the default unchanged, an exact resume."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torch import nn
from torchvision.ops._utils import split_normalization_params

from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.config import ModelConfig, OptimConfig
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.modeling.optim import build_optimizer, build_scheduler, load_optimizer_state, lr_factor
from maskrcnn_dist.train import train
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import fast_config
from .test_train_local import train_only_coco  # noqa: F401 -- the fixture, shared

SMALL_BATCH_NORM = ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=64, backbone_norm="batch")


@pytest.mark.slow
def test_cosine_follows_torchs_cosine_annealing_stepped_at_epoch_ends():
    """torchvision's reference: CosineAnnealingLR(T_max=epochs), stepped once per epoch, is the oracle."""
    cfg = OptimConfig(lr=1.0, warmup_iters=0, lr_scheduler="cosineannealinglr")
    iters, epochs = 3, 5
    oracle_opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    oracle = torch.optim.lr_scheduler.CosineAnnealingLR(oracle_opt, T_max=epochs)
    for epoch in range(epochs):
        for batch in range(iters):
            assert lr_factor(epoch * iters + batch, cfg, iters, epochs * iters) == pytest.approx(
                oracle.get_last_lr()[0]
            )
        oracle_opt.step()
        oracle.step()


def test_cosine_over_the_epochs_max_steps_reaches_into():
    cfg = OptimConfig(lr=1.0, warmup_iters=0, lr_scheduler="cosineannealinglr")
    # 10 steps of 4 per epoch: 3 epochs, the last one cut short.
    assert [lr_factor(s, cfg, 4, 10) for s in (0, 4, 8)] == pytest.approx([1.0, 0.75, 0.25])


def test_warm_up_multiplies_the_cosine():
    cfg = OptimConfig(lr=1.0, warmup_iters=10, warmup_factor=0.001, lr_scheduler="cosineannealinglr")
    assert lr_factor(5, cfg, 4, 16) == pytest.approx(0.5005 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_default_optimizer_is_todays_one_group():
    """No --norm-weight-decay: SGD over the trainable parameters in one group, as before the flag; fused,
    its momenta zeros from the start (what its first step makes: a skipped first step keeps them)."""
    model = build_model(SMALL_BATCH_NORM, num_classes=3)
    cfg = OptimConfig()
    trainable = [p for p in model.parameters() if p.requires_grad]
    before = torch.optim.SGD(trainable, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    built = build_optimizer(model, cfg).state_dict()
    implementation = ("fused", "foreach")
    layout = [{k: v for k, v in g.items() if k not in implementation} for g in built["param_groups"]]
    assert layout == [
        {k: v for k, v in g.items() if k not in implementation} for g in before.state_dict()["param_groups"]
    ]
    assert built["param_groups"][0]["fused"] is True
    assert [i for i in built["state"]] == list(range(len(trainable)))
    assert all(not s["momentum_buffer"].any() for s in built["state"].values())


def test_a_checkpoint_of_the_foreach_optimizer_resumes_into_the_fused_one():
    model = build_model(SMALL_BATCH_NORM, num_classes=3)
    cfg = OptimConfig()
    old = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, momentum=cfg.momentum)
    optimizer = build_optimizer(model, cfg)
    load_optimizer_state(optimizer, old.state_dict())
    assert optimizer.param_groups[0]["fused"] is True and optimizer.param_groups[0]["lr"] == 0.5


def test_norm_weight_decay_applies_to_the_normalization_layers_only():
    model = build_model(SMALL_BATCH_NORM, num_classes=3)
    groups = build_optimizer(model, OptimConfig(weight_decay=1e-4, norm_weight_decay=0.0)).param_groups
    norm, other = split_normalization_params(model)
    assert [g["weight_decay"] for g in groups] == [0.0, 1e-4]
    assert [list(map(id, g["params"])) for g in groups] == [list(map(id, norm)), list(map(id, other))]
    batch_norms = {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
    assert {id(p) for p in groups[0]["params"]} == batch_norms and batch_norms


def test_schedule_state_is_one_counter():
    """The scheduler's state dict (what a checkpoint keeps) holds nothing of the rate function: only the
    position and base rates; a checkpoint of another run's settings leaves this run's schedule as it is."""
    model = nn.Linear(2, 2)
    optimizer = build_optimizer(model, OptimConfig(norm_weight_decay=0.0))
    scheduler = build_scheduler(optimizer, OptimConfig(lr_scheduler="cosineannealinglr"), 4, 16)
    state = scheduler.state_dict()
    assert state["last_epoch"] == 0 and state["lr_lambdas"] == [{}]
    other = build_scheduler(build_optimizer(model, OptimConfig(norm_weight_decay=0.0)), OptimConfig(), 4, 16)
    other.load_state_dict(state)
    assert other.lr_lambdas[0].keywords["cfg"].lr_scheduler == "multisteplr"
    old = dict(state, lr_lambdas=[None])  # what checkpoints of the closure's days hold
    scheduler.load_state_dict(old)


def test_the_scheduler_pickles():
    """A pipeline stage's scheduler must survive TensorPipe's pickle walk of what it sends
    (engines/pipeline/guard.py): its rate function is a module-level function, not a closure."""
    model = nn.Linear(2, 2)
    scheduler = build_scheduler(build_optimizer(model, OptimConfig()), OptimConfig(warmup_iters=3), 4, 16)
    copy = pickle.loads(pickle.dumps(scheduler))
    assert [copy.lr_lambdas[0](i) for i in range(6)] == [
        lr_factor(i, OptimConfig(warmup_iters=3), 4, 16) for i in range(6)
    ]


@pytest.mark.slow
def test_resume_restores_the_cosine_and_the_param_groups(train_only_coco, tmp_path):  # noqa: F811
    """Stopped at step 4 and resumed, a cosine run with two param groups gives the uninterrupted run's
    rates at every step and its optimizer and scheduler at the end. At 64 px: the schedule is the
    state's, whatever the size."""
    common = {
        "min-size": 64,
        "max-size": 64,
        "epochs": 2,
        "checkpoint-period": 4,
        "lr-scheduler": "cosineannealinglr",
        "norm-weight-decay": 0.0,
        "backbone-norm": "batch",
        "warmup-iters": 2,
    }
    straight = fast_config(train_only_coco, tmp_path / "straight", **common, **{"max-steps": 9})
    train(straight)
    train(fast_config(train_only_coco, tmp_path / "resumed", **common, **{"max-steps": 4}))
    resumed = fast_config(train_only_coco, tmp_path / "resumed", **common, **{"max-steps": 9, "resume": "auto"})
    train(resumed)

    def rates(cfg) -> dict[int, float]:
        return {r["step"]: r["lr"] for r in read_metrics(cfg.output_dir / "metrics.jsonl") if r["kind"] == "train"}

    expected, got = rates(straight), rates(resumed)
    assert [got[s] for s in range(5, 10)] == [expected[s] for s in range(5, 10)]
    assert expected[6] < expected[5]  # the cosine moved at the epoch end (6 batches an epoch)
    want, have = (load_checkpoint(c.output_dir / "checkpoints") for c in (straight, resumed))
    assert have["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in have["optimizer"]["param_groups"]] == [0.0, straight.optim.weight_decay]
    assert have["scheduler"] == want["scheduler"]
