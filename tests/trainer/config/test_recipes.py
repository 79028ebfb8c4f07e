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
