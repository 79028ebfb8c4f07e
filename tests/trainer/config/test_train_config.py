"""The train table: YAML then flags over the defaults, YAML mistakes naming the file and key, a range for
every number, and the model a checkpoint's saved config rebuilds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from maskrcnn_dist.config import FIELDS, build_config
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.modeling.trained import saved_model_flags


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


NUMERIC = [s for s in FIELDS if s.kind in (int, float, tuple)]


@pytest.mark.parametrize("spec", NUMERIC, ids=[s.flag for s in NUMERIC])
def test_every_number_has_a_range_its_default_respects(spec, tmp_path: Path):
    """No numeric flag is left unbounded, the defaults are valid, and a value below the range is refused
    by the same check from the command line and from a --config file, naming the flag."""
    bounds = spec.bounds
    low = bounds.minimum if bounds.minimum is not None else bounds.above
    assert low is not None, f"--{spec.flag} has no lower bound"
    assert spec.problem(spec.default) is None
    below = low - 1 if spec.kind is not float or bounds.minimum is not None else low
    value = ",".join([str(below)]) if spec.kind is tuple else below
    with pytest.raises(ConfigError, match=f"--{spec.flag} must be"):
        build_config(None, {spec.flag: value})
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"{spec.flag}: {value}\n")
    with pytest.raises(ConfigError, match=f"c.yaml: --{spec.flag} must be"):
        build_config(config_file, {})


def test_a_checkpoint_rebuilds_its_model_without_the_files_it_started_from():
    saved = {"model": {"name": "maskrcnn_resnet18_fpn", "min_size": 96, "weights_backbone": "/gone/r18.pth"}}
    flags = saved_model_flags(saved)
    assert flags["model"] == "maskrcnn_resnet18_fpn" and flags["min-size"] == 96
    assert "weights-backbone" not in flags and flags["backbone-norm"] == "frozen"  # what "auto" meant then
    assert saved_model_flags({"model": {"backbone_norm": "auto"}})["backbone-norm"] == "batch"


@pytest.mark.parametrize("typed", [{"lr-steps": "3"}, {"lr-gamma": 0.5}, {"lr-steps": "3", "lr-gamma": 0.5}])
def test_a_schedule_flag_the_scheduler_never_reads_is_refused(typed: dict, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"--lr-(steps|gamma).* for --lr-scheduler multisteplr: cosineannealinglr"):
        build_config(None, {"lr-scheduler": "cosineannealinglr", **typed})
    (tmp_path / "run.yaml").write_text("lr-scheduler: cosineannealinglr\n")
    with pytest.raises(ConfigError, match="never reads"):
        build_config(tmp_path / "run.yaml", typed)
    # a recipe's steps are not the user's: cosine beside it is the user's choice of schedule
    assert build_config(None, {"recipe": "torchvision-v1", "lr-scheduler": "cosineannealinglr"}).optim.lr_steps


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{file}", "--data-cache {file} is a file; it takes a folder"),
        ("/dev/null", "--data-cache /dev/null is a device or other special file"),
        ("{file}/cache", "--data-cache {file}/cache: {file} is a file, so no folder can be made under it"),
        ("", "--data-cache '' names no folder (it would cache into the current folder)"),
        ("OFF", "--data-cache 'OFF': write off in lower case"),
        ("{loop}/cache", "--data-cache {loop}/cache: {loop}/cache: Too many levels of symbolic links"),
    ],
)
def test_a_data_cache_that_is_no_folder_is_refused_where_it_is_parsed(tmp_path: Path, value: str, message: str):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    names = {"file": tmp_path / "notes.txt", "loop": tmp_path / "loop"}
    value, message = value.format(**names), message.format(**names)
    with pytest.raises(ConfigError, match=re.escape(f"command line: {message}")):
        build_config(None, {"data-cache": value})
    (tmp_path / "run.yaml").write_text(f"data-cache: {value!r}\n")
    with pytest.raises(ConfigError, match=re.escape(f"run.yaml: {message}")):
        build_config(tmp_path / "run.yaml", {})
    assert build_config(None, {"data-cache": str(tmp_path / "new" / "cache")}).data.data_cache


@pytest.mark.parametrize("key", ["data-cache", "check-data"])
def test_a_bare_yaml_off_is_refused_naming_the_pitfall(tmp_path: Path, key: str):
    (tmp_path / "run.yaml").write_text(f"{key}: off\n")
    with pytest.raises(
        ConfigError, match=r"run.yaml: .*boolean false \(off, on, no and yes are booleans there\): quote"
    ):
        build_config(tmp_path / "run.yaml", {})
    (tmp_path / "run.yaml").write_text(f'{key}: "off"\n')
    assert build_config(tmp_path / "run.yaml", {})


@pytest.mark.parametrize("engine", ["local", "pipeline"])
def test_elastic_is_refused_outside_ddp(engine: str):
    """--elastic regroups a ddp job's ranks; elsewhere it would do nothing, silently."""
    with pytest.raises(ConfigError, match=f"--elastic is for --engine ddp: .*--engine {engine} has none"):
        build_config(None, {"elastic": True, "engine": engine})
    assert build_config(None, {"elastic": True, "engine": "ddp"}).peers.elastic


@pytest.mark.parametrize("flag", [{"elastic-min-size": 2}, {"elastic-min-wait": 30.0}])
def test_the_elastic_rules_are_refused_outside_elastic(flag: dict):
    """--elastic-min-size and --elastic-min-wait are rules of an elastic group; without one they would do
    nothing, silently."""
    with pytest.raises(ConfigError, match="--elastic-min-size and --elastic-min-wait are rules of an elastic group"):
        build_config(None, {**flag, "engine": "ddp"})
    peers = build_config(None, {**flag, "engine": "ddp", "elastic": True}).peers
    assert (peers.elastic_min_size, peers.elastic_min_wait) != (1, 300.0)


def test_an_elastic_minimum_above_the_jobs_ranks_is_refused():
    from maskrcnn_dist.engines.elastic_ddp import elastic_session

    cfg = build_config(None, {"engine": "ddp", "elastic": True, "elastic-min-size": 4})
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "3"}
    with pytest.raises(ConfigError, match="--elastic-min-size 4 is more than the job's 3 ranks"):
        with elastic_session(cfg, env):
            pass
