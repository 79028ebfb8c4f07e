"""The trained model (modeling/trained.py): every tool rebuilds a run's model from its checkpoint alone,
flags override it with a logged line, another --model is one error line, and plain torchvision rebuilds
it from the docs' snippet with predict's detections."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from maskrcnn_dist.categories import Categories
from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.config import build_config
from maskrcnn_dist.data.prepare import open_split
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.modeling.trained import TRAINED_MODEL_KEY, TrainedModel, train_command_config
from maskrcnn_dist.outputs.predictor import load_predictor
from maskrcnn_dist.train import train
from maskrcnn_dist.training.metrics import read_metrics

from ..conftest import fast_config
from .conftest import the_error_line

DOCS_PAGE = Path(__file__).parents[3] / "docs" / "predict-and-report.md"
SNIPPET_HEADING = "## Without the kit: plain torchvision"
SNIPPET_CHECKPOINT = '"runs/demo/checkpoints/best.pt"'


def run_dir(checkpoint: Path) -> Path:
    return checkpoint.parent.parent


def test_eval_resume_rebuilds_the_model_and_finds_the_data_from_the_checkpoint(trained: Path, tmp_path: Path):
    """A small R18 at 96 px: no --model, sizes or --data-path given, the run's last AP exactly."""
    last = [r for r in read_metrics(run_dir(trained) / "metrics.jsonl") if r["kind"] == "eval"][-1]
    cfg = train_command_config(
        None, {"resume": trained, "test-only": True, "output-dir": tmp_path / "eval", "workers": 0}
    )
    assert (cfg.model.name, cfg.model.min_size, cfg.model.max_size) == ("maskrcnn_resnet18_fpn", 96, 96)
    result = train(cfg).eval
    assert result is not None and result["segm_AP50"] > 0
    assert {k: result[k] for k in result if k.endswith(("AP", "AP50"))} == {
        k: last[k] for k in result if k.endswith(("AP", "AP50"))
    }


def test_a_checkpoint_without_the_record_is_rebuilt_from_its_config(trained: Path, tmp_path: Path):
    old = torch.load(trained, weights_only=True)
    del old[TRAINED_MODEL_KEY]
    torch.save(old, tmp_path / "old.pt")
    predictor = load_predictor({"resume": tmp_path / "old.pt", "device": "cpu"})
    assert predictor.engine.cfg.model.name == "maskrcnn_resnet18_fpn"
    assert predictor.trained_data_flags().get("data-path") is not None


