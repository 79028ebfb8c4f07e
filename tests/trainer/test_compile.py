"""--compile (modeling/compiled.py): the backbone compiled in place, or eager with one line saying why.

A compiled step computes what the eager step computes up to the order of floating-point sums (inductor
fuses and reorders), so a run resumed with or without --compile continues within rounding of the other:
measured on this CPU (fp32, ResNet-18 FPN at 96 px, BatchNorm with batch statistics, a checkpoint after
step 1): the first step after it within 3.4e-7 relative on every loss term, the second (one update
later) within 2.9e-3; after both, all parameters as one vector 8.5e-5 of its norm apart (images of
72-96 px). The run takes square images: every batch is one shape, so each engine compiles once (a second
shape recompiles with dynamic shapes: 248 s of a cold CI run went to this test). Tolerances
(LOSS_TOLERANCE, PARAMETER_TOLERANCE): 1e-5 and 2e-2 on the losses, 1e-3 on the parameters. A compiled run resumed
compiled repeats the uninterrupted compiled run exactly.
"""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch._inductor import config as inductor_config

from maskrcnn_dist.config import build_config
from maskrcnn_dist.data import load_datasets, write_train_val
from maskrcnn_dist.engines.base import read_losses
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.modeling.compiled import compile_backbone, compiler_problem
from maskrcnn_dist.modeling.model import build_model

from .conftest import fast_config


@pytest.fixture(scope="module")
def square_coco(tmp_path_factory: pytest.TempPathFactory):
    """8 training images of 96 x 96 px (and one to validate on): one batch shape."""
    root = tmp_path_factory.mktemp("square_coco")
    write_train_val(root, num_train=8, num_val=1, seed=3, image_size=96, max_objects=3)
    return root


LOSS_TOLERANCE = (1e-5, 2e-2)  # relative, each loss term: the first step after the checkpoint, the second
PARAMETER_TOLERANCE = 1e-3  # of the parameters' norm (all of them as one vector), after both steps


@pytest.mark.slow
def test_without_a_cpp_compiler_the_backbone_stays_eager_with_one_line(tiny_coco, tmp_path, caplog):
    cpu = torch.device("cpu")
    model = build_model(fast_config(tiny_coco, tmp_path).model, num_classes=3)
    # inductor's own patch, not monkeypatch: undoing a monkeypatch deletes the setting, which hides it.
    with inductor_config.patch({"cpp.cxx": ("no-such-compiler-37",)}), caplog.at_level(logging.WARNING):
        assert "no C++ compiler" in compiler_problem(cpu)
        assert compile_backbone(model, cpu) is False
    assert model.backbone._compiled_call_impl is None  # eager
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "--compile" in lines[0] and "no C++ compiler" in lines[0], lines


def test_without_a_c_compiler_triton_is_not_used(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    assert "no C compiler for Triton" in compiler_problem(torch.device("cuda", 0))


def test_compile_is_refused_for_the_pipeline_engine():
    with pytest.raises(ConfigError, match="--compile is for --engine local and ddp"):
        build_config(None, {"compile": True, "engine": "pipeline"}).validate()
    assert not build_config(None, {}).compile  # off unless asked: it does not pay on the CPUs measured


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two compiles of the backbone, forward and backward: minutes on 2 shared cores
@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_a_compiled_run_resumed_with_or_without_compile_continues_alike(square_coco, tmp_path):
    """Steps 0-1 compiled, a checkpoint (the engine's state through torch.save, as checkpoint.py writes
    it), then steps 2-3: by the same engine, by a fresh compiled engine and by a fresh eager one."""
    cfg = fast_config(square_coco, tmp_path, compile=True)
    train_set, _ = load_datasets(cfg)
    batches = [tuple(zip(*(train_set[i] for i in range(j, j + 2)))) for j in range(0, 8, 2)]

    def steps(engine: TorchEngine, numbers: range) -> list[dict[str, float]]:
        return [read_losses(engine.train_step(s, list(batches[s][0]), list(batches[s][1]))) for s in numbers]

    straight = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    assert straight.compiled
    steps(straight, range(2))
    saved = io.BytesIO()
    torch.save(straight.state_dict(), saved)
    continued = steps(straight, range(2, 4))
    resumed = {}
    for compiled in (True, False):
        cfg.compile = compiled
        engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
        saved.seek(0)
        engine.load_state_dict(torch.load(saved, weights_only=True))
        resumed[compiled] = (steps(engine, range(2, 4)), engine.state_dict()["model"])
    assert resumed[True][0] == continued  # exact
    for step, tolerance in enumerate(LOSS_TOLERANCE):
        for term, expected in continued[step].items():
            value = resumed[False][0][step][term]
            assert abs(value - expected) <= tolerance * abs(expected), (step, term, value, expected)
    # The whole model's parameters as one vector: a tensor that starts at zero (a BatchNorm bias) has moved
    # by two small updates only, and rounding differences are large against that alone.
    keys = [k for k, v in resumed[True][1].items() if v.is_floating_point()]
    compiled_vector = torch.cat([resumed[True][1][k].flatten() for k in keys])
    eager_vector = torch.cat([resumed[False][1][k].flatten() for k in keys])
    difference = float((eager_vector - compiled_vector).norm() / compiled_vector.norm())
    print(f"compiled vs eager after the resume: parameters {difference:.1e} of their norm apart")
    assert difference <= PARAMETER_TOLERANCE, difference


@pytest.mark.slow
@pytest.mark.skipif(compiler_problem(torch.device("cpu")) is not None, reason="no C++ compiler for inductor")
def test_compiled_engine_reports_its_graph_breaks(tiny_coco, tmp_path):
    cfg = fast_config(tiny_coco, tmp_path, compile=True)
    engine = TorchEngine(cfg, num_classes=3, iters_per_epoch=1)
    assert engine.compiled and engine.model.backbone._compiled_call_impl is not None
    assert set(engine.extra_metrics()) == {"compile/graph_breaks"}
    cfg.compile = False
    assert TorchEngine(cfg, num_classes=3, iters_per_epoch=1).extra_metrics() == {}
