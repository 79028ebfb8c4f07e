"""trainer.data: the data flags (a folder as exported, or an annotation file and an image folder per
split) rendered into every trainer's arguments, before trainer.args; the same flags in both refused."""

from __future__ import annotations

from maskrcnn_launcher.yamlfile import load_yaml_all

from .objects import pod_templates, trainer

SPLITS = {
    "trainAnnotations": "/data/cvat/annotations/instances_Train.json",
    "trainImages": "/data/cvat/images/Train",
    "valAnnotations": "/data/cvat/annotations/instances_Validation.json",
    "valImages": "/data/cvat/images/Validation",
}


def _trainer_args(template_values, data: dict) -> list[list[str]]:
    proc = template_values({"trainer": {"data": data, "args": ["--output-dir", "/data/runs/x"]}})
    assert proc.returncode == 0, proc.stderr
    templates = pod_templates([o for o in load_yaml_all(proc.stdout) if o])
    return [trainer(t)["args"][4:] for t in templates.values()]


def test_split_values_become_the_trainer_flags_on_every_pod(template_values) -> None:
    every = _trainer_args(template_values, {**SPLITS, "crowdAsInstances": True})
    assert every and all(args == every[0] for args in every)
    args = every[0]
    for key, flag in (
        ("trainAnnotations", "--train-annotations"),
        ("trainImages", "--train-images"),
        ("valAnnotations", "--val-annotations"),
        ("valImages", "--val-images"),
    ):
        assert args[args.index(flag) + 1] == SPLITS[key]
    assert "--crowd-as-instances" in args and args[-2:] == ["--output-dir", "/data/runs/x"]


def test_data_path_and_val_fraction(template_values) -> None:
    (args, *_) = _trainer_args(template_values, {"path": "/data/label-studio", "valFraction": 0.2})
    assert args[:4] == ["--data-path", "/data/label-studio", "--val-fraction", "0.2"]
    assert "--crowd-as-instances" not in args


def _rendered_args(template_values, trainer_values: dict) -> list[str]:
    proc = template_values({"trainer": trainer_values})
    assert proc.returncode == 0, proc.stderr
    (template, *_) = pod_templates([o for o in load_yaml_all(proc.stdout) if o]).values()
    return trainer(template)["args"][4:]


def test_split_keys_alone_train_with_the_default_args(template_values) -> None:
    """One --set per split, nothing else: the default data folder gives way (beside split flags the
    trainer refuses a --data-path that does not hold those splits), the default --output-dir and
    --resume stay."""
    args = _rendered_args(template_values, {"data": SPLITS})
    assert "--data-path" not in args and args[args.index("--train-annotations") + 1] == SPLITS["trainAnnotations"]
    assert args[-4:] == ["--output-dir", "/data/runs/t", "--resume", "auto"]


def test_a_data_flag_in_trainer_args_replaces_the_default_folder(template_values) -> None:
    for given in (["--data-path", "/data/mine"], ["--data-path=/data/mine"], ["--train-annotations", "/d/a.json"]):
        args = _rendered_args(template_values, {"args": [*given, "--output-dir", "/data/runs/x"]})
        assert args == [*given, "--output-dir", "/data/runs/x"], args


def test_the_default_is_the_coco_folder(template_values) -> None:
    assert _rendered_args(template_values, {})[:2] == ["--data-path", "/data/coco"]


def test_data_in_both_places_is_refused(template_values) -> None:
    for data, args in (
        ({"valFraction": 0.2}, ["--data-path", "/data/x"]),
        ({"trainAnnotations": "/d/a.json", "trainImages": "/d/img"}, ["--train-annotations=/d/b.json"]),
    ):
        proc = template_values({"trainer": {"data": data, "args": args}})
        assert proc.returncode != 0 and "trainer.data and trainer.args both name the data" in proc.stderr


def test_the_schema_refuses_a_fraction_out_of_range_and_unknown_keys(template_values) -> None:
    assert template_values({"trainer": {"data": {"valFraction": 1}, "args": []}}).returncode != 0
    assert template_values({"trainer": {"data": {"trainAnnotation": "x"}, "args": []}}).returncode != 0


def test_a_cache_folder_becomes_the_data_cache_flag_beside_the_default_data(template_values) -> None:
    """`cache` names where the parsed annotations are kept, not the data: the default folder stays."""
    args = _rendered_args(template_values, {"data": {"cache": "/scratch/cache"}})
    assert args[args.index("--data-cache") + 1] == "/scratch/cache"
    assert args[args.index("--data-path") + 1] == "/data/coco"
    assert "--data-cache" not in _rendered_args(template_values, {})  # unset: the trainer's own auto
    assert template_values({"trainer": {"data": {"cache": ""}, "args": []}}).returncode != 0


def test_a_cache_folder_names_no_data(template_values) -> None:
    """The cache sits beside a data flag in trainer.args (which the default folder gives way to), and
    --data-cache in trainer.args beside the default folder is as before; only the cache in both places is
    refused."""
    args = _rendered_args(template_values, {"data": {"cache": "off"}, "args": ["--data-path", "/data/mine"]})
    assert args == ["--data-cache", "off", "--data-path", "/data/mine"]
    args = _rendered_args(template_values, {"args": ["--data-cache", "off"]})
    assert args == ["--data-path", "/data/coco", "--data-cache", "off"]
    both = template_values({"trainer": {"data": {"cache": "/c"}, "args": ["--data-cache=off"]}})
    assert both.returncode != 0 and "give the cache folder in one place" in both.stderr


def test_a_cache_value_yaml_read_as_a_boolean_or_in_capitals_is_refused_with_the_fix(template_values) -> None:
    """`cache: off` unquoted is YAML's false: refused naming the pitfall, not rendered as a folder named
    false; `OFF` is refused (a folder named OFF is never what was meant)."""
    for value, words in (
        (False, "the boolean false (off, on, no and yes are booleans there): quote it"),
        ("OFF", "write off in lower case"),
    ):
        proc = template_values({"trainer": {"data": {"cache": value}, "args": []}})
        assert proc.returncode != 0 and "trainer.data.cache" in proc.stderr and words in proc.stderr, proc.stderr
