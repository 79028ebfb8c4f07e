"""--recipe: torchvision's published recipes expand under the flags given beside them."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskrcnn_dist.config import BY_FLAG, RECIPES, TrainConfig, apply_overrides, build_config
from maskrcnn_dist.errors import ConfigError


def test_the_v2_recipe_sets_the_published_command():
    cfg = build_config(None, {"recipe": "torchvision-v2"})
    assert (cfg.model.name, cfg.epochs, cfg.optim.lr_steps) == ("maskrcnn_resnet50_fpn_v2", 400, (352, 384))
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.sync_bn) == (0.1, 4e-5, True)
    assert cfg.model.backbone_norm == "batch" and cfg.recipe == "torchvision-v2"
    assert cfg.data.data_augmentation == "lsj"


def test_flags_beside_the_recipe_win_on_the_command_line_and_in_the_file(tmp_path: Path):
    assert build_config(None, {"recipe": "torchvision-v1", "lr": 0.005}).optim.lr == 0.005
    config_file = tmp_path / "train.yaml"
    config_file.write_text("recipe: torchvision-v2\nepochs: 12\n")
    from_file = build_config(config_file, {})
    assert (from_file.epochs, from_file.model.name) == (12, "maskrcnn_resnet50_fpn_v2")
    # The command line's recipe replaces the file's; the file's own flags still win over it.
    both = build_config(config_file, {"recipe": "torchvision-v1"})
    assert (both.epochs, both.model.name, both.sync_bn) == (12, "maskrcnn_resnet50_fpn", False)


def test_no_recipe_leaves_the_defaults():
    assert build_config(None, {}) == TrainConfig()


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_is_valid_flags(name: str):
    assert set(RECIPES[name]) <= set(BY_FLAG)
    apply_overrides(TrainConfig(engine="ddp"), RECIPES[name], name).validate()


def test_an_unknown_recipe_names_the_flag_and_the_choices():
    with pytest.raises(ConfigError, match="--recipe must be one of torchvision-v1, torchvision-v2"):
        build_config(None, {"recipe": "detectron2"})


# ---------------------------------------------------------------------------------------------------
# an error a recipe's setting causes names the recipe and the flag that overrides it


@pytest.mark.parametrize(
    ("flags", "says", "never"),
    [
        ({"engine": "pipeline"}, ["--recipe torchvision-v2 sets --sync-bn", "add --no-sync-bn"], []),
        # the fix is the recipe's flag off, not the BatchNorm the user chose
        (
            {"backbone-norm": "frozen"},
            ["--recipe torchvision-v2 sets --sync-bn", "add --no-sync-bn"],
            ["--backbone-norm batch"],
        ),
        (
            {"engine": "pipeline", "no-sync-bn": None, "sync-bn": False, "micro-batches": 4},
            ["--micro-batches 4 > --batch-size 2", "--recipe torchvision-v2 sets --batch-size 2", "give --batch-size"],
            [],
        ),
    ],
    ids=["pipeline", "frozen", "batch-size"],
)
def test_a_rule_a_recipe_breaks_names_the_recipe_and_the_flag(flags: dict, says: list[str], never: list[str]):
    flags = {k: v for k, v in flags.items() if v is not None}
    with pytest.raises(ConfigError) as raised:
        build_config(None, {"recipe": "torchvision-v2", **flags})
    message = str(raised.value)
    for fragment in says:
        assert fragment in message
    for fragment in never:
        assert fragment not in message


def test_a_rule_the_typed_flags_break_keeps_its_words(tmp_path: Path):
    with pytest.raises(ConfigError, match="--sync-bn is for --engine ddp") as raised:
        build_config(None, {"sync-bn": True, "engine": "pipeline"})
    assert "--recipe" not in str(raised.value)
    # a recipe in the YAML file, the flag typed: the typed flag is the one to change
    (tmp_path / "run.yaml").write_text("recipe: torchvision-v2\n")
    with pytest.raises(ConfigError, match="--sync-bn with frozen BatchNorm.*add --backbone-norm batch") as raised:
        build_config(tmp_path / "run.yaml", {"sync-bn": True, "backbone-norm": "frozen"})
    assert "--recipe" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"\(--recipe torchvision-v1 sets --data-augmentation hflip: give"):
        build_config(None, {"recipe": "torchvision-v1", "use-copypaste": True})


def test_the_one_error_line_of_a_recipe_on_the_pipeline(console):
    result = console("maskrcnn-dist", "train", "--recipe", "torchvision-v2", "--engine", "pipeline")
    result.assert_one_error_line(2, "--recipe torchvision-v2 sets --sync-bn", "--no-sync-bn")


# ---------------------------------------------------------------------------------------------------
# a checkpoint's model over a recipe's


@pytest.fixture
def r18_checkpoint(tmp_path: Path) -> Path:
    """A kit checkpoint of the small model (what eval --resume and --weights read of one; no weights)."""
    import torch

    from maskrcnn_dist.checkpoint import FORMAT_VERSION
    from maskrcnn_dist.modeling.model import CLASS_SCORE_WEIGHT
    from maskrcnn_dist.modeling.trained import TRAINED_MODEL_KEY

    settings = {"model": "maskrcnn_resnet18_fpn", "backbone-norm": "frozen", "min-size": 96, "max-size": 96}
    state = {
        "format_version": FORMAT_VERSION,
        "model": {CLASS_SCORE_WEIGHT: torch.zeros(4, 8)},
        TRAINED_MODEL_KEY: {"settings": settings, "exif_orientation": "auto", "data_flags": {}, "data": None},
    }
    path = tmp_path / "checkpoints" / "checkpoint_00000001.pt"
    path.parent.mkdir()
    torch.save(state, path)
    return path


@pytest.mark.parametrize("reading", ["weights", "resume"])
def test_a_recipes_model_never_replaces_the_checkpoints(r18_checkpoint: Path, tmp_path: Path, reading: str):
    from maskrcnn_dist.modeling.trained import train_command_config

    given = {reading: r18_checkpoint, "recipe": "torchvision-v2", "output-dir": tmp_path / "run"}
    if reading == "resume":
        given["test-only"] = True
    with pytest.raises(ConfigError) as raised:
        train_command_config(None, given)
    message = str(raised.value)
    assert message.startswith(
        f"--model maskrcnn_resnet50_fpn_v2 (set by --recipe torchvision-v2) contradicts --{reading} "
    )
    assert "its weights are a maskrcnn_resnet18_fpn; add --model maskrcnn_resnet18_fpn" in message
    # With --model the recipe's other flags apply; its BatchNorm yields to the checkpoint's (the weights'),
    # and its --sync-bn, which frozen BatchNorm cannot take, is named as the recipe's.
    with pytest.raises(ConfigError, match="--recipe torchvision-v2 sets --sync-bn.*add --no-sync-bn"):
        train_command_config(None, {**given, "model": "maskrcnn_resnet18_fpn"})
    cfg = train_command_config(None, {**given, "model": "maskrcnn_resnet18_fpn", "sync-bn": False})
    assert (cfg.model.name, cfg.model.backbone_norm, cfg.optim.lr) == ("maskrcnn_resnet18_fpn", "frozen", 0.1)