def test_a_relative_data_path_is_recorded_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run started with `--data-path data` in one folder: `eval --resume` from another finds the data."""
    monkeypatch.chdir(tmp_path)
    cfg = build_config(None, {"data-path": "data", "train-annotations": "data/a.json", "val-fraction": 0.25})
    record = TrainedModel.of_run(cfg, Categories.by_index(2), None)
    assert record.data_flags == {
        "data-path": str(tmp_path / "data"),
        "train-annotations": str(tmp_path / "data" / "a.json"),
        "val-fraction": 0.25,
        "seed": cfg.seed,
    }


def _cli(*args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, "-m", "maskrcnn_dist.cli", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)


def test_eval_resume_with_another_model_is_one_error_line(trained: Path, tmp_path: Path):
    result = _cli("eval", "--resume", trained, "--model", "maskrcnn_resnet50_fpn", "--output-dir", tmp_path / "e")
    line = the_error_line(result)
    assert re.fullmatch(r"error: --model maskrcnn_resnet50_fpn contradicts --resume .* maskrcnn_resnet18_fpn.*", line)


def test_weights_of_a_kit_checkpoint_fine_tune_without_repeating_the_model_flags(
    trained: Path, sparse_coco: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    given = {"weights": trained, "data-path": sparse_coco, "output-dir": tmp_path / "ft", "workers": 0}
    with caplog.at_level(logging.INFO, logger="maskrcnn_dist.modeling.trained"):
        cfg = train_command_config(None, {**given, "max-steps": 1, "min-size": 80, "max-size": 96})
    assert (cfg.model.name, cfg.model.min_size) == ("maskrcnn_resnet18_fpn", 80)
    overrides = [r.getMessage() for r in caplog.records if "used instead of" in r.getMessage()]
    assert overrides == [f"--min-size 80 given: used instead of --weights {trained}'s 96"]
    assert train(cfg).position.step == 1  # the file fits: no key list

    with pytest.raises(ConfigError, match=r"--model maskrcnn_resnet50_fpn contradicts --weights .*"):
        train_command_config(None, {**given, "model": "maskrcnn_resnet50_fpn"})


def test_predict_export_and_gallery_read_the_one_orientation_rule_of_the_checkpoint(
    trained: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    state = torch.load(trained, weights_only=True)
    state[TRAINED_MODEL_KEY]["exif_orientation"] = "ignore"
    torch.save(state, tmp_path / "ignore.pt")
    # predict, export and the gallery all load through load_predictor and read its config's rule
    predictor = load_predictor({"resume": tmp_path / "ignore.pt", "device": "cpu"})
    assert predictor.engine.cfg.data.exif_orientation == "ignore"
    with caplog.at_level(logging.INFO, logger="maskrcnn_dist.modeling.trained"):
        flagged = load_predictor({"resume": tmp_path / "ignore.pt", "device": "cpu", "exif-orientation": "apply"})
    assert flagged.engine.cfg.data.exif_orientation == "apply"
    assert [r for r in caplog.records if "--exif-orientation apply given" in r.getMessage()]


# ---------------------------------------------------------------------------------------------------
# plain torchvision, from the docs' own text


def docs_snippet() -> str:
    """The python block under SNIPPET_HEADING in docs/predict-and-report.md."""
    text = DOCS_PAGE.read_text()
    section = text[text.index(SNIPPET_HEADING) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None and SNIPPET_CHECKPOINT in match.group(1)
    return match.group(1)


@pytest.fixture(scope="module")
def r50_checkpoint(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One step of maskrcnn_resnet50_fpn at 96 px: its random-ish scores still give many detections."""
    out = tmp_path_factory.mktemp("r50_run")
    cfg = fast_config(tiny_coco, out, model="maskrcnn_resnet50_fpn", **{"max-steps": 1, "val-period": 0})
    train(cfg)
    checkpoint = latest_checkpoint(out / "checkpoints")
    assert checkpoint is not None
    return checkpoint


# Run by a plain Python with the docs' snippet: torchvision only, the kit never imported.
PLAIN_RUNNER = """
import sys
import torch
{snippet}
images = torch.load(sys.argv[1], weights_only=True)
with torch.no_grad():
    torch.save([model([image])[0] for image in images], sys.argv[2])
print(names[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("which", ["maskrcnn_resnet50_fpn", "maskrcnn_resnet18_fpn"])
def test_the_docs_plain_torchvision_snippet_gives_predicts_detections(
    which: str, request: pytest.FixtureRequest, sparse_coco: Path, tmp_path: Path
):
    checkpoint = request.getfixturevalue("r50_checkpoint" if which == "maskrcnn_resnet50_fpn" else "trained")
    assert load_checkpoint(checkpoint)[TRAINED_MODEL_KEY]["settings"]["model"] == which
    val = open_split(build_config(None, {"data-path": sparse_coco}), "val")
    images = [val[index][0] for index in range(len(val))]
    torch.save(images, tmp_path / "images.pt")
    runner = tmp_path / "plain.py"
    runner.write_text(PLAIN_RUNNER.format(snippet=docs_snippet().replace(SNIPPET_CHECKPOINT, repr(str(checkpoint)))))
    plain = subprocess.run(
        [sys.executable, str(runner), str(tmp_path / "images.pt"), str(tmp_path / "theirs.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        # No kit on the path; this process's thread count: another sums in another order, off in the last bit.
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "OMP_NUM_THREADS": str(torch.get_num_threads()),
        },
    )
    assert plain.returncode == 0, plain.stderr
    predictor = load_predictor({"resume": checkpoint, "device": "cpu"})
    compared = 0
    for image, theirs in zip(images, torch.load(tmp_path / "theirs.pt", weights_only=True), strict=True):
        (ours,) = predictor.predict([image])
        assert theirs.keys() == ours.keys()
        for key in ours:
            assert torch.equal(theirs[key], ours[key]), key  # to the bit
        compared += len(ours["boxes"])
    assert compared > 0  # detections to compare, not empty lists
    assert plain.stdout.strip() == predictor.categories.names[1]
