"""The data check before training (data/images/check.py): every kind of bad file is found, listed in one
line with the count, dropped exactly with --skip-bad-images, and the check-data command's exit codes."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from maskrcnn_dist.data import open_data, prepare, write_train_val
from maskrcnn_dist.data.images.check import MAX_LISTED, CheckRules, ImageEntry, bad_images_error, check_images
from maskrcnn_dist.errors import DatasetError

from ..conftest import fast_config

# image id -> the reason's words, for the files `broken_coco` spoils (ids are 1-based, file 00000k.png)
BROKEN = {
    2: "cannot read image",  # not an image at all
    3: "truncated",  # a PNG cut in half
    5: "truncated",  # a JPEG cut in half (under the .png name: PIL reads the content)
    6: "image is 10x10 but the annotation file says",
    8: "file not found",
}


def _path(root: Path, image_id: int) -> Path:
    return root / "train" / "images" / f"{image_id:06d}.png"


@pytest.fixture
def broken_coco(tmp_path: Path) -> Path:
    """10 train and 4 val images; train images 2, 3, 5, 6 and 8 spoiled as BROKEN says."""
    root = tmp_path / "coco"
    write_train_val(root, num_train=10, num_val=4, seed=1, image_size=(48, 64), max_objects=2)
    _path(root, 2).write_bytes(b"this is not an image\n")
    png = _path(root, 3).read_bytes()
    _path(root, 3).write_bytes(png[: len(png) // 2])
    jpeg = io.BytesIO()
    Image.open(_path(root, 5)).convert("RGB").save(jpeg, "JPEG")
    _path(root, 5).write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    Image.new("RGB", (10, 10)).save(_path(root, 6))
    _path(root, 8).unlink()
    return root


def check_data(cfg) -> tuple:
    """The run's datasets, checked and built whole as training builds them (data/prepare.py)."""
    with open_data(cfg, None) as opened:
        return opened.build()


def _entries(root: Path) -> list[ImageEntry]:
    data = json.loads((root / "train" / "annotations.json").read_text())
    return [ImageEntry(i["id"], _path(root, i["id"]), i["width"], i["height"]) for i in data["images"]]


@pytest.mark.parametrize("mode", ["header", "full"])
def test_every_kind_of_bad_file_is_found_with_its_reason(broken_coco: Path, mode: str) -> None:
    report = check_images(_entries(broken_coco), CheckRules(mode), source="train")
    assert report.checked == 10
    assert [b.image_id for b in report.bad] == sorted(BROKEN)
    for bad in report.bad:
        assert BROKEN[bad.image_id] in bad.reason, bad
        assert bad.path == _path(broken_coco, bad.image_id)


def test_off_mode_finds_only_missing_files(broken_coco: Path) -> None:
    report = check_images(_entries(broken_coco), CheckRules("off"))
    assert [(b.image_id, b.reason) for b in report.bad] == [(8, "file not found")]


def test_the_process_pool_finds_the_same_files(broken_coco: Path) -> None:
    # Enough entries for the pool (the same files under many ids), checked by 2 processes.
    entries = _entries(broken_coco)
    many = [replace(e, image_id=e.image_id + 100 * k) for k in range(80) for e in entries]
    report = check_images(many, CheckRules("header"), processes=2)
    assert report.checked == 800
    assert [b.image_id for b in report.bad] == [i + 100 * k for k in range(80) for i in sorted(BROKEN)]


def test_the_error_is_one_line_with_the_first_files_and_the_count(broken_coco: Path) -> None:
    report = check_images(_entries(broken_coco), CheckRules("header"), source="train/annotations.json")
    message = str(bad_images_error([report]))
    assert "\n" not in message
    assert "train/annotations.json: 5 of 10 images are bad" in message
    for image_id in sorted(BROKEN)[:MAX_LISTED]:
        assert f"{_path(broken_coco, image_id)} (image id {image_id})" in message
    assert "--skip-bad-images" in message


def test_more_bad_files_than_listed_are_counted(tmp_path: Path) -> None:
    entries = [ImageEntry(i, tmp_path / f"{i}.png", 8, 8) for i in range(1, 13)]
    message = str(bad_images_error([check_images(entries, CheckRules("header"), source="x.json")]))
    assert "x.json: 12 of 12 images are bad" in message and "and 7 more" in message
    assert message.count("file not found") == MAX_LISTED


def test_training_stops_before_the_engine_with_the_list(broken_coco: Path, tmp_path: Path) -> None:
    cfg = fast_config(broken_coco, tmp_path / "run")
    with pytest.raises(DatasetError, match=r"annotations.json: 5 of 10 images are bad"):
        check_data(cfg)


