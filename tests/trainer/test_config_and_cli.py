"""Configuration precedence and the CLI's one-line errors for user mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from maskrcnn_dist.cli import main
from maskrcnn_dist.config import BY_FLAG, build_config
from maskrcnn_dist.errors import ConfigError


def test_yaml_then_flags_override_defaults(tmp_path: Path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("batch-size: 8\nlr: 0.005\nlr_steps: [3, 5]\namp: true\nmodel: maskrcnn_resnet18_fpn\n")
    cfg = build_config(config_file, {"lr": 0.001, "epochs": None})
    assert cfg.data.batch_size == 8  # from YAML
    assert cfg.optim.lr == 0.001  # the flag wins
    assert cfg.optim.lr_steps == (3, 5) and cfg.amp is True
    assert cfg.epochs == 26  # untouched default (torchvision's schedule)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("batch-szie: 4\n", r"c.yaml: unknown key\(s\) batch-szie"),
        ("epochs: many\n", r"c.yaml: epochs: value 'many' does not fit"),
        ("- a list\n", r"c.yaml: must hold a mapping"),
        ("lr: [unclosed\n", r"c.yaml: not valid YAML"),
        ("batch-size: 0\n", r"--batch-size must be >= 1"),
    ],
)
def test_bad_yaml_names_file_and_key(tmp_path: Path, content: str, message: str):
    config_file = tmp_path / "c.yaml"
    config_file.write_text(content)
    with pytest.raises(ConfigError, match=message):
        build_config(config_file, {})


def test_every_flag_is_on_the_cli():
    help_text = CliRunner().invoke(main, ["train", "--help"]).output
    for flag in BY_FLAG:
        assert f"--{flag}" in help_text


def test_synth_data_and_report_commands(tmp_path: Path):
    runner = CliRunner()
    made = runner.invoke(
        main,
        [
            "synth-data",
            "--output",
            str(tmp_path / "d"),
            "--train-images",
            "3",
            "--val-images",
            "2",
            "--image-size",
            "64",
        ],
    )
    assert made.exit_code == 0, made.output
    assert (tmp_path / "d/train/annotations.json").is_file() and (tmp_path / "d/val/images").is_dir()
    missing = runner.invoke(main, ["report", "--metrics", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl does not exist" in missing.output