def test_skip_bad_images_drops_exactly_those(broken_coco: Path, tmp_path: Path, caplog) -> None:
    cfg = fast_config(broken_coco, tmp_path / "run", **{"skip-bad-images": True})
    train_set, val_set = check_data(cfg)
    assert train_set.image_ids == [i for i in range(1, 11) if i not in BROKEN]
    assert len(train_set) == 5 and val_set is not None and len(val_set) == 4
    for index in range(len(train_set)):
        train_set[index]  # every image left loads
    warnings = [r for r in caplog.records if "--skip-bad-images" in r.getMessage()]
    assert len(warnings) == 1 and "5 of 10" in warnings[0].getMessage()


def test_evaluation_checks_only_the_val_split(broken_coco: Path, tmp_path: Path) -> None:
    cfg = replace(fast_config(broken_coco, tmp_path / "run"), test_only=True)
    train_set, _ = check_data(cfg)  # the broken train split is not read by evaluation
    assert len(train_set) == 10


def test_check_data_off_still_refuses_missing_files(broken_coco: Path, tmp_path: Path) -> None:
    cfg = fast_config(broken_coco, tmp_path / "run", **{"check-data": "off"})
    with pytest.raises(DatasetError, match=r"1 of 10 images are bad: .*000008.png \(image id 8\): file not found"):
        check_data(cfg)


def test_synthetic_data_is_not_checked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(prepare, "check_datasets", lambda *a, **k: pytest.fail("checked a generated set"))
    cfg = fast_config(None, tmp_path / "run", **{"synthetic-images": 4, "synthetic-image-size": 64})
    check_data(cfg)


def _check_data_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "maskrcnn_dist.cli", "check-data", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_check_data_command_exit_codes(broken_coco: Path, tmp_path: Path) -> None:
    good = _check_data_cli("--data-path", str(broken_coco), "--split", "val")
    assert good.returncode == 0, good.stderr
    assert "4 images checked (header), 0 bad" in good.stdout and "images/s" in good.stdout
    bad = _check_data_cli("--data-path", str(broken_coco), "--check-data", "full")
    assert bad.returncode == 2
    assert [line for line in bad.stdout.splitlines() if line.startswith("bad: ")] == [
        line for line in bad.stdout.splitlines() if "(image id" in line
    ]
    assert bad.stdout.count("bad: ") == 5 and "10 images checked (full), 5 bad" in bad.stdout
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "5 of 10 images are bad" in errors[0]
    assert "Traceback" not in bad.stderr
    missing = _check_data_cli("--data-path", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere: no such folder" in missing.stderr


@pytest.mark.slow
def test_check_data_prints_each_summary_once(broken_coco: Path) -> None:
    """The summary was printed and also logged: every split's line showed twice on a terminal."""
    run = _check_data_cli("--data-path", str(broken_coco), "--split", "val")
    assert run.returncode == 0, run.stderr
    assert (run.stdout + run.stderr).count("4 images checked (header)") == 1


@pytest.mark.slow
def test_check_data_judges_a_set_without_val_as_training_does(broken_coco: Path, tmp_path: Path) -> None:
    """Training runs without a val split (no AP): checking both splits of such a set passes with a
    warning; asking for the val split alone still names what is missing."""
    train_only = tmp_path / "train-only"
    shutil.copytree(broken_coco / "val", train_only / "train")  # the good split, as the only one
    both = _check_data_cli("--data-path", str(train_only))
    assert both.returncode == 0, both.stderr
    assert (
        "no val split (" in both.stderr
        and "--val-fraction F carves one" in both.stderr
        and "4 images checked" in both.stdout
    )
    val = _check_data_cli("--data-path", str(train_only), "--split", "val")
    assert val.returncode == 2 and "no val split found" in val.stderr


def test_pipeline_master_checks_before_joining_rpc(broken_coco: Path, tmp_path: Path, monkeypatch) -> None:
    import maskrcnn_dist.engines.pipeline as pipeline
    from maskrcnn_dist.train import train

    from ..engines.pipeline.pipeline_procs import make_plans

    monkeypatch.setattr(pipeline, "master_session", lambda *a: pytest.fail("joined RPC before checking the data"))
    master, _ = make_plans(29500)
    cfg = fast_config(broken_coco, tmp_path / "run", engine="pipeline")
    with pytest.raises(DatasetError, match="5 of 10 images are bad"):
        train(cfg, master)
